package sandbox_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/agentproto"
	"github.com/sheepfold/sheepfold/internal/apierr"
	"github.com/sheepfold/sheepfold/internal/events"
	"github.com/sheepfold/sheepfold/internal/policy"
	"github.com/sheepfold/sheepfold/internal/sandbox"
)

func ptr[T any](v T) *T { return &v }

const (
	filterSecret = "s3cr3t-Value-0123456789"
	ghToken      = "ghp_abcdefghijklmnopqrstuvwxyzABCDEFGHIJ"
)

// collector is an events.Sink that keeps what it gets.
type collector struct {
	mu  sync.Mutex
	evs []events.Event
}

func (c *collector) Emit(e events.Event) {
	c.mu.Lock()
	c.evs = append(c.evs, e)
	c.mu.Unlock()
}

func (c *collector) of(typ events.Type) []events.Event {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []events.Event
	for _, e := range c.evs {
		if e.Type == typ {
			out = append(out, e)
		}
	}
	return out
}

// run executes code both ways (kept and streamed) and returns the kept
// execution and the streamed text of stdout, stderr and the events.
func runBoth(t *testing.T, sb *sandbox.Sandbox, code string) (*sandbox.Execution, string, []agentproto.Event) {
	t.Helper()
	ex, err := sb.Execute(context.Background(), sandbox.ExecuteRequest{Code: code}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var streamed strings.Builder
	var evs []agentproto.Event
	_, err = sb.Execute(context.Background(), sandbox.ExecuteRequest{Code: code}, func(ev agentproto.Event) error {
		if ev.Type == agentproto.EventStdout || ev.Type == agentproto.EventStderr {
			streamed.Write(ev.Data)
		}
		evs = append(evs, ev)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return ex, streamed.String(), evs
}

// Through the engine: secrets split across writes (with a flush and a
// pause between the halves), base64-encoded, in results and in errors.
func TestOutputFilterRedacts(t *testing.T) {
	t.Parallel()
	m, _ := fakeEngine(t, sandbox.Config{})
	sb, err := m.Create(context.Background(), sandbox.CreateOptions{
		Env:    map[string]string{"DB_PASSWORD": filterSecret, "GREETING": "hello world"},
		Policy: &policy.Policy{OutputFiltering: &policy.OutputFiltering{StripSensitiveData: ptr(true)}},
	})
	if err != nil {
		t.Fatal(err)
	}
	code := `import os, sys, time, base64
s = os.environ["DB_PASSWORD"]
sys.stdout.write("pw=" + s[:7]); sys.stdout.flush(); time.sleep(0.2)
sys.stdout.write(s[7:] + "\n"); sys.stdout.flush()
t = "` + ghToken + `"
sys.stderr.write(t[:10]); sys.stderr.flush(); time.sleep(0.2)
sys.stderr.write(t[10:] + " end\n")
print("b64", base64.b64encode(s.encode()).decode())
print(os.environ["GREETING"], "mail: bob@example.com")
s + " in a result"`
	ex, streamed, _ := runBoth(t, sb, code)
	all := ex.Stdout + ex.Stderr + streamed
	for _, r := range ex.Results {
		all += r.Text
	}
	for _, leak := range []string{filterSecret, filterSecret[7:], ghToken, ghToken[10:], base64.StdEncoding.EncodeToString([]byte(filterSecret))[:12], "bob@example.com"} {
		if strings.Contains(all, leak) {
			t.Fatalf("%q leaked:\n%s", leak, all)
		}
	}
	wantOut := "pw=[REDACTED:secret_env]\nb64 [REDACTED:secret_env_base64]\nhello world mail: [REDACTED:email]\n"
	if ex.Stdout != wantOut || ex.Stderr != "[REDACTED:github_token] end\n" {
		t.Fatalf("stdout %q\nstderr %q", ex.Stdout, ex.Stderr)
	}
	if streamed != ex.Stdout+ex.Stderr && streamed != ex.Stderr+ex.Stdout && !sameLines(streamed, ex.Stdout+ex.Stderr) {
		t.Fatalf("streamed %q", streamed)
	}
	if len(ex.Results) != 1 || ex.Results[0].Text != "'[REDACTED:secret_env] in a result'" {
		t.Fatalf("results %+v", ex.Results)
	}

	// Errors: the value and traceback.
	ex, _, evs := runBoth(t, sb, `import os
raise ValueError("bad " + os.environ["DB_PASSWORD"])`)
	if ex.Error == nil || strings.Contains(ex.Error.Value+ex.Error.Traceback, filterSecret) || !strings.Contains(ex.Error.Value, "[REDACTED:secret_env]") {
		t.Fatalf("error %+v", ex.Error)
	}
	for _, ev := range evs {
		if ev.Error != nil && strings.Contains(ev.Error.Value+ev.Error.Traceback, filterSecret) {
			t.Fatalf("streamed error %+v", ev.Error)
		}
	}

	// The same code unfiltered shows the secret: the test can fail.
	plain, err := m.Create(context.Background(), sandbox.CreateOptions{Env: map[string]string{"DB_PASSWORD": filterSecret}})
	if err != nil {
		t.Fatal(err)
	}
	if ex, _, _ := runBoth(t, plain, code); !strings.Contains(ex.Stdout, filterSecret) {
		t.Fatalf("without a policy the secret is not printed: %q", ex.Stdout)
	}
}

func sameLines(a, b string) bool {
	la, lb := strings.SplitAfter(a, "\n"), strings.SplitAfter(b, "\n")
	if len(la) != len(lb) {
		return false
	}
	seen := map[string]int{}
	for _, l := range la {
		seen[l]++
	}
	for _, l := range lb {
		seen[l]--
	}
	for _, n := range seen {
		if n != 0 {
			return false
		}
	}
	return true
}

// max_output_length cuts a flood with a marker saying how much was
// dropped, in both modes, and reports resource_exceeded output.
func TestOutputFilterMaxLength(t *testing.T) {
	t.Parallel()
	sink := &collector{}
	m, _ := fakeEngine(t, sandbox.Config{Events: sink})
	sb, err := m.Create(context.Background(), sandbox.CreateOptions{
		Policy: &policy.Policy{OutputFiltering: &policy.OutputFiltering{MaxOutputLength: ptr(int64(100)), StripSensitiveData: ptr(true)}},
	})
	if err != nil {
		t.Fatal(err)
	}
	ex, streamed, _ := runBoth(t, sb, "for i in range(2000):\n    print('line', i)\n'x' * 500")
	if !strings.HasPrefix(ex.Stdout, "line 0\nline 1\n") || !strings.Contains(ex.Stdout, "more bytes dropped by max_output_length") ||
		len(ex.Stdout) > 100+100 || !ex.Truncated {
		t.Fatalf("kept stdout (%d bytes) %q", len(ex.Stdout), ex.Stdout)
	}
	if !strings.Contains(streamed, "more bytes dropped by max_output_length") || len(streamed) > 200 {
		t.Fatalf("streamed (%d bytes) %q", len(streamed), streamed)
	}
	// The cap is of the whole answer: stdout spent it, so nothing of the
	// result is left, and it is counted as dropped.
	if len(ex.Results) != 0 || ex.Dropped == nil || ex.Dropped.Results != 1 || !strings.Contains(ex.Dropped.Reason, "max_output_length") {
		t.Fatalf("result %+v, dropped %+v", ex.Results, ex.Dropped)
	}
	ev := sink.of(events.ResourceExceeded)
	if len(ev) != 2 || ev[0].Details["resource"] != events.ResourceOutput || ev[0].Details["limit"] != int64(100) {
		t.Fatalf("resource_exceeded events %+v", ev)
	}
}

// sanitize_errors keeps the user's cell lines and drops the driver's.
func TestOutputFilterSanitizesErrors(t *testing.T) {
	t.Parallel()
	m, _ := fakeEngine(t, sandbox.Config{})
	sb, err := m.Create(context.Background(), sandbox.CreateOptions{
		Policy: &policy.Policy{OutputFiltering: &policy.OutputFiltering{SanitizeErrors: ptr(true)}},
	})
	if err != nil {
		t.Fatal(err)
	}
	ex, _, _ := runBoth(t, sb, "import json\ndef f():\n    return json.loads('{bad')\nf()")
	if ex.Error == nil {
		t.Fatal("no error")
	}
	tb := ex.Error.Traceback
	if !strings.Contains(tb, `File "<cell-`) || !strings.Contains(tb, "json.loads('{bad')") ||
		strings.Contains(tb, "/usr/lib/python3") || !strings.Contains(tb, "<stdlib>/json/") || strings.Contains(tb, `File "<string>"`) {
		t.Fatalf("traceback:\n%s", tb)
	}
}

// on_violation "terminate" stops the sandbox at its first violation, with
// a reason that says so; "report" (the default) keeps it running.
func TestOnViolationTerminate(t *testing.T) {
	t.Parallel()
	sink := &collector{}
	m, _ := fakeEngine(t, sandbox.Config{Events: sink})
	for _, mode := range []string{"report", "terminate"} {
		sb, err := m.Create(context.Background(), sandbox.CreateOptions{Owner: "o", Policy: &policy.Policy{
			AccessControl: &policy.AccessControl{BlockedModules: []string{"socket"}}, OnViolation: mode}})
		if err != nil {
			t.Fatal(err)
		}
		ex, err := sb.Execute(context.Background(), sandbox.ExecuteRequest{Code: "import socket"}, nil)
		switch {
		case err != nil:
			// Terminated while the execution was still answering.
			if mode != "terminate" || apierr.CodeOf(err) != apierr.SandboxState || !strings.Contains(err.Error(), "security violation") {
				t.Fatalf("%s: %v", mode, err)
			}
		case ex.Error == nil || ex.ErrorCode != "ERR_MODULE_BLOCKED":
			t.Fatalf("%s: import socket ran: %+v", mode, ex)
		}
		// The stop runs in the background: wait for it (bounded).
		deadline := time.Now().Add(10 * time.Second)
		for mode == "terminate" && sb.State() != sandbox.StateStopped && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		info := sb.Info()
		switch mode {
		case "report":
			if info.State != sandbox.StateRunning {
				t.Fatalf("report: sandbox %s (%s)", info.State, info.StopReason)
			}
		case "terminate":
			if info.State != sandbox.StateStopped || !strings.Contains(info.StopReason, "security violation: module_blocked socket") {
				t.Fatalf("terminate: sandbox %s (%q)", info.State, info.StopReason)
			}
		}
	}
	// sandbox.stopped is emitted once the destroy is done, just after the
	// state turns stopped: wait for it (bounded).
	var stopped []events.Event
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		stopped = stopped[:0]
		for _, e := range sink.of(events.SandboxStopped) {
			if e.Owner == "o" {
				stopped = append(stopped, e)
			}
		}
		if len(stopped) > 0 || time.Now().After(deadline) {
			break
		}
	}
	if v := sink.of(events.SecurityViolation); len(v) != 2 || v[0].Owner != "o" || v[1].Details["kind"] != "module_blocked" {
		t.Fatalf("violations %+v", v)
	}
	if len(stopped) != 1 || !strings.Contains(stopped[0].Details["reason"].(string), "security violation") {
		t.Fatalf("stopped events %+v", stopped)
	}
}

// Results: a JSON result (every string in it, keys too, at any depth),
// an HTML one and a PNG that is text (a _repr_png_ returning str) are
// redacted.
func TestOutputFilterResults(t *testing.T) {
	t.Parallel()
	m, _ := fakeEngine(t, sandbox.Config{})
	code := `class R:
    def _repr_json_(self): return {"config": {"api_key": "` + ghToken + `", "n": 1, "list": ["ok", "pw ` + filterSecret + `"]}, "` + ghToken + `": True}
    def _repr_html_(self): return "<b>token ` + ghToken + `</b>"
    def _repr_png_(self): return "iVBORw0KGgo` + filterSecret + `"
R()`
	check := func(t *testing.T, sb *sandbox.Sandbox, redacted bool) {
		ex, _, evs := runBoth(t, sb, code)
		var streamed []agentproto.Result
		for _, ev := range evs {
			if ev.Result != nil {
				streamed = append(streamed, *ev.Result)
			}
		}
		for _, rs := range [][]agentproto.Result{ex.Results, streamed} {
			if len(rs) != 1 {
				t.Fatalf("results %+v", rs)
			}
			b, _ := json.Marshal(rs[0].JSON)
			leaked := strings.Contains(string(b)+rs[0].HTML, ghToken) || strings.Contains(string(b), filterSecret)
			if leaked == redacted {
				t.Fatalf("redacting %v: json %s html %q", redacted, b, rs[0].HTML)
			}
			if strings.Contains(rs[0].PNG, filterSecret) == redacted {
				t.Fatalf("redacting %v: the PNG is %q", redacted, rs[0].PNG)
			}
			if !redacted {
				continue
			}
			want := `{"[REDACTED:github_token]":true,"config":{"api_key":"[REDACTED:github_token]","list":["ok","pw [REDACTED:secret_env]"],"n":1}}`
			if string(b) != want || rs[0].HTML != "<b>token [REDACTED:github_token]</b>" {
				t.Fatalf("json %s\nhtml %q", b, rs[0].HTML)
			}
		}
	}
	env := map[string]string{"DB_PASSWORD": filterSecret}
	filtered, err := m.Create(context.Background(), sandbox.CreateOptions{Env: env,
		Policy: &policy.Policy{OutputFiltering: &policy.OutputFiltering{StripSensitiveData: ptr(true)}}})
	if err != nil {
		t.Fatal(err)
	}
	plain, err := m.Create(context.Background(), sandbox.CreateOptions{Env: env})
	if err != nil {
		t.Fatal(err)
	}
	t.Run("filtered", func(t *testing.T) { check(t, filtered, true) })
	t.Run("unfiltered", func(t *testing.T) { check(t, plain, false) })
}

// Commands (/v1 commands and E2B processes both run through Run and
// Connect): a secret printed whole, split across two writes with a pause,
// base64-encoded, or in the command's own env, is redacted; the cap cuts
// with its marker and reports resource_exceeded output.
func TestOutputFilterCommands(t *testing.T) {
	t.Parallel()
	sink := &collector{}
	m, _ := fakeEngine(t, sandbox.Config{Events: sink})
	b64 := base64.StdEncoding.EncodeToString([]byte(filterSecret))
	script := `printf 'tok=%s\n' "` + ghToken + `"; printf 'pw=%s' "${DB_PASSWORD:0:7}"; sleep 0.2; printf '%s\n' "${DB_PASSWORD:7}"
printf '%s\n' "$(printf %s "$DB_PASSWORD" | base64)" >&2; printf 'own=%s\n' "$CMD_TOKEN"`
	cmdSecret := "cmd-only-secret-42424242"
	run := func(t *testing.T, sb *sandbox.Sandbox, start bool) (string, *sandbox.ProcessResult) {
		var out strings.Builder
		var mu sync.Mutex
		on := func(ev agentproto.Event) {
			if ev.Type == agentproto.EventStdout || ev.Type == agentproto.EventStderr {
				mu.Lock()
				out.Write(ev.Data)
				mu.Unlock()
			}
		}
		spec := sandbox.ProcessSpec{Cmd: "bash", Args: []string{"-c", script}, Env: map[string]string{"CMD_TOKEN": cmdSecret}}
		var res *sandbox.ProcessResult
		var err error
		if start {
			spec.Args[1] = "sleep 0.3; " + script
			pid, serr := sb.Start(context.Background(), spec)
			if serr != nil {
				t.Fatal(serr)
			}
			res, err = sb.Connect(context.Background(), pid, on)
		} else {
			res, err = sb.Run(context.Background(), spec, on)
		}
		if err != nil {
			t.Fatal(err)
		}
		return out.String(), res
	}
	env := map[string]string{"DB_PASSWORD": filterSecret}
	filtered, err := m.Create(context.Background(), sandbox.CreateOptions{Env: env,
		Policy: &policy.Policy{OutputFiltering: &policy.OutputFiltering{StripSensitiveData: ptr(true)}}})
	if err != nil {
		t.Fatal(err)
	}
	plain, err := m.Create(context.Background(), sandbox.CreateOptions{Env: env})
	if err != nil {
		t.Fatal(err)
	}
	leaks := []string{ghToken, filterSecret, filterSecret[7:], b64[:12], cmdSecret}
	for _, mode := range []string{"run", "connect"} {
		t.Run(mode, func(t *testing.T) {
			// Unfiltered, every secret shows: the test can fail.
			got, _ := run(t, plain, mode == "connect")
			for _, s := range leaks {
				if !strings.Contains(got, s) {
					t.Fatalf("unfiltered output lacks %q: %q", s, got)
				}
			}
			got, _ = run(t, filtered, mode == "connect")
			for _, s := range leaks {
				if strings.Contains(got, s) {
					t.Fatalf("%q leaked: %q", s, got)
				}
			}
			for _, want := range []string{"tok=[REDACTED:github_token]\n", "pw=[REDACTED:secret_env]\n", "[REDACTED:secret_env_base64]\n", "own=[REDACTED:secret_env]\n"} {
				if !strings.Contains(got, want) {
					t.Fatalf("output lacks %q: %q", want, got)
				}
			}
		})
	}
	t.Run("max_output_length", func(t *testing.T) {
		capped, err := m.Create(context.Background(), sandbox.CreateOptions{
			Policy: &policy.Policy{OutputFiltering: &policy.OutputFiltering{MaxOutputLength: ptr(int64(100))}}})
		if err != nil {
			t.Fatal(err)
		}
		var out strings.Builder
		res, err := capped.Run(context.Background(), sandbox.ProcessSpec{Cmd: "bash", Args: []string{"-c", "head -c 5000 /dev/zero | tr '\\0' x"}},
			func(ev agentproto.Event) { out.Write(ev.Data) })
		if err != nil {
			t.Fatal(err)
		}
		want := strings.Repeat("x", 100) + "\n[truncated: 4900 more bytes dropped by max_output_length]\n"
		if out.String() != want || !res.Truncated {
			t.Fatalf("output %q, %+v", out.String(), res)
		}
		var found bool
		for _, ev := range sink.of(events.ResourceExceeded) {
			if ev.SandboxID == capped.ID && ev.Details["resource"] == events.ResourceOutput && ev.Details["limit"] == int64(100) &&
				ev.Details["observed"] == int64(5000) {
				found = true
			}
		}
		if !found {
			t.Fatalf("no resource_exceeded output: %+v", sink.of(events.ResourceExceeded))
		}
	})
}
