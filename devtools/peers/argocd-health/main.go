// Command argocd-health runs Argo CD health checks the way an Argo CD application
// controller runs a customization from its argocd-cm ConfigMap: Argo CD's settings manager
// reads the resource.customizations.* keys, and gitops-engine's health.GetResourceHealth
// runs the script through util/lua's ResourceHealthOverrides, in gopher-lua with the
// libraries Argo CD opens for such a script (useOpenLibs false unless the ConfigMap says
// otherwise). The chart's tests ask it instead of a Lua interpreter of their own, so that
// a script that works here works in Argo CD.
//
// Where the scripts come from (one of):
//
//	--argocd-cm FILE        an argocd-cm ConfigMap, or a merge patch of one (its data:)
//	--customizations ROOT   ROOT/<group>/<Kind>/health.lua, Argo CD's resource_customizations
//	                        layout, each under the argocd-cm key Argo CD reads for that kind
//	                        (resource.customizations.health.<group>_<Kind>)
//
// What is judged (one of):
//
//	--tests ROOT            every case of every ROOT/<group>/<Kind>/health_test.yaml (Argo CD's
//	                        test layout: tests[].inputPath, tests[].healthStatus); one JSON
//	                        document {"argocd": VERSION, "cases": [...], "errors": [...]}
//	(neither)               the objects on stdin (JSON values, each an object or a list of
//	                        objects); one JSON line {"health": {...} or null, "error": "..."}
//	                        per object, in order
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime/debug"
	"sort"
	"strings"

	"github.com/argoproj/argo-cd/gitops-engine/v3/pkg/health"
	log "github.com/sirupsen/logrus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/kubernetes/fake"
	"sigs.k8s.io/yaml"

	"github.com/argoproj/argo-cd/v3/common"
	"github.com/argoproj/argo-cd/v3/util/lua"
	"github.com/argoproj/argo-cd/v3/util/settings"
)

const (
	healthScript = "health.lua"
	healthTests  = "health_test.yaml"
	namespace    = "argocd"
)

// The shape of health_test.yaml, as Argo CD's own test of its bundled checks reads it.
type testFile struct {
	Tests []struct {
		InputPath    string               `json:"inputPath"`
		HealthStatus *health.HealthStatus `json:"healthStatus"`
	} `json:"tests"`
}

type testCase struct {
	Kind      string               `json:"kind"`
	InputPath string               `json:"inputPath"`
	Expected  *health.HealthStatus `json:"expected"`
	Health    *health.HealthStatus `json:"health"`
	Error     string               `json:"error,omitempty"`
}

type assessment struct {
	Health *health.HealthStatus `json:"health"`
	Error  string               `json:"error,omitempty"`
}

// configMapFromFile reads an argocd-cm ConfigMap, or a merge patch holding only its data.
func configMapFromFile(path string) (*corev1.ConfigMap, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	cm := &corev1.ConfigMap{}
	if err := yaml.Unmarshal(raw, cm); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return cm, nil
}

// kindDirs lists ROOT/<group>/<Kind> directories holding `name`, sorted.
func kindDirs(root, name string) ([]string, error) {
	found, err := filepath.Glob(filepath.Join(root, "*", "*", name))
	if err != nil {
		return nil, err
	}
	dirs := make([]string, 0, len(found))
	for _, f := range found {
		dirs = append(dirs, filepath.Dir(f))
	}
	sort.Strings(dirs)
	return dirs, nil
}

// groupKind is "<group>/<Kind>" for ROOT/<group>/<Kind>.
func groupKind(dir string) string {
	return filepath.Base(filepath.Dir(dir)) + "/" + filepath.Base(dir)
}

// configMapFromTree makes the argocd-cm an administrator would write for the health.lua
// files of a resource_customizations tree: one resource.customizations.health key per kind,
// nothing else (so useOpenLibs stays Argo CD's default).
func configMapFromTree(root string) (*corev1.ConfigMap, error) {
	dirs, err := kindDirs(root, healthScript)
	if err != nil {
		return nil, err
	}
	if len(dirs) == 0 {
		return nil, fmt.Errorf("no <group>/<Kind>/%s under %s", healthScript, root)
	}
	cm := &corev1.ConfigMap{Data: map[string]string{}}
	for _, dir := range dirs {
		script, err := os.ReadFile(filepath.Join(dir, healthScript))
		if err != nil {
			return nil, err
		}
		key := "resource.customizations.health." + strings.Replace(groupKind(dir), "/", "_", 1)
		cm.Data[key] = string(script)
	}
	return cm, nil
}

// overrides are the resource overrides Argo CD's settings manager reads from `cm`, served
// by a fake API server the way `argocd admin settings resource-overrides` serves a local
// file: the ConfigMap named and labelled as Argo CD looks for it.
func overrides(ctx context.Context, cm *corev1.ConfigMap) (lua.ResourceHealthOverrides, error) {
	cm.Name = common.ArgoCDConfigMapName
	cm.Namespace = namespace
	if cm.Labels == nil {
		cm.Labels = map[string]string{}
	}
	cm.Labels["app.kubernetes.io/part-of"] = "argocd"
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{
		Name: common.ArgoCDSecretName, Namespace: namespace,
		Labels: map[string]string{"app.kubernetes.io/part-of": "argocd"},
	}}
	manager := settings.NewSettingsManager(ctx, fake.NewClientset(cm, secret), namespace)
	if err := manager.ResyncInformers(); err != nil {
		return nil, err
	}
	read, err := manager.GetResourceOverrides()
	if err != nil {
		return nil, err
	}
	return lua.ResourceHealthOverrides(read), nil
}

