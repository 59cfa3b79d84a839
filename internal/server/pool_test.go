package server_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/sandbox"
	"github.com/sheepfold/sheepfold/internal/server"
)

// TestPoolReported checks that a create says whether the warm pool served
// it (Sheepfold-Pool) and that /v1/version counts hits and misses.
func TestPoolReported(t *testing.T) {
	t.Parallel()
	e := newEnv(t, server.Config{}, func(c *sandbox.Config) {
		c.PoolSize = 1
		c.PoolPreload = []string{"fractions"}
	})
	pool := func() map[string]any {
		t.Helper()
		p, ok := e.do("GET", "/v1/version", e.keyA, nil).json(t)["pool"].(map[string]any)
		if !ok {
			t.Fatal("/v1/version has no pool")
		}
		return p
	}
	for deadline := time.Now().Add(20 * time.Second); pool()["ready"] != 1.0; {
		if time.Now().After(deadline) {
			t.Fatalf("the pool did not fill: %v", pool())
		}
		time.Sleep(10 * time.Millisecond)
	}
	r := e.do("POST", "/v1/sandboxes", e.keyA, map[string]any{})
	want(t, r, http.StatusCreated, "")
	if got := r.header.Get("Sheepfold-Pool"); got != "hit" {
		t.Fatalf("Sheepfold-Pool %q after a create from a full pool", got)
	}
	r = e.do("POST", "/v1/sandboxes", e.keyA, map[string]any{"env": map[string]string{"A": "b"}})
	want(t, r, http.StatusCreated, "")
	if got := r.header.Get("Sheepfold-Pool"); got != "miss" {
		t.Fatalf("Sheepfold-Pool %q after a create with env vars", got)
	}
	if p := pool(); p["size"] != 1.0 || p["hits"] != 1.0 || p["misses"] != 1.0 {
		t.Fatalf("pool %v", p)
	}
}
