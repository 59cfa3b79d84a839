//go:build kubernetes_e2e && kubernetes_bench

package e2e

import (
	"os/exec"
	"testing"
)

// TestBenchPods is `make bench-kubernetes`, not part of the e2e test: a
// Kubernetes-backed server (PostgreSQL store, a warm Pod on each node)
// measured by `sheepfold bench --url`, with this host's own engine as the
// same run's baseline (--local-baseline: its pool hit, ×local), and the
// warm 1+1 round trip to a Pod. It prints the bench's table; it asserts
// nothing about speed.
func TestBenchPods(t *testing.T) {
	bin := env(t, "SHEEPFOLD_E2E_BIN")
	srv, cs, ns := startAlone(t, "--pool", "1")
	// The pool's Pods running before the bench starts (it waits for a
	// full pool before each hit as well).
	waitPool(t, cs, ns, 2)
	cmd := exec.Command(bin, "bench", "--url", srv.url, "--api-key", srv.key, "--local-baseline",
		"--only", "pool hit,warm 1+1", "-n", "20", "--warm", "200")
	out, err := cmd.CombinedOutput()
	t.Logf("sheepfold bench --url (Kubernetes-backed) --local-baseline:\n%s", out)
	if err != nil {
		t.Fatalf("bench: %v", err)
	}
}
