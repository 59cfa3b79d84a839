package server_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/sheepfold/sheepfold/internal/account"
	"github.com/sheepfold/sheepfold/internal/auth"
	"github.com/sheepfold/sheepfold/internal/bound"
	"github.com/sheepfold/sheepfold/internal/e2b/envdpb/processpb"
	"github.com/sheepfold/sheepfold/internal/llm"
	"github.com/sheepfold/sheepfold/internal/llm/llmtest"
	"github.com/sheepfold/sheepfold/internal/server"
	"github.com/sheepfold/sheepfold/internal/store"
)

// The hostile numbers of the overflow table.
const (
	maxInt64 = "9223372036854775807" // 2^63-1
	wrap     = "18446744074"         // seconds whose nanoseconds wrap int64 to about 1 s
	huge     = "1e309"               // past float64
)

var hugeDigits = strings.Repeat("9", 5000)

// namesField fails unless msg names field as a word ("timeout" in
// "timeout must be ..." or `field "timeout"`, not in "timeout_ms").
func namesField(t *testing.T, msg, field string) {
	t.Helper()
	if !regexp.MustCompile(`(^|[^A-Za-z0-9_.])` + regexp.QuoteMeta(field) + `($|[^A-Za-z0-9_])`).MatchString(msg) {
		t.Fatalf("message %q does not name %s", msg, field)
	}
}

