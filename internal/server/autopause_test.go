package server_test

import (
	"net/http"
	"testing"

	"github.com/sheepfold/sheepfold/internal/server"
)

// TestAutoPauseNotSupported: a server that cannot pause (the fake runtime
// keeps no checkpoints) refuses auto_pause at create, through /v1
// (ERR_NOT_SUPPORTED) and E2B (its autoPause), rather than kill later what
// was promised a pause; without it the create succeeds.
func TestAutoPauseNotSupported(t *testing.T) {
	e := newEnv(t, server.Config{})
	want(t, e.do("POST", "/v1/sandboxes", e.keyA, map[string]any{"auto_pause": true}), http.StatusNotImplemented, "ERR_NOT_SUPPORTED")
	if r := e.e2bDo("POST", "/v2/sandboxes", e.keyA, map[string]any{"templateID": "base", "autoPause": true}); r.status < 400 {
		t.Errorf("E2B autoPause on a server that cannot pause: %d %s", r.status, r.body)
	}
	e.create(e.keyA, map[string]any{"auto_pause": false})
}
