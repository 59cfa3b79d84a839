// Package testutil holds helpers shared by tests: root gating, a log
// buffer goroutines share (Buffer), files laid out for a test (WriteTree),
// a value awaited on a channel (Receive), a port that only accepts and
// closes (ClosingListener), the agent built once per source
// (AgentBin, agentbin.go), and finding the runtime and templates that
// privileged tests need. As root (as in CI) a
// missing runtime or template fails the test; it never skips silently.
package testutil

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// RequireRoot skips t unless it runs as root.
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (CI runs these as root)")
	}
}

// DataDir is where privileged tests find the runtime and the templates
// that `make setup` and `make template` put there.
func DataDir() string {
	if d := os.Getenv("SHEEPFOLD_DATA_DIR"); d != "" {
		return d
	}
	return "/var/lib/sheepfold"
}

// Runc returns the pinned runc that `make setup` builds, failing t if it
// is missing.
func Runc(t testing.TB) string {
	t.Helper()
	p := os.Getenv("SHEEPFOLD_RUNTIME")
	if p == "" {
		p = filepath.Join(DataDir(), "bin", "runc")
	}
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("runtime %s missing: run `make setup` (%v)", p, err)
	}
	return p
}

// Runsc returns gVisor's runsc that `make setup` builds (SHEEPFOLD_RUNSC
// overrides), failing t if it is missing; in the cgroup v2 guest
// (InGuest), which has none, t is skipped instead.
func Runsc(t testing.TB) string {
	t.Helper()
	p := os.Getenv("SHEEPFOLD_RUNSC")
	if p == "" {
		p = filepath.Join(DataDir(), "bin", "runsc")
	}
	if _, err := os.Stat(p); err != nil {
		if InGuest() {
			t.Skipf("the cgroup v2 guest has no gVisor: the host's CI runs it (make test-gvisor)")
		}
		t.Fatalf("gVisor's runsc %s missing: run `make setup` (%v)", p, err)
	}
	return p
}

// InGuest says whether the tests run in the cgroup v2 guest
// (test/cgroupv2: compiled test binaries, no source tree, no gVisor).
func InGuest() bool { return os.Getenv("SHEEPFOLD_TEST_GUEST") == "1" }

// GVisor says whether the engine's suites run their sandboxes under
// gVisor (SHEEPFOLD_TEST_RUNTIME=gvisor) rather than runc.
func GVisor() bool { return os.Getenv("SHEEPFOLD_TEST_RUNTIME") == "gvisor" }

// SkipUnderGVisor skips t when the suite runs under gVisor, for a test
// of what only runc sandboxes have (the reason says what).
func SkipUnderGVisor(t testing.TB, reason string) {
	t.Helper()
	if GVisor() {
		t.Skip("not under gVisor: " + reason)
	}
}

// TemplateRootFS returns the root filesystem of a built template, failing
// t if it is not built.
func TemplateRootFS(t testing.TB, name string) string {
	t.Helper()
	p := filepath.Join(DataDir(), "templates", name, "rootfs")
	if _, err := os.Stat(filepath.Join(p, "usr", "bin")); err != nil {
		t.Fatalf("template %s not built: run `make template` (%v)", name, err)
	}
	return p
}

// ShortTempDir returns a fresh directory with a short path (unix socket
// paths are limited to 108 bytes) that is removed when t ends.
func ShortTempDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "sf")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// Main runs a package's tests, then cleanups, and exits with the tests'
// code: func TestMain(m *testing.M) { testutil.Main(m, pgtest.StopShared) }.
func Main(m *testing.M, cleanups ...func()) {
	code := m.Run()
	for _, c := range cleanups {
		c()
	}
	os.Exit(code)
}

// WriteTree writes files (a path relative to root: its content) under
// root, making the directories.
func WriteTree(t testing.TB, root string, files map[string]string) {
	t.Helper()
	for name, content := range files {
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// Receive returns the next value sent on ch, and fails t when none comes
// within 10 seconds (what names the value awaited).
func Receive[T any](t testing.TB, ch <-chan T, what string) T {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	select {
	case v := <-ch:
		return v
	case <-ctx.Done():
	}
	t.Fatalf("waited 10 s for %s", what)
	panic("unreachable")
}
