package sandbox_test

import (
	"context"
	"strings"
	"testing"

	"github.com/sheepfold/sheepfold/internal/agentproto"
	"github.com/sheepfold/sheepfold/internal/sandbox"
)

// TestTypeScript runs typed cells through the host's transpiler and a
// typescript context's Node kernel (the fake runtime runs the real agent).
func TestTypeScript(t *testing.T) {
	t.Parallel()
	m, _ := fakeEngine(t, sandbox.Config{})
	s, err := m.Create(context.Background(), sandbox.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	exec := func(req sandbox.ExecuteRequest) (*sandbox.Execution, []string) {
		t.Helper()
		var events []string
		var results []agentproto.Result
		ex, err := s.Execute(context.Background(), req, func(ev agentproto.Event) error {
			events = append(events, ev.Type)
			if ev.Type == agentproto.EventResult {
				results = append(results, *ev.Result)
			}
			return nil
		})
		if err != nil {
			t.Fatalf("execute %q: %v", req.Code, err)
		}
		if len(ex.Results) != 0 {
			t.Fatalf("a streamed execution kept its results: %+v", ex.Results)
		}
		ex.Results = results
		return ex, events
	}
	main := func(ex *sandbox.Execution) string {
		for _, r := range ex.Results {
			if r.IsMainResult {
				return r.Text
			}
		}
		return ""
	}
	ex, _ := exec(sandbox.ExecuteRequest{Language: "ts", Code: "interface P { x: number }\nfunction sub(a: number, b: number): number {\n  return a - b\n}\nconst p: P = { x: 3 }\nsub(p.x, 4)"})
	if ex.Error != nil || main(ex) != "-1" {
		t.Fatalf("typed cell: %q %+v", main(ex), ex.Error)
	}
	// State persists; top-level await works after transpiling.
	if ex, _ = exec(sandbox.ExecuteRequest{Language: "typescript", Code: "const q = await Promise.resolve<number>(p.x * 2)\nq as number"}); ex.Error != nil || main(ex) != "6" {
		t.Fatalf("await cell: %q %+v", main(ex), ex.Error)
	}
	ex, events := exec(sandbox.ExecuteRequest{Language: "ts", Code: "let x: number = = 1"})
	if ex.Status != sandbox.ExecError || ex.Error == nil || ex.Error.Name != "SyntaxError" || !strings.Contains(ex.Error.Traceback, "<cell>:1:") ||
		strings.Join(events, ",") != agentproto.EventError {
		t.Fatalf("syntax error: %+v %v", ex.Error, events)
	}
	// A context made for TypeScript transpiles its cells too; a JavaScript
	// one does not (type syntax is an error there).
	tc, err := s.CreateContext(context.Background(), agentproto.ContextSpec{Language: "typescript"})
	if err != nil || tc.Language != "typescript" {
		t.Fatalf("typescript context: %+v %v", tc, err)
	}
	if ex, _ = exec(sandbox.ExecuteRequest{ContextID: tc.ID, Code: "const n: number = 41\nn + 1"}); ex.Error != nil || main(ex) != "42" {
		t.Fatalf("typescript context: %q %+v", main(ex), ex.Error)
	}
	if ex, _ = exec(sandbox.ExecuteRequest{Language: "javascript", Code: "const n: number = 41"}); ex.Error == nil || ex.Error.Name != "SyntaxError" {
		t.Fatalf("type syntax in JavaScript: %+v", ex.Error)
	}
}
