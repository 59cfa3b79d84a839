package server_test

import (
	"strings"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/llm"
	"github.com/sheepfold/sheepfold/internal/llm/llmtest"
	"github.com/sheepfold/sheepfold/internal/server"
)

func (e *env) session(key string, body map[string]any) string {
	e.t.Helper()
	r := e.do("POST", "/v1/sessions", key, body)
	want(e.t, r, 201, "")
	m := r.json(e.t)
	if m["id"] != m["sandbox_id"] || m["model"] != body["model"] || m["state"] != "running" {
		e.t.Fatalf("session %s", r.body)
	}
	return m["id"].(string)
}

func TestSessionLifecycle(t *testing.T) {
	e, _ := newModelEnv(t, 0, false, server.Config{})
	want(t, e.do("POST", "/v1/sessions", e.keyA, map[string]any{"model": "nope"}), 404, "ERR_MODEL_NOT_FOUND")
	want(t, e.do("POST", "/v1/sessions", e.keyA, map[string]any{}), 400, "ERR_BAD_REQUEST")
	want(t, e.do("POST", "/v1/sessions", e.keyA, map[string]any{"model": "small", "sandbox_config": map[string]any{"no_such": 1}}), 400, "ERR_INVALID_POLICY")

	id := e.session(e.keyA, map[string]any{"model": "small", "sandbox_config": map[string]any{"max_memory_mb": 256}})
	r := e.do("GET", "/v1/sessions/"+id, e.keyA, nil)
	want(t, r, 200, "")
	if m := r.json(t); m["resources"].(map[string]any)["memory_mb"] != 256.0 {
		t.Fatalf("session %s", r.body)
	}
	want(t, e.do("GET", "/v1/sessions/"+id, e.keyB, nil), 404, "ERR_SESSION_NOT_FOUND")
	want(t, e.do("POST", "/v1/sessions/"+id+"/execute", e.keyB, map[string]any{"code": "1"}), 404, "ERR_SESSION_NOT_FOUND")
	// The session is its sandbox: the sandbox routes take its id.
	want(t, e.do("GET", "/v1/sandboxes/"+id, e.keyA, nil), 200, "")

	want(t, e.do("DELETE", "/v1/sessions/"+id, e.keyB, nil), 404, "ERR_SESSION_NOT_FOUND")
	want(t, e.do("DELETE", "/v1/sessions/"+id, e.keyA, nil), 204, "")
	want(t, e.do("DELETE", "/v1/sessions/"+id, e.keyA, nil), 204, "")
	r = e.do("GET", "/v1/sessions/"+id, e.keyA, nil)
	want(t, r, 200, "")
	if r.json(t)["state"] != "stopped" {
		t.Fatalf("deleted session %s", r.body)
	}
	want(t, e.do("POST", "/v1/sessions/"+id+"/execute", e.keyA, map[string]any{"code": "1"}), 409, "ERR_SANDBOX_STATE")
}

func TestSessionExecute(t *testing.T) {
	e, _ := newModelEnv(t, 0, false, server.Config{})
	id := e.session(e.keyA, map[string]any{"model": "small",
		"sandbox_config": map[string]any{"allowed_modules": []string{"time", "json", "socket"}, "network_restricted": true}})
	exec := func(body map[string]any) map[string]any {
		t.Helper()
		r := e.do("POST", "/v1/sessions/"+id+"/execute", e.keyA, body)
		want(t, r, 200, "")
		return r.json(t)
	}
	ok := exec(map[string]any{"code": "print('hi')\n6*7", "language": "python"})
	if ok["output"] != "hi\n" || ok["status"] != "success" || ok["error"] != nil || ok["execution_time_ms"].(float64) <= 0 {
		t.Fatalf("success %v", ok)
	}
	for _, c := range []struct {
		name, code, status, errCode, msg string
		timeoutMS                        int
	}{
		{"timeout", "import time\ntime.sleep(10)", "timeout", "ERR_SANDBOX_TIMEOUT", "Sandbox execution timeout after 300ms", 300},
		{"module", "import os", "error", "ERR_MODULE_BLOCKED", "Module 'os' is blocked by security policy", 0},
		{"network", "import socket\nsocket.create_connection(('203.0.113.1', 80), timeout=2)", "error", "ERR_NETWORK_RESTRICTED",
			"Network access is restricted in sandbox mode", 0},
		{"exception", "1/0", "error", "", "division by zero", 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			body := map[string]any{"code": c.code}
			if c.timeoutMS > 0 {
				body["timeout_ms"] = c.timeoutMS
			}
			got := exec(body)
			errObj, _ := got["error"].(map[string]any)
			if got["status"] != c.status || errObj == nil || errObj["message"] != c.msg || (errObj["code"] != nil && errObj["code"] != c.errCode) ||
				(c.errCode != "" && errObj["code"] != c.errCode) {
				t.Fatalf("got %v", got)
			}
		})
	}
	// Still usable after all that.
	if got := exec(map[string]any{"code": "print(2+2)"}); got["output"] != "4\n" {
		t.Fatalf("after errors: %v", got)
	}
}

