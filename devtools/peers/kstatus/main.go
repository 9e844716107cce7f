// Command kstatus prints what sigs.k8s.io/cli-utils/pkg/kstatus/status says of Kubernetes
// objects: status.Compute, the verdict Flux's health checks and cli-utils' own waiters act
// on. The tests ask it instead of reading the rules themselves, so that they agree with
// cli-utils and not with our reading of it.
//
// Input on stdin: JSON values, each an object or a list of objects (one per line, or an
// array, or both). Output: one JSON line per object, in order,
//
//	{"status": "InProgress", "message": "...", "conditions": [{"type", "status", "reason", "message"}]}
//
// or {"error": "..."} where Compute (or decoding the object) returns an error.
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"
)

type condition struct {
	Type    string `json:"type"`
	Status  string `json:"status"`
	Reason  string `json:"reason"`
	Message string `json:"message"`
}

type verdict struct {
	Status     string      `json:"status,omitempty"`
	Message    string      `json:"message,omitempty"`
	Conditions []condition `json:"conditions,omitempty"`
	Error      string      `json:"error,omitempty"`
}

// judge decodes one object as a client of the API server does (unstructured's JSON
// scheme: integers as int64, other numbers as float64, which Compute tells apart) and
// computes its status.
func judge(raw json.RawMessage) verdict {
	u := &unstructured.Unstructured{}
	if err := u.UnmarshalJSON(raw); err != nil {
		return verdict{Error: "decoding the object: " + err.Error()}
	}
	result, err := status.Compute(u)
	if err != nil {
		return verdict{Error: err.Error()}
	}
	out := verdict{Status: result.Status.String(), Message: result.Message,
		Conditions: []condition{}}
	for _, c := range result.Conditions {
		out.Conditions = append(out.Conditions, condition{
			Type: c.Type.String(), Status: string(c.Status), Reason: c.Reason, Message: c.Message})
	}
	return out
}

func run(in io.Reader, out io.Writer) error {
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
		for _, object := range objects {
			if err := encoder.Encode(judge(object)); err != nil {
				return err
			}
		}
	}
}

func main() {
	out := bufio.NewWriter(os.Stdout)
	err := run(os.Stdin, out)
	if flushErr := out.Flush(); err == nil {
		err = flushErr
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "kstatus:", err)
		os.Exit(2)
	}
}