// assess is the controller's call: gitops-engine's GetResourceHealth with the overrides.
func assess(obj *unstructured.Unstructured, overrides lua.ResourceHealthOverrides) assessment {
	status, err := health.GetResourceHealth(obj, overrides)
	out := assessment{Health: status}
	if err != nil {
		out.Error = err.Error()
	}
	return out
}

// decode reads an object as the controller holds it: from JSON through unstructured's
// scheme (integers int64), whatever YAML or JSON it was written in.
func decode(raw []byte) (*unstructured.Unstructured, error) {
	asJSON, err := yaml.YAMLToJSON(raw)
	if err != nil {
		return nil, err
	}
	obj := &unstructured.Unstructured{}
	if err := obj.UnmarshalJSON(asJSON); err != nil {
		return nil, err
	}
	return obj, nil
}

func runTests(root string, overrides lua.ResourceHealthOverrides, out io.Writer) error {
	report := struct {
		ArgoCD string     `json:"argocd"`
		Cases  []testCase `json:"cases"`
		Errors []string   `json:"errors"`
	}{ArgoCD: moduleVersion("github.com/argoproj/argo-cd/v3"), Cases: []testCase{}, Errors: []string{}}
	dirs, err := kindDirs(root, healthTests)
	if err != nil {
		return err
	}
	if len(dirs) == 0 {
		report.Errors = append(report.Errors, fmt.Sprintf("no <group>/<Kind>/%s under %s", healthTests, root))
	}
	for _, dir := range dirs {
		raw, err := os.ReadFile(filepath.Join(dir, healthTests))
		var tests testFile
		if err == nil {
			err = yaml.UnmarshalStrict(raw, &tests)
		}
		if err != nil {
			report.Errors = append(report.Errors, fmt.Sprintf("%s: %v", filepath.Join(dir, healthTests), err))
			continue
		}
		for _, test := range tests.Tests {
			c := testCase{Kind: groupKind(dir), InputPath: test.InputPath, Expected: test.HealthStatus}
			raw, err := os.ReadFile(filepath.Join(dir, test.InputPath))
			var obj *unstructured.Unstructured
			if err == nil {
				obj, err = decode(raw)
			}
			if err != nil {
				c.Error = err.Error()
			} else {
				a := assess(obj, overrides)
				c.Health, c.Error = a.Health, a.Error
			}
			report.Cases = append(report.Cases, c)
		}
	}
	encoder := json.NewEncoder(out)
	encoder.SetIndent("", "  ")
	return encoder.Encode(report)
}

// runStdin answers each object as soon as it is read, so that a caller may keep one
// process and ask it object by object (starting one costs the settings manager's
// informer sync, most of a second).
func runStdin(in io.Reader, overrides lua.ResourceHealthOverrides, out *bufio.Writer) error {
	decoder := json.NewDecoder(bufio.NewReader(in))
	encoder := json.NewEncoder(out)
	for {
		var value json.RawMessage
		if err := decoder.Decode(&value); errors.Is(err, io.EOF) {
			return nil
		} else if err != nil {
			return fmt.Errorf("reading stdin: %w", err)
		}
		objects := []json.RawMessage{value}
		if trimmed := bytes.TrimSpace(value); len(trimmed) > 0 && trimmed[0] == '[' {
			objects = nil
			if err := json.Unmarshal(trimmed, &objects); err != nil {
				return fmt.Errorf("reading a list of objects: %w", err)
			}
		}
		for _, raw := range objects {
			a := assessment{}
			if obj, err := decode(raw); err != nil {
				a.Error = "decoding the object: " + err.Error()
			} else {
				a = assess(obj, overrides)
			}
			if err := encoder.Encode(a); err != nil {
				return err
			}
		}
		if err := out.Flush(); err != nil {
			return err
		}
	}
}

// moduleVersion is the version of a module this binary was built with.
func moduleVersion(path string) string {
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, dep := range info.Deps {
			if dep.Path == path {
				return dep.Version
			}
		}
	}
	return "unknown"
}

func main() {
	argocdCM := flag.String("argocd-cm", "", "an argocd-cm ConfigMap (or a merge patch of its data)")
	tree := flag.String("customizations", "", "a tree of <group>/<Kind>/health.lua")
	tests := flag.String("tests", "", "run every <group>/<Kind>/health_test.yaml under this directory")
	flag.Parse()
	if (*argocdCM == "") == (*tree == "") || flag.NArg() != 0 {
		fmt.Fprintln(os.Stderr, "usage: argocd-health (--argocd-cm FILE | --customizations ROOT) [--tests ROOT] [< objects.json]")
		os.Exit(2)
	}
	// The settings manager logs each setting it applies; only the JSON goes to stdout.
	log.SetLevel(log.WarnLevel)
	log.SetOutput(os.Stderr)

	var cm *corev1.ConfigMap
	var err error
	if *argocdCM != "" {
		cm, err = configMapFromFile(*argocdCM)
	} else {
		cm, err = configMapFromTree(*tree)
	}
	var read lua.ResourceHealthOverrides
	if err == nil {
		read, err = overrides(context.Background(), cm)
	}
	if err == nil {
		out := bufio.NewWriter(os.Stdout)
		if *tests != "" {
			err = runTests(*tests, read, out)
		} else {
			err = runStdin(os.Stdin, read, out)
		}
		if flushErr := out.Flush(); err == nil {
			err = flushErr
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "argocd-health:", err)
		os.Exit(2)
	}
}
