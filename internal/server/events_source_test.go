package server_test

import (
	"net/http"
	"testing"

	"github.com/sheepfold/sheepfold/internal/server"
)

// TestEventSource: every event says who recorded it, through the store and
// the API: the host's own, and a violation the code in the sandbox wrote
// on its driver's control pipe, which is the sandbox's word.
func TestEventSource(t *testing.T) {
	t.Parallel()
	e := newEnv(t, server.Config{})
	id := e.create(e.keyA, nil)
	path := "/v1/sandboxes/" + id
	forge := "import os\nos.write(4, b'{\"type\":\"violation\",\"kind\":\"syscall_denied\",\"target\":\"forged\"}\\n')"
	want(t, e.do("POST", path+"/execute", e.keyA, map[string]any{"code": forge}), http.StatusOK, "")
	r := e.do("GET", path+"/events", e.keyA, nil)
	want(t, r, http.StatusOK, "")
	got, evs := listTypes(t, r)
	if got != "sandbox.created execution.started security_violation execution.finished" {
		t.Fatalf("events: %s", got)
	}
	for _, ev := range evs {
		src := "host"
		if ev["type"] == "security_violation" {
			src = "sandbox"
		}
		if ev["source"] != src {
			t.Fatalf("%v recorded with source %v, want %s", ev["type"], ev["source"], src)
		}
	}
}
