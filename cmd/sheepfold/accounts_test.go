package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/sheepfold/sheepfold/internal/auth"
	"github.com/sheepfold/sheepfold/internal/config"
)

// run runs the CLI with args against a data dir and returns its output.
func runCLI(t *testing.T, dataDir string, args ...string) (string, error) {
	t.Helper()
	cfg := config.Config{DataDir: dataDir}
	root := accountsCmd(&cfg)
	if args[0] == "keys" {
		root = keysCmd(&cfg)
	}
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs(args[1:])
	err := root.ExecuteContext(context.Background())
	return out.String(), err
}

// mustRunCLI is runCLI against dataDir that fails t on an error.
func mustRunCLI(t *testing.T, dataDir string) func(args ...string) string {
	return func(args ...string) string {
		t.Helper()
		out, err := runCLI(t, dataDir, args...)
		if err != nil {
			t.Fatalf("%v: %v\n%s", args, err, out)
		}
		return out
	}
}

func TestAccountsCLI(t *testing.T) {
	dir := t.TempDir() + "/data"
	mustRun := mustRunCLI(t, dir)
	mustRun("accounts", "create", "team", "--max-sandboxes", "2", "--credits", "10")
	if _, err := runCLI(t, dir, "accounts", "create", "team"); err == nil || !strings.Contains(err.Error(), "exists already") {
		t.Fatalf("a second team: %v", err)
	}
	if _, err := runCLI(t, dir, "accounts", "set-limits", "team", "--max-cpus", "-1"); err == nil || !strings.Contains(err.Error(), "--max-cpus must not be negative") {
		t.Fatalf("negative max-cpus: %v", err)
	}
	if _, err := runCLI(t, dir, "accounts", "set-limits", "nope", "--max-cpus", "1"); err == nil || !strings.Contains(err.Error(), `no account "nope"`) {
		t.Fatalf("unknown account: %v", err)
	}
	if _, err := runCLI(t, dir, "accounts", "set-limits", "team", "--requests-per-minute", "many"); err == nil || !strings.Contains(err.Error(), "requests-per-minute") {
		t.Fatalf("a word for a number: %v", err)
	}
	out := mustRun("accounts", "set-limits", "team", "--requests-per-minute", "60", "--monthly-cpu-seconds", "3600", "--max-timeout", "600")
	if !strings.Contains(out, `"max_sandboxes":2`) || !strings.Contains(out, `"requests_per_minute":60`) || !strings.Contains(out, `"max_timeout":600`) {
		t.Fatalf("set-limits printed %s", out)
	}
	out = mustRun("accounts", "set-limits", "team", "--reset", "max-sandboxes")
	if strings.Contains(out, "max_sandboxes") {
		t.Fatalf("reset printed %s", out)
	}
	if _, err := runCLI(t, dir, "accounts", "credit", "team", "ten"); err == nil {
		t.Fatal("a word as an amount was accepted")
	}
	out = mustRun("accounts", "credit", "team", "2.5", "--reason", "pilot")
	if !strings.Contains(out, "balance 12.500000") {
		t.Fatalf("credit printed %s", out)
	}
	if _, err := runCLI(t, dir, "keys", "create", "--account", "nope"); err == nil {
		t.Fatal("a key of an unknown account")
	}
	out = mustRun("keys", "create", "--account", "team", "--admin", "--name", "ops")
	if !strings.Contains(out, "role:   admin") {
		t.Fatalf("keys create printed %s", out)
	}
	out = mustRun("accounts", "show", "team")
	for _, w := range []string{"name:     team", "balance 12.500000 (free 10.000000, granted 2.500000", "admin", "ops", `"monthly_cpu_seconds":3600`} {
		if !strings.Contains(out, w) {
			t.Fatalf("show lacks %q:\n%s", w, out)
		}
	}
	out = mustRun("accounts", "list")
	if !strings.Contains(out, "team") || !strings.Contains(out, "12.500000") {
		t.Fatalf("list printed %s", out)
	}
	// The key works, for the account.
	cfg := config.Config{DataDir: dir}
	st, err := openStore(context.Background(), &cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	a, _ := st.AccountByName(context.Background(), "team")
	secret := strings.Fields(keyLine(t, dir))[1]
	p, err := (&auth.Authenticator{Store: st}).Check(context.Background(), secret)
	if err != nil || p.Owner != a.ID || !p.Admin() {
		t.Fatalf("the key: %+v, %v", p, err)
	}
}

// keyLine creates a key of team and returns its "key:" line.
func keyLine(t *testing.T, dir string) string {
	out, err := runCLI(t, dir, "keys", "create", "--account", "team", "--admin")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "key:") {
			return l
		}
	}
	t.Fatalf("no key line in %s", out)
	return ""
}

// TestAccountsRuntimeCLI: `accounts set-runtime` sets, locks and clears
// an account's runtime in the database, and show prints it; a lock
// without a runtime and a malformed name are refused.
func TestAccountsRuntimeCLI(t *testing.T) {
	dir := t.TempDir() + "/data"
	mustRun := mustRunCLI(t, dir)
	mustRun("accounts", "create", "team")
	if out := mustRun("accounts", "show", "team"); !strings.Contains(out, "runtime:  the server's default") {
		t.Fatalf("show of a new account:\n%s", out)
	}
	if out := mustRun("accounts", "set-runtime", "team", "gvisor", "--lock"); !strings.Contains(out, "gvisor (locked") {
		t.Fatalf("set-runtime printed %s", out)
	}
	if out := mustRun("accounts", "show", "team"); !strings.Contains(out, "runtime:  gvisor (locked") {
		t.Fatalf("show after set-runtime:\n%s", out)
	}
	for _, bad := range [][]string{{"team", "", "--lock"}, {"team", "Not A Runtime"}, {"nope", "gvisor"}} {
		if _, err := runCLI(t, dir, append([]string{"accounts", "set-runtime"}, bad...)...); err == nil {
			t.Errorf("set-runtime %q was accepted", bad)
		}
	}
	mustRun("accounts", "set-runtime", "team", "")
	if out := mustRun("accounts", "show", "team"); !strings.Contains(out, "runtime:  the server's default") {
		t.Fatalf("show after clearing:\n%s", out)
	}
}
