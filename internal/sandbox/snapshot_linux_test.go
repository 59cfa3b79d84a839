package sandbox_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/sheepfold/sheepfold/internal/apierr"
	"github.com/sheepfold/sheepfold/internal/egress"
	"github.com/sheepfold/sheepfold/internal/sandbox"
	"github.com/sheepfold/sheepfold/internal/testutil"
)

// TestSnapshotRefusesNetwork: a sandbox with a network (its egress
// gateway is a host object a copy could not be reattached to) is not
// snapshotted (ERR_NOT_SUPPORTED), leaves no snapshot and runs on; no
// sandbox with a network starts from a snapshot either. The control: a
// sandbox without one, on the same engine, is snapshotted and started
// from.
func TestSnapshotRefusesNetwork(t *testing.T) {
	testutil.SkipUnderGVisor(t, "no network nor snapshot under gVisor (TestGVisorSandbox)")
	ctx := context.Background()
	m, _ := networkEngine(t, &egress.TestNet{})
	dir := testutil.ShortTempDir(t)
	netted := newSandbox(t, m, sandbox.CreateOptions{Policy: allowlist("api.test")})
	run(t, netted, "python", "x = 1")
	if err := netted.Snapshot(ctx, filepath.Join(dir, "netted")); apierr.CodeOf(err) != apierr.NotSupported {
		t.Fatalf("snapshot of a sandbox with a network: %v, want ERR_NOT_SUPPORTED", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "netted")); err == nil {
		t.Error("a refused snapshot left its directory")
	}
	if got := mainText(run(t, netted, "python", "x")); got != "1" {
		t.Errorf("after the refused snapshot x is %q", got)
	}

	plain := newSandbox(t, m, sandbox.CreateOptions{})
	run(t, plain, "python", "y = 2")
	snap := filepath.Join(dir, "plain")
	if err := plain.Snapshot(ctx, snap); err != nil {
		t.Fatalf("control: %v", err)
	}
	if _, err := m.Create(ctx, sandbox.CreateOptions{Snapshot: snap, Policy: allowlist("api.test")}); apierr.CodeOf(err) != apierr.NotSupported {
		t.Errorf("a sandbox with a network from a snapshot: %v, want ERR_NOT_SUPPORTED", err)
	}
	from, err := m.Create(ctx, sandbox.CreateOptions{Snapshot: snap})
	if err != nil {
		t.Fatalf("control: %v", err)
	}
	defer m.Kill(ctx, from.ID)
	if got := mainText(run(t, from, "python", "y")); got != "2" {
		t.Errorf("control: from the snapshot y is %q", got)
	}
}