// TestOverflowTable sends each number field of every surface its hostile
// values (2^63-1, -1, 1e309, "NaN", a huge string, 18446744074 s) through
// the real handlers: each answers 400 naming the field, never a 5xx, a
// wrapped value or a silent empty answer.
func TestOverflowTable(t *testing.T) {
	t.Parallel()
	e := newEnv(t, server.Config{})
	admin := e.adminKey()
	want(t, e.do("POST", "/v1/admin/accounts", admin, map[string]any{"name": "team"}), http.StatusCreated, "")
	id := e.create(e.keyA, nil)
	sb := e.e2bCreate(e.keyA, nil)
	r := e.do("POST", "/v1/webhooks", e.keyA, map[string]any{"url": "https://example.com/hook"})
	want(t, r, http.StatusCreated, "")
	hook := r.json(t)["id"].(string)

	rows := []struct {
		method, path, body, field string
		admin                     bool
	}{
		// Money: a credit's amount.
		{"POST", "/v1/admin/accounts/team/credits", `{"amount":"9999999999999"}`, "amount", true},
		{"POST", "/v1/admin/accounts/team/credits", `{"amount":"-9999999999999"}`, "amount", true},
		{"POST", "/v1/admin/accounts/team/credits", `{"amount":"1000000000.000001"}`, "amount", true},
		{"POST", "/v1/admin/accounts/team/credits", `{"amount":"` + maxInt64 + `"}`, "amount", true},
		{"POST", "/v1/admin/accounts/team/credits", `{"amount":"1e309"}`, "amount", true},
		{"POST", "/v1/admin/accounts/team/credits", `{"amount":"NaN"}`, "amount", true},
		{"POST", "/v1/admin/accounts/team/credits", `{"amount":"` + hugeDigits + `"}`, "amount", true},
		{"POST", "/v1/admin/accounts/team/credits", `{"amount":-1}`, "amount", true},
		// Account limits.
		{"POST", "/v1/admin/accounts/team/limits", `{"max_timeout":` + maxInt64 + `}`, "max_timeout", true},
		{"POST", "/v1/admin/accounts/team/limits", `{"max_timeout":` + wrap + `}`, "max_timeout", true},
		{"POST", "/v1/admin/accounts/team/limits", `{"requests_per_minute":` + maxInt64 + `}`, "requests_per_minute", true},
		{"POST", "/v1/admin/accounts/team/limits", `{"executions_per_minute":` + maxInt64 + `}`, "executions_per_minute", true},
		{"POST", "/v1/admin/accounts/team/limits", `{"max_sandboxes":` + maxInt64 + `}`, "max_sandboxes", true},
		{"POST", "/v1/admin/accounts/team/limits", `{"monthly_sandbox_seconds":` + maxInt64 + `}`, "monthly_sandbox_seconds", true},
		{"POST", "/v1/admin/accounts/team/limits", `{"monthly_cpu_seconds":` + maxInt64 + `}`, "monthly_cpu_seconds", true},
		{"POST", "/v1/admin/accounts/team/limits", `{"monthly_gb_seconds":` + maxInt64 + `}`, "monthly_gb_seconds", true},
		{"POST", "/v1/admin/accounts/team/limits", `{"monthly_executions":` + maxInt64 + `}`, "monthly_executions", true},
		{"POST", "/v1/admin/accounts/team/limits", `{"max_memory_mb":` + maxInt64 + `}`, "max_memory_mb", true},
		{"POST", "/v1/admin/accounts/team/limits", `{"max_disk_mb":` + maxInt64 + `}`, "max_disk_mb", true},
		{"POST", "/v1/admin/accounts/team/limits", `{"max_cpus":1e300}`, "max_cpus", true},
		{"POST", "/v1/admin/accounts/team/limits", `{"max_cpus":` + huge + `}`, "max_cpus", true},
		{"POST", "/v1/admin/accounts/team/limits", `{"max_cpus":"NaN"}`, "max_cpus", true},
		{"POST", "/v1/admin/accounts/team/limits", `{"max_sandboxes":-1}`, "max_sandboxes", true},
		{"POST", "/v1/admin/accounts", `{"name":"team2","limits":{"max_timeout":` + maxInt64 + `}}`, "limits.max_timeout", true},
		{"POST", "/v1/admin/accounts", `{"name":"team3","limits":{"requests_per_minute":` + maxInt64 + `}}`, "limits.requests_per_minute", true},
		// A sandbox's lifetime and resources.
		{"POST", "/v1/sandboxes", `{"timeout":` + wrap + `}`, "timeout", false},
		{"POST", "/v1/sandboxes", `{"timeout":` + maxInt64 + `}`, "timeout", false},
		{"POST", "/v1/sandboxes", `{"timeout":` + huge + `}`, "timeout", false},
		{"POST", "/v1/sandboxes", `{"timeout":-1}`, "timeout", false},
		{"POST", "/v1/sandboxes", `{"timeout":"NaN"}`, "timeout", false},
		{"POST", "/v1/sandboxes", `{"resources":{"memory_mb":` + maxInt64 + `}}`, "resources.memory_mb", false},
		{"POST", "/v1/sandboxes", `{"resources":{"disk_mb":` + maxInt64 + `}}`, "resources.disk_mb", false},
		{"POST", "/v1/sandboxes", `{"resources":{"cpus":` + huge + `}}`, "resources.cpus", false},
		{"POST", "/v1/sandboxes", `{"resources":{"pids":-1}}`, "resources.pids", false},
		{"POST", "/v1/sandboxes", `{"sandbox_config":{"max_execution_time":` + wrap + `}}`, "sandbox_config.max_execution_time", false},
		{"POST", "/v1/sandboxes/{id}/timeout", `{"timeout":` + wrap + `}`, "timeout", false},
		{"POST", "/v1/sandboxes/{id}/timeout", `{"timeout":-1}`, "timeout", false},
		// Executions, commands, asks.
		{"POST", "/v1/sandboxes/{id}/execute", `{"code":"1","timeout_ms":` + maxInt64 + `}`, "timeout_ms", false},
		{"POST", "/v1/sandboxes/{id}/execute", `{"code":"1","timeout_ms":-1}`, "timeout_ms", false},
		{"POST", "/v1/sandboxes/{id}/execute", `{"code":"1","timeout_ms":` + huge + `}`, "timeout_ms", false},
		{"POST", "/v1/sandboxes/{id}/commands", `{"cmd":"true","timeout_ms":` + maxInt64 + `}`, "timeout_ms", false},
		{"POST", "/v1/sandboxes/{id}/commands", `{"cmd":"true","timeout_ms":-1}`, "timeout_ms", false},
		{"POST", "/v1/sessions/nope/ask", `{"prompt":"p","max_steps":` + maxInt64 + `}`, "max_steps", false},
		{"POST", "/v1/sessions/nope/ask", `{"prompt":"p","timeout_ms":` + maxInt64 + `}`, "timeout_ms", false},
		// A webhook's URL: its port.
		{"POST", "/v1/webhooks", `{"url":"https://example.com:99999/hook"}`, "url", false},
		{"POST", "/v1/webhooks", `{"url":"https://example.com:0/hook"}`, "url", false},
		{"POST", "/v1/webhooks", `{"url":"https://example.com:` + maxInt64 + `/hook"}`, "url", false},
		// Query parameters: pages, cursors, times.
		{"GET", "/v1/sandboxes?limit=" + maxInt64, "", "limit", false},
		{"GET", "/v1/sandboxes?cursor=zzz", "", "cursor", false},
		{"GET", "/v1/sandboxes/{id}/executions?cursor=zzz", "", "cursor", false},
		{"GET", "/v1/sandboxes/{id}/executions?cursor=exe_00000000000000000000", "", "cursor", false},
		{"GET", "/v1/sandboxes/{id}/executions?limit=-1", "", "limit", false},
		{"GET", "/v1/events?limit=" + huge, "", "limit", false},
		{"GET", "/v1/events?cursor=-1", "", "cursor", false},
		{"GET", "/v1/events?since=NaN", "", "since", false},
		{"GET", "/v1/webhooks/{hook}/deliveries?cursor=zzz", "", "cursor", false},
		{"GET", "/v1/webhooks/{hook}/deliveries?limit=" + maxInt64, "", "limit", false},
		{"GET", "/v1/account/usage?from=NaN", "", "from", false},
		{"GET", "/v1/account/usage?from=9999-12-31", "", "from", false},
		{"GET", "/v1/sandboxes/{id}/files/list?path=.&depth=" + maxInt64, "", "depth", false},
		{"GET", "/v1/sandboxes/{id}/files/list?path=.&limit=" + maxInt64, "", "limit", false},
		{"PUT", "/v1/sandboxes/{id}/ports/99999", `{"public":true}`, "port", false},
		{"GET", "/v1/sandboxes/{id}/ports?expires_in=" + wrap, "", "expires_in", false},
		{"GET", "/v1/sandboxes/{id}/ports?expires_in=9223372037", "", "expires_in", false},
		// E2B's control plane.
		{"POST", "/v2/sandboxes", `{"templateID":"python","timeout":` + maxInt64 + `}`, "timeout", false},
		{"POST", "/v2/sandboxes", `{"templateID":"python","timeout":-1}`, "timeout", false},
		{"POST", "/v2/sandboxes", `{"templateID":"python","cpuCount":` + huge + `}`, "cpuCount", false},
		{"POST", "/v2/sandboxes", `{"templateID":"python","cpuCount":1e300}`, "cpuCount", false},
		{"POST", "/v2/sandboxes", `{"templateID":"python","memoryMB":` + maxInt64 + `}`, "memoryMB", false},
		{"POST", "/v2/sandboxes", `{"templateID":"python","diskSizeMB":-1}`, "diskSizeMB", false},
		{"POST", "/sandboxes/{e2b}/timeout", `{"timeout":` + wrap + `}`, "timeout", false},
		{"POST", "/sandboxes/{e2b}/refreshes", `{"duration":` + maxInt64 + `}`, "duration", false},
		{"POST", "/sandboxes/{e2b}/connect", `{"timeout":` + maxInt64 + `}`, "timeout", false},
		{"GET", "/v2/sandboxes?limit=" + maxInt64, "", "limit", false},
		{"GET", "/sandboxes/{e2b}/metrics?start=-1", "", "start", false},
		{"GET", "/sandboxes/{e2b}/metrics?end=" + hugeDigits, "", "end", false},
	}
	fill := strings.NewReplacer("{id}", id, "{e2b}", sb.ID, "{hook}", hook)
	for _, c := range rows {
		path := fill.Replace(c.path)
		name := c.method + " " + c.path + " " + c.body
		if len(name) > 120 {
			name = name[:120]
		}
		t.Run(name, func(t *testing.T) {
			key := e.keyA
			if c.admin {
				key = admin
			}
			var body any
			if c.body != "" {
				body = c.body
			}
			e2b := !strings.HasPrefix(path, "/v1/")
			var r resp
			if e2b {
				r = e.e2bDo(c.method, path, key, body)
			} else {
				r = e.do(c.method, path, key, body)
			}
			if r.status != http.StatusBadRequest {
				t.Fatalf("status %d, want 400: %.300s", r.status, r.body)
			}
			var msg string
			if e2b {
				if e2bCode(t, r) != 400 {
					t.Fatalf("E2B code: %s", r.body)
				}
				msg, _ = r.json(t)["message"].(string)
			} else {
				if code := r.errCode(t); code != "ERR_BAD_REQUEST" {
					t.Fatalf("code %s: %s", code, r.body)
				}
				msg = r.json(t)["error"].(map[string]any)["message"].(string)
			}
			namesField(t, msg, c.field)
		})
	}

	// Nothing refused changed anything: the account's limits and credits
	// are as they were, and no sandbox was made beside the two.
	r = e.do("GET", "/v1/admin/accounts/team", admin, nil)
	want(t, r, http.StatusOK, "")
	if o := r.json(t)["overrides"].(map[string]any); len(o) != 0 {
		t.Fatalf("refused limits were kept: %s", r.body)
	}
	if c := r.json(t)["credits"].(map[string]any); c["granted_micros"] != 0.0 {
		t.Fatalf("a refused grant was kept: %s", r.body)
	}
	r = e.do("GET", "/v1/sandboxes", e.keyA, nil)
	want(t, r, http.StatusOK, "")
	if n := len(r.json(t)["sandboxes"].([]any)); n != 2 {
		t.Fatalf("%d sandboxes after the table, want 2: %s", n, r.body)
	}
}