func TestSessionAskToolCalls(t *testing.T) {
	e, prov := newModelEnv(t, 0, false, server.Config{})
	id := e.session(e.keyA, map[string]any{"model": "small"})
	prov.Push(llmtest.RunCode("import csv\nrows = list(csv.reader(open('orders.csv')))\nprint(len(rows) - 1)"),
		llmtest.Reply{Content: "There are 2 orders.", Usage: &llm.Usage{PromptTokens: 1000, CompletionTokens: 10}})
	r := e.do("POST", "/v1/sessions/"+id+"/ask", e.keyA, map[string]any{"prompt": "How many orders?",
		"files": []map[string]any{{"path": "orders.csv", "content": "id,total\n1,10\n2,20\n"}}})
	want(t, r, 200, "")
	a := r.json(t)
	exs := a["executions"].([]any)
	if a["text"] != "There are 2 orders." || a["stop_reason"] != "answered" || a["steps"] != 2.0 || len(exs) != 1 ||
		exs[0].(map[string]any)["output"] != "2\n" {
		t.Fatalf("answer %s", r.body)
	}
	if tok := a["tokens"].(map[string]any); tok["total_tokens"].(float64) < 1010 || a["cost_micros"].(float64) < 100 {
		t.Fatalf("tokens %v cost %v", tok, a["cost_micros"])
	}
	if a["model_time_ms"].(float64) <= 0 || a["sheepfold_time_ms"].(float64) <= 0 ||
		a["time_ms"].(float64) < a["model_time_ms"].(float64) {
		t.Fatalf("times %v %v %v", a["time_ms"], a["model_time_ms"], a["sheepfold_time_ms"])
	}
	// The model saw the tool, then the tool's output.
	reqs := prov.Requests()
	if len(reqs[0].Chat.Tools) != 1 || reqs[0].Chat.Tools[0].Function.Name != "run_code" {
		t.Fatalf("tools %+v", reqs[0].Chat.Tools)
	}
	last := reqs[1].Chat.Messages[len(reqs[1].Chat.Messages)-1]
	if last.Role != "tool" || last.Content != "2\n" || last.ToolCallID == "" {
		t.Fatalf("the model got %+v", last)
	}
	// The session's tokens are the account's.
	if u := e.do("GET", "/v1/account/usage", e.keyA, nil).json(t); u["tokens_used"] != a["tokens"].(map[string]any)["total_tokens"] {
		t.Fatalf("usage %v vs answer %v", u["tokens_used"], a["tokens"])
	}
}

func TestSessionAskFenced(t *testing.T) {
	e, prov := newModelEnv(t, 0, false, server.Config{})
	id := e.session(e.keyA, map[string]any{"model": "small"})
	prov.Push(llmtest.Fenced("python", "x = 21\nprint(x * 2)"), llmtest.Text("The answer is 42."))
	r := e.do("POST", "/v1/sessions/"+id+"/ask", e.keyA, map[string]any{"prompt": "compute"})
	want(t, r, 200, "")
	a := r.json(t)
	exs := a["executions"].([]any)
	if a["text"] != "The answer is 42." || len(exs) != 1 || exs[0].(map[string]any)["output"] != "42\n" || exs[0].(map[string]any)["code"] != "x = 21\nprint(x * 2)\n" {
		t.Fatalf("answer %s", r.body)
	}
	if msg := prov.Requests()[1].LastUser(); !strings.Contains(msg, "42") {
		t.Fatalf("the model did not see the output: %q", msg)
	}

	// Step limit: a model that only ever writes code stops at max_steps.
	for range 3 {
		prov.Push(llmtest.Fenced("python", "print(1)"))
	}
	r = e.do("POST", "/v1/sessions/"+id+"/ask", e.keyA, map[string]any{"prompt": "loop", "max_steps": 3})
	want(t, r, 200, "")
	if a := r.json(t); a["stop_reason"] != "max_steps" || a["steps"] != 3.0 || len(a["executions"].([]any)) != 3 {
		t.Fatalf("answer %s", r.body)
	}
}

