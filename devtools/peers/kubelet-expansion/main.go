// Command kubelet-expansion expands $(VAR) in a container's env, command and args exactly
// as the kubelet does (pkg/kubelet/kubelet_pods.go makeEnvironmentVariables and
// pkg/kubelet/container/helpers.go ExpandContainerCommandAndArgs), by the kubelet's own
// expansion package, so the development node shows what a real node would run.
//
// stdin: {"env": [{"name": "A", "value": "x$(B)"} | {"name": "S", "resolved": "secret"}],
//
//	"command": [...], "args": [...]}
//
// An entry with "resolved" stands for a valueFrom variable the caller already resolved:
// the kubelet never expands a resolved value, only records it. stdout: {"env": [{"name",
// "value"}], "command": [...], "args": [...]}, in the order given.
package main

import (
	"encoding/json"
	"fmt"
	"os"

	"k8s.io/kubernetes/third_party/forked/golang/expansion"
)

type inVar struct {
	Name     string  `json:"name"`
	Value    string  `json:"value"`
	Resolved *string `json:"resolved,omitempty"`
}

type outVar struct {
	Name  string `json:"name"`
	Value string `json:"value"`
}

type input struct {
	Env     []inVar  `json:"env"`
	Command []string `json:"command"`
	Args    []string `json:"args"`
}

type output struct {
	Env     []outVar `json:"env"`
	Command []string `json:"command"`
	Args    []string `json:"args"`
}

func main() {
	var in input
	if err := json.NewDecoder(os.Stdin).Decode(&in); err != nil {
		fmt.Fprintf(os.Stderr, "kubelet-expansion: cannot read the input: %v\n", err)
		os.Exit(2)
	}
	// As the kubelet: each variable is expanded against those declared before it (the map
	// grows as the list is walked), an empty value is not expanded, and a resolved source
	// is recorded as it is.
	declared := map[string]string{}
	mapping := expansion.MappingFuncFor(declared)
	out := output{Env: []outVar{}, Command: []string{}, Args: []string{}}
	for _, v := range in.Env {
		value := v.Value
		if v.Resolved != nil {
			value = *v.Resolved
		} else if value != "" {
			value = expansion.Expand(value, mapping)
		}
		declared[v.Name] = value
		out.Env = append(out.Env, outVar{Name: v.Name, Value: value})
	}
	// Command and args see the whole resolved environment, Secrets included.
	final := expansion.MappingFuncFor(declared)
	for _, c := range in.Command {
		out.Command = append(out.Command, expansion.Expand(c, final))
	}
	for _, a := range in.Args {
		out.Args = append(out.Args, expansion.Expand(a, final))
	}
	if err := json.NewEncoder(os.Stdout).Encode(out); err != nil {
		fmt.Fprintf(os.Stderr, "kubelet-expansion: %v\n", err)
		os.Exit(2)
	}
}