// TestOverflowMCP: the MCP tools' numbers are checked before they are
// turned into durations (an 18446744074 s timeout once wrapped to a
// sandbox that expired after 1 s).
func TestOverflowMCP(t *testing.T) {
	t.Parallel()
	e := newEnv(t, server.Config{})
	cs, err := e.mcpConnect(e.keyA)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	id := e.create(e.keyA, nil)
	for _, c := range []struct {
		tool  string
		args  map[string]any
		field string
	}{
		{"create_sandbox", map[string]any{"timeout_seconds": 18446744074}, "timeout_seconds"},
		{"create_sandbox", map[string]any{"timeout_seconds": 9223372036}, "timeout_seconds"},
		{"create_sandbox", map[string]any{"timeout_seconds": -1}, "timeout_seconds"},
		{"create_sandbox", map[string]any{"resources": map[string]any{"memory_mb": 1 << 50}}, "resources.memory_mb"},
		{"run_code", map[string]any{"sandbox_id": id, "code": "1", "timeout_ms": 18446744073709}, "timeout_ms"},
		{"run_code", map[string]any{"sandbox_id": id, "code": "1", "timeout_ms": -1}, "timeout_ms"},
		{"run_command", map[string]any{"sandbox_id": id, "command": "true", "timeout_ms": 18446744073709}, "timeout_ms"},
	} {
		res, text, _ := call(t, cs, c.tool, c.args)
		if !res.IsError || !strings.HasPrefix(text, "ERR_BAD_REQUEST: ") {
			t.Errorf("%s %v: error %v, %q", c.tool, c.args, res.IsError, text)
			continue
		}
		namesField(t, strings.TrimPrefix(text, "ERR_BAD_REQUEST: "), c.field)
	}
	// Only the sandbox made above exists: nothing was created by a
	// wrapped timeout.
	r := e.do("GET", "/v1/sandboxes", e.keyA, nil)
	if n := len(r.json(t)["sandboxes"].([]any)); n != 1 {
		t.Fatalf("%d sandboxes, want 1: %s", n, r.body)
	}
}

