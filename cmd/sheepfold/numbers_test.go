package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/config"
	"github.com/sheepfold/sheepfold/internal/store"
)

const maxInt64 = "9223372036854775807"

// TestCLINumbers: the accounts commands refuse numbers out of their range
// (the same as the API's, internal/bound) naming the flag or argument,
// refuse names shaped like ids, and find an account by its id first.
func TestCLINumbers(t *testing.T) {
	dir := t.TempDir() + "/data"
	if out, err := runCLI(t, dir, "accounts", "create", "team", "--credits", "10"); err != nil {
		t.Fatalf("create: %v\n%s", err, out)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"accounts", "create", "acct_0123456789abcdef"}, "NAME"},
		{[]string{"accounts", "create", "key_x"}, "NAME"},
		{[]string{"accounts", "create", "t2", "--requests-per-minute", maxInt64}, "--requests-per-minute must be at most"},
		{[]string{"accounts", "create", "t2", "--max-timeout", maxInt64}, "--max-timeout must be at most"},
		{[]string{"accounts", "create", "t2", "--max-memory-mb", maxInt64}, "--max-memory-mb must be at most"},
		{[]string{"accounts", "create", "t2", "--max-cpus", "NaN"}, "--max-cpus"},
		{[]string{"accounts", "create", "t2", "--max-cpus", "1e300"}, "--max-cpus"},
		{[]string{"accounts", "create", "t2", "--credits", "9999999999999"}, "--credits"},
		{[]string{"accounts", "set-limits", "team", "--monthly-executions", maxInt64}, "--monthly-executions must be at most"},
		{[]string{"accounts", "set-limits", "team", "--max-cpus", "Inf"}, "--max-cpus"},
		{[]string{"accounts", "credit", "team", "9999999999999"}, "AMOUNT"},
		{[]string{"accounts", "credit", "team", "--", "-9999999999999"}, "AMOUNT"},
		{[]string{"accounts", "credit", "team", "1000000000"}, "AMOUNT would take the balance"},
	} {
		out, err := runCLI(t, dir, c.args...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: error %v, want one naming %q\n%s", c.args, err, c.want, out)
		}
	}
	out, err := runCLI(t, dir, "accounts", "show", "team")
	if err != nil || !strings.Contains(out, "limits:   {}") || !strings.Contains(out, "balance 10.000000") {
		t.Fatalf("refused values changed the account: %v\n%s", err, out)
	}

	// An impostor named like team's id (as a database from before the
	// rule may hold): the id still finds team.
	cfg := config.Config{DataDir: dir}
	st, err := openStore(context.Background(), &cfg)
	if err != nil {
		t.Fatal(err)
	}
	team, err := st.AccountByName(context.Background(), "team")
	if err == nil {
		err = st.CreateAccount(context.Background(), store.Account{ID: "acct_impostor", Name: team.ID, CreatedAt: time.Now()})
	}
	st.Close()
	if err != nil {
		t.Fatal(err)
	}
	if out, err := runCLI(t, dir, "accounts", "show", team.ID); err != nil || !strings.Contains(out, "name:     team") {
		t.Fatalf("show by id: %v\n%s", err, out)
	}
}

// TestServeFlagBounds: serve refuses every number of its flags (and the
// config file's and environment's, which set the same flags) out of its
// range, naming the flag, before anything starts. The control: the same
// command with sane flags gets past them, to the missing runtime.
func TestServeFlagBounds(t *testing.T) {
	run := func(args ...string) error {
		t.Helper()
		cfg := config.Config{DataDir: t.TempDir()}
		cmd := serveCmd(&cfg)
		cmd.SetArgs(append([]string{"--config", writeConfig(t, "")}, args...))
		var out bytes.Buffer
		cmd.SetOut(&out)
		cmd.SetErr(&out)
		return cmd.ExecuteContext(context.Background())
	}
	if err := run("--listen", "127.0.0.1:0"); err == nil || !strings.Contains(err.Error(), "binary") {
		t.Fatalf("sane flags: %v, want the missing runtime", err)
	}
	for _, c := range []struct{ flag, value string }{
		{"--file-size-upload-mb", maxInt64},
		{"--max-sandboxes", "-1"},
		{"--max-sandboxes", maxInt64},
		{"--pool", maxInt64},
		{"--idle-timeout", "-1s"},
		{"--idle-timeout", "2562047h"},
		{"--retention", "2562047h"},
		{"--event-retention", "2562047h"},
		{"--shutdown-timeout", "2562047h"},
		{"--credits-grace", "2562047h"},
		{"--metering-sample-interval", "2562047h"},
		{"--overcommit", "NaN"},
		{"--overcommit", "+Inf"},
		{"--overcommit", "1e300"},
		{"--price-cpu-second", "NaN"},
		{"--price-gb-second", "1e300"},
		{"--price-execution", "+Inf"},
		{"--account-requests-per-minute", maxInt64},
		{"--pace-per-account", maxInt64},
		{"--pace-per-account", "-1"},
		{"--account-max-timeout", maxInt64},
		{"--account-max-cpus", "NaN"},
		{"--free-credits", "9999999999999"},
		{"--credits-low", "9999999999999"},
	} {
		err := run("--listen", "127.0.0.1:0", c.flag, c.value)
		if err == nil || !strings.Contains(err.Error(), c.flag) {
			t.Errorf("%s %s: %v, want an error naming the flag", c.flag, c.value, err)
		}
	}
}
