package server_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestImportArrows guards the layering: the transport and persistence
// packages never reach a runtime implementation, the agent or the CLI,
// and the store interface stays free of drivers.
func TestImportArrows(t *testing.T) {
	t.Parallel()
	const mod = "github.com/sheepfold/sheepfold/"
	forbidden := map[string][]string{
		mod + "internal/server": {mod + "internal/runtime/oci", mod + "internal/runtime/fake", mod + "internal/agent",
			mod + "internal/store/sqlite", mod + "cmd"},
		mod + "internal/store": {"modernc.org", mod + "internal"},
		mod + "internal/auth":  {mod + "internal/sandbox", mod + "internal/server", mod + "internal/store/sqlite"},
		// The agent starts twice in every sandbox: it stays small (esbuild,
		// for TypeScript, is the host's).
		mod + "cmd/sheepfold-agent": {"github.com/evanw/esbuild", mod + "internal/sandbox", mod + "internal/server",
			mod + "internal/runtime", "connectrpc.com", "modernc.org"},
		// Accounts and metering know the engine's interface, never a
		// runtime implementation, the transport or the database driver.
		mod + "internal/account":  {mod + "internal/sandbox", mod + "internal/server", mod + "internal/store/sqlite", mod + "internal/runtime"},
		mod + "internal/metering": {mod + "internal/server", mod + "internal/store/sqlite", mod + "internal/runtime/oci", mod + "internal/runtime/fake"},
		mod + "internal/e2b": {mod + "internal/server", mod + "internal/store", mod + "internal/auth", mod + "internal/runtime/oci",
			mod + "internal/runtime/fake", mod + "internal/agent", mod + "internal/kernel", mod + "cmd"},
		// The engine speaks to the agent through agentproto alone; the
		// language table (internal/lang) is shared, the kernels are the
		// agent's.
		mod + "internal/sandbox": {mod + "internal/agent", mod + "internal/kernel", mod + "internal/server", mod + "cmd"},
	}
	for pkg, bad := range forbidden {
		out, err := exec.Command("go", "list", "-deps", pkg).CombinedOutput()
		if err != nil {
			t.Fatalf("go list %s: %v\n%s", pkg, err, out)
		}
		deps := strings.Fields(string(out))
		if len(deps) < 2 {
			t.Fatalf("go list %s listed nothing", pkg)
		}
		for _, d := range deps {
			if d == pkg {
				continue
			}
			for _, b := range bad {
				if d == b || strings.HasPrefix(d, b+"/") {
					t.Errorf("%s depends on %s", pkg, d)
				}
			}
		}
	}
}