// TestUsageFarFuture: a report's range reaching past year 9999 once made
// an answer that could not be encoded (500); the end is now clamped to
// the present's next hour, past which nothing is metered.
func TestUsageFarFuture(t *testing.T) {
	t.Parallel()
	e := newEnv(t, server.Config{})
	for _, to := range []string{"9999-12-31T23:59:59Z", "9999-12-31T23:59:59-23:59", "9999-12-31"} {
		r := e.do("GET", "/v1/account/usage?to="+url.QueryEscape(to), e.keyA, nil)
		want(t, r, http.StatusOK, "")
		end, err := time.Parse(time.RFC3339, r.json(t)["to"].(string))
		if err != nil || end.After(time.Now().Add(2*time.Hour)) {
			t.Fatalf("to=%s: the report ends %v (%v): %s", to, end, err, r.body)
		}
	}
}

// TestAccountNamesAreNotIDs: a name shaped like an account's id is
// refused, and a path naming an id finds that account even when another
// (made before the rule) is named like it.
func TestAccountNamesAreNotIDs(t *testing.T) {
	t.Parallel()
	e := newEnv(t, server.Config{})
	admin := e.adminKey()
	r := e.do("POST", "/v1/admin/accounts", admin, map[string]any{"name": "victim"})
	want(t, r, http.StatusCreated, "")
	victim := r.json(t)["id"].(string)
	for _, name := range []string{victim, "acct_0123456789abcdef", "key_0123456789abcdef", "ACCT_0123456789ABCDEF"} {
		r := e.do("POST", "/v1/admin/accounts", admin, map[string]any{"name": name})
		want(t, r, http.StatusBadRequest, "ERR_BAD_REQUEST")
		namesField(t, r.json(t)["error"].(map[string]any)["message"].(string), "name")
	}
	// An impostor named like the victim's id, as a database from before
	// the rule may hold: the id still finds the victim, for reading,
	// limits, credits and keys alike.
	ctx := context.Background()
	if err := e.store.CreateAccount(ctx, store.Account{ID: "acct_impostor0000000", Name: victim, CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	r = e.do("GET", "/v1/admin/accounts/"+victim, admin, nil)
	want(t, r, http.StatusOK, "")
	if got := r.json(t); got["id"] != victim || got["name"] != "victim" {
		t.Fatalf("the id found %v (%v)", got["id"], got["name"])
	}
	want(t, e.do("POST", "/v1/admin/accounts/"+victim+"/credits", admin, map[string]any{"amount": "1"}), http.StatusOK, "")
	if ct, _ := e.store.CreditTotals(ctx, "acct_impostor0000000"); ct.GrantedMicros != 0 {
		t.Fatalf("the impostor got the grant: %+v", ct)
	}
	r = e.do("POST", "/v1/admin/keys", admin, map[string]any{"account": victim})
	want(t, r, http.StatusCreated, "")
	if got := r.json(t)["account_id"]; got != victim {
		t.Fatalf("the key was made for %v", got)
	}
}

// TestKeepaliveIntervalOverflow: envd's Keepalive-Ping-Interval header in
// seconds whose nanoseconds wrap int64 (9223372037 s) once made a
// negative ticker interval, which panicked on a goroutine nothing
// recovers and stopped the whole server. It is cut to an hour now.
func TestKeepaliveIntervalOverflow(t *testing.T) {
	t.Parallel()
	e := newEnv(t, server.Config{})
	sb := e.e2bCreate(e.keyA, nil)
	proc, _ := e.rpcClients(sb, "")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, v := range []string{"9223372037", maxInt64, "18446744074"} {
		req := connect.NewRequest(&processpb.StartRequest{Process: &processpb.ProcessConfig{Cmd: "/bin/echo", Args: []string{"hi"}}})
		req.Header().Set("Keepalive-Ping-Interval", v)
		stream, err := proc.Start(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		var out string
		for stream.Receive() {
			out += string(stream.Msg().GetEvent().GetData().GetStdout())
		}
		if out != "hi\n" || stream.Err() != nil {
			t.Fatalf("Keepalive-Ping-Interval %s: %q, %v", v, out, stream.Err())
		}
	}
	// The server lives on.
	want(t, e.do("GET", "/v1/sandboxes/"+sb.ID, e.keyA, nil), http.StatusOK, "")
}

// TestStoredLimitsPastBounds: limits a database holds from before their
// bounds (or written to it directly) act as the largest values: a
// max_timeout of 2^63-1 s once refused every create (its nanoseconds
// wrapped negative) and a requests_per_minute of 2^63-1 answered a
// negative X-RateLimit-Remaining.
func TestStoredLimitsPastBounds(t *testing.T) {
	t.Parallel()
	e := newEnv(t, server.Config{})
	ctx := context.Background()
	_, key, err := auth.Create(ctx, e.store, auth.CreateOptions{Owner: "legacy"})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.store.SetAccountLimits(ctx, "legacy", []byte(`{"max_timeout":`+maxInt64+`,"requests_per_minute":`+maxInt64+
		`,"max_memory_mb":`+maxInt64+`,"max_disk_mb":`+maxInt64+`,"max_cpus":1e300}`)); err != nil {
		t.Fatal(err)
	}
	r := e.do("POST", "/v1/sandboxes", key, map[string]any{"timeout": 60})
	want(t, r, http.StatusCreated, "")
	rem, err := strconv.ParseInt(r.header.Get("X-RateLimit-Remaining"), 10, 64)
	if err != nil || rem < 0 || rem > bound.MaxRate {
		t.Fatalf("X-RateLimit-Remaining %q", r.header.Get("X-RateLimit-Remaining"))
	}
	if lim := r.header.Get("X-RateLimit-Limit"); lim != strconv.FormatInt(bound.MaxRate, 10) {
		t.Fatalf("X-RateLimit-Limit %q", lim)
	}
}

// TestProviderUsageCannotRaiseCredits: a provider's token counts
// (negative, not numbers, past int64) are not believed (internal/llm
// clamps them to [0, MaxCallTokens]), so a call's cost is never negative
// and never more than its largest: credits never rise from a call, and
// never fall past what the largest call costs.
func TestProviderUsageCannotRaiseCredits(t *testing.T) {
	t.Parallel()
	e, prov := newModelEnv(t, 0, false, server.Config{Accounts: account.Config{FreeCreditsMicros: 5_000_000, CreditsLowMicros: 1}})
	admin := e.adminKey()
	want(t, e.do("POST", "/v1/admin/accounts", admin, map[string]any{"name": "tokens"}), http.StatusCreated, "")
	r := e.do("POST", "/v1/admin/keys", admin, map[string]any{"account": "tokens"})
	want(t, r, http.StatusCreated, "")
	key := r.json(t)["key"].(string)
	balance := func() float64 {
		t.Helper()
		r := e.do("GET", "/v1/account/credits", key, nil)
		want(t, r, http.StatusOK, "")
		return r.json(t)["available_micros"].(float64) // the balance less the cost not yet in the ledger
	}
	const dearest = 2 * llm.MaxCallTokens * 2000 // "big" costs at most 2000 a token
	for _, raw := range []string{
		`{"prompt_tokens":-1000000000000,"completion_tokens":-9223372036854775808}`,
		`{"prompt_tokens":"NaN","completion_tokens":-1e300}`,
		`{"prompt_tokens":1e300,"completion_tokens":9223372036854775807}`,
	} {
		before := balance()
		prov.Push(llmtest.Reply{Content: "x", RawUsage: json.RawMessage(raw)})
		want(t, e.do("POST", "/v1/chat/completions", key, chatBody), http.StatusOK, "")
		after := balance()
		if after > before || before-after > dearest {
			t.Fatalf("usage %s moved the balance from %.0f to %.0f", raw, before, after)
		}
	}
}
