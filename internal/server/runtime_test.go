package server_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/sheepfold/sheepfold/internal/server"
)

// TestRuntimeGVisorNotInstalled: on a server without gVisor, runtime
// "gvisor" is refused with ERR_NOT_SUPPORTED saying it is not installed,
// from the /v1 create and from E2B's metadata sheepfold.runtime alike; an
// unknown runtime is ERR_BAD_REQUEST; the control (no runtime) starts.
func TestRuntimeGVisorNotInstalled(t *testing.T) {
	e := newEnv(t, server.Config{})
	r := e.do("POST", "/v1/sandboxes", e.keyA, map[string]any{"runtime": "gvisor"})
	want(t, r, http.StatusNotImplemented, "ERR_NOT_SUPPORTED")
	if !strings.Contains(string(r.body), "not installed") {
		t.Fatalf("message: %s", r.body)
	}
	want(t, e.do("POST", "/v1/sandboxes", e.keyA, map[string]any{"runtime": "kata"}), http.StatusBadRequest, "ERR_BAD_REQUEST")
	r = e.e2bDo("POST", "/v2/sandboxes", e.keyA, map[string]any{"templateID": "base", "metadata": map[string]string{"sheepfold.runtime": "gvisor"}})
	if r.status != http.StatusNotImplemented || !strings.Contains(string(r.body), "not installed") {
		t.Fatalf("E2B create with sheepfold.runtime gvisor: %d %s", r.status, r.body)
	}
	e.e2bCreate(e.keyA, map[string]any{"templateID": "base", "metadata": map[string]string{"other": "x"}})
}