func TestSessionAskStreamAndFailures(t *testing.T) {
	e, prov := newModelEnv(t, 0, false, server.Config{})
	id := e.session(e.keyA, map[string]any{"model": "big"})
	prov.Push(llmtest.RunCode("print('step one')"), llmtest.Text("done"))
	r := e.do("POST", "/v1/sessions/"+id+"/ask", e.keyA, map[string]any{"prompt": "go"}, "Accept", "text/event-stream")
	want(t, r, 200, "")
	evs := readSSE(t, r.body)
	var names []string
	for _, ev := range evs {
		names = append(names, ev.name)
	}
	if strings.Join(names, ",") != "step,step,step,done" {
		t.Fatalf("events %v\n%s", names, r.body)
	}
	if !strings.Contains(string(r.body), "step one") {
		t.Fatalf("stream %s", r.body)
	}

	// A hanging model: a clear error within the provider's timeout (2 s),
	// and the session stays usable.
	prov.Push(llmtest.Reply{Hang: true})
	start := time.Now()
	want(t, e.do("POST", "/v1/sessions/"+id+"/ask", e.keyA, map[string]any{"prompt": "go"}), 504, "ERR_PROVIDER_TIMEOUT")
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("took %s", d)
	}
	prov.Push(llmtest.Reply{Garbage: true})
	want(t, e.do("POST", "/v1/sessions/"+id+"/ask", e.keyA, map[string]any{"prompt": "go"}), 502, "ERR_PROVIDER")
	// An answer whose connection breaks mid-body.
	prov.Push(llmtest.Reply{Content: "an answer cut short", DropAfter: 30})
	wantMsg(t, e.do("POST", "/v1/sessions/"+id+"/ask", e.keyA, map[string]any{"prompt": "go"}), 502, "ERR_PROVIDER",
		`the connection to provider "dear" broke`)
	// A failure after an execution: the step's output is kept in the
	// sandbox, the session answers the next ask.
	prov.Push(llmtest.RunCode("survivor = 41"), llmtest.Reply{Hang: true})
	want(t, e.do("POST", "/v1/sessions/"+id+"/ask", e.keyA, map[string]any{"prompt": "go"}), 504, "ERR_PROVIDER_TIMEOUT")
	prov.Push(llmtest.RunCode("print(survivor + 1)"), llmtest.Text("42"))
	r = e.do("POST", "/v1/sessions/"+id+"/ask", e.keyA, map[string]any{"prompt": "go"})
	want(t, r, 200, "")
	if a := r.json(t); a["text"] != "42" || !strings.Contains(string(r.body), `42\n`) {
		t.Fatalf("after a failure mid-ask: %s", r.body)
	}
	prov.Push(llmtest.Text("fine"))
	r = e.do("POST", "/v1/sessions/"+id+"/ask", e.keyA, map[string]any{"prompt": "go"})
	want(t, r, 200, "")
	if r.json(t)["text"] != "fine" {
		t.Fatalf("after failures: %s", r.body)
	}
	// The ask's own time limit ends the loop with what it has.
	prov.Push(llmtest.RunCode("import time\ntime.sleep(5)"))
	r = e.do("POST", "/v1/sessions/"+id+"/ask", e.keyA, map[string]any{"prompt": "slow", "timeout_ms": 500})
	want(t, r, 200, "")
	if a := r.json(t); a["stop_reason"] != "time_limit" {
		t.Fatalf("answer %s", r.body)
	}
	want(t, e.do("POST", "/v1/sessions/"+id+"/ask", e.keyA, map[string]any{"prompt": ""}), 400, "ERR_BAD_REQUEST")
}

func TestSessionAskQuota(t *testing.T) {
	e, prov := newModelEnv(t, 50, false, server.Config{})
	id := e.session(e.keyA, map[string]any{"model": "big"})
	prov.Push(llmtest.Reply{Content: "x", Usage: &llm.Usage{PromptTokens: 60}})
	want(t, e.do("POST", "/v1/sessions/"+id+"/ask", e.keyA, map[string]any{"prompt": "go"}), 200, "")
	r := e.do("POST", "/v1/sessions/"+id+"/ask", e.keyA, map[string]any{"prompt": "go"})
	wantMsg(t, r, 429, "ERR_SESSION_QUOTA_EXCEEDED", "Monthly quota exceeded for model big")
}
