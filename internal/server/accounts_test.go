package server_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/account"
	"github.com/sheepfold/sheepfold/internal/auth"
	"github.com/sheepfold/sheepfold/internal/metering"
	"github.com/sheepfold/sheepfold/internal/sandbox"
	"github.com/sheepfold/sheepfold/internal/server"
	"github.com/sheepfold/sheepfold/internal/testutil"
)

// adminKey makes an admin key (of an account of its own).
func (e *env) adminKey() string {
	e.t.Helper()
	_, secret, err := auth.Create(context.Background(), e.store, auth.CreateOptions{Name: "admin", Admin: true})
	if err != nil {
		e.t.Fatal(err)
	}
	return secret
}

// wantMsg fails unless r is the error code with a message containing msg.
func wantMsg(t *testing.T, r resp, status int, code, msg string) {
	t.Helper()
	want(t, r, status, code)
	got := r.json(t)["error"].(map[string]any)["message"].(string)
	if !strings.Contains(got, msg) {
		t.Fatalf("message %q does not contain %q", got, msg)
	}
}

func TestAdminAccounts(t *testing.T) {
	e := newEnv(t, server.Config{})
	admin := e.adminKey()

	want(t, e.do("GET", "/v1/admin/accounts", e.keyA, nil), http.StatusForbidden, "ERR_FORBIDDEN")
	want(t, e.do("POST", "/v1/admin/accounts", e.keyA, map[string]any{"name": "x"}), http.StatusForbidden, "ERR_FORBIDDEN")

	// Bad values name their field.
	for _, c := range []struct {
		body any
		msg  string
	}{
		{map[string]any{}, "name is required"},
		{map[string]any{"name": "no spaces"}, "name is required"},
		{map[string]any{"name": "team", "limits": map[string]any{"max_sandboxes": -1}}, "limits.max_sandboxes must not be negative"},
		{map[string]any{"name": "team", "limits": map[string]any{"max_cpus": "two"}}, `"limits.max_cpus" must be a number`},
		{map[string]any{"name": "team", "limits": map[string]any{"max_lemons": 1}}, `unknown field "max_lemons"`},
	} {
		wantMsg(t, e.do("POST", "/v1/admin/accounts", admin, c.body), http.StatusBadRequest, "ERR_BAD_REQUEST", c.msg)
	}

	r := e.do("POST", "/v1/admin/accounts", admin, map[string]any{"name": "team", "limits": map[string]any{"max_sandboxes": 2}})
	want(t, r, http.StatusCreated, "")
	acct := r.json(t)
	if acct["name"] != "team" || acct["limits"].(map[string]any)["max_sandboxes"] != 2.0 || !strings.HasPrefix(acct["id"].(string), "acct_") {
		t.Fatalf("created %s", r.body)
	}
	want(t, e.do("POST", "/v1/admin/accounts", admin, map[string]any{"name": "team"}), http.StatusConflict, "ERR_CONFLICT")

	// Keys: an unknown account is a bad value of the field "account".
	wantMsg(t, e.do("POST", "/v1/admin/keys", admin, map[string]any{"account": "nope"}), http.StatusBadRequest, "ERR_BAD_REQUEST", `account "nope" does not exist`)
	wantMsg(t, e.do("POST", "/v1/admin/keys", admin, map[string]any{"account": "team", "admin": "yes"}), http.StatusBadRequest, "ERR_BAD_REQUEST", `"admin" must be a boolean`)
	r = e.do("POST", "/v1/admin/keys", admin, map[string]any{"account": "team", "name": "ci"})
	want(t, r, http.StatusCreated, "")
	key := r.json(t)["key"].(string)
	r = e.do("GET", "/v1/account", key, nil)
	want(t, r, http.StatusOK, "")
	if r.json(t)["name"] != "team" {
		t.Fatalf("the new key's account: %s", r.body)
	}
	want(t, e.do("GET", "/v1/admin/accounts/team", key, nil), http.StatusForbidden, "ERR_FORBIDDEN")

	// Limits: merged; null goes back to the default; bad values name the field.
	wantMsg(t, e.do("POST", "/v1/admin/accounts/team/limits", admin, map[string]any{"requests_per_minute": -3}),
		http.StatusBadRequest, "ERR_BAD_REQUEST", "requests_per_minute must not be negative")
	wantMsg(t, e.do("POST", "/v1/admin/accounts/team/limits", admin, `{"max_timeout": 1.5}`),
		http.StatusBadRequest, "ERR_BAD_REQUEST", `"max_timeout" must be a number`)
	want(t, e.do("POST", "/v1/admin/accounts/nope/limits", admin, map[string]any{"max_sandboxes": 1}), http.StatusNotFound, "ERR_NOT_FOUND")
	r = e.do("POST", "/v1/admin/accounts/team/limits", admin, map[string]any{"max_cpus": 0.5, "monthly_executions": 100})
	want(t, r, http.StatusOK, "")
	if o := r.json(t)["overrides"].(map[string]any); o["max_sandboxes"] != 2.0 || o["max_cpus"] != 0.5 || o["monthly_executions"] != 100.0 {
		t.Fatalf("merged overrides %s", r.body)
	}
	r = e.do("POST", "/v1/admin/accounts/team/limits", admin, `{"max_sandboxes": null}`)
	want(t, r, http.StatusOK, "")
	if _, ok := r.json(t)["overrides"].(map[string]any)["max_sandboxes"]; ok {
		t.Fatalf("null did not reset: %s", r.body)
	}

	// Credits: grants are ledger rows.
	wantMsg(t, e.do("POST", "/v1/admin/accounts/team/credits", admin, map[string]any{"amount": "lots"}), http.StatusBadRequest, "ERR_BAD_REQUEST", "amount must be")
	wantMsg(t, e.do("POST", "/v1/admin/accounts/team/credits", admin, map[string]any{"amount": 25}), http.StatusBadRequest, "ERR_BAD_REQUEST", `"amount" must be a string`)
	r = e.do("POST", "/v1/admin/accounts/team/credits", admin, map[string]any{"amount": "25.50", "reason": "pilot"})
	want(t, r, http.StatusOK, "")
	if c := r.json(t); c["balance"] != "25.500000" || c["granted_micros"] != 25.5e6 {
		t.Fatalf("credits %s", r.body)
	}

	r = e.do("GET", "/v1/admin/accounts/team", admin, nil)
	want(t, r, http.StatusOK, "")
	if keys := r.json(t)["keys"].([]any); len(keys) != 1 || keys[0].(map[string]any)["role"] != "user" {
		t.Fatalf("show: %s", r.body)
	}
	r = e.do("GET", "/v1/admin/accounts", admin, nil)
	want(t, r, http.StatusOK, "")
	if n := len(r.json(t)["accounts"].([]any)); n != 5 { // keyA, keyB, revoked, admin, team
		t.Fatalf("%d accounts: %s", n, r.body)
	}
}

func TestAccountLimitsEnforced(t *testing.T) {
	e := newEnv(t, server.Config{Accounts: account.Config{Defaults: account.Limits{MaxSandboxes: 1, MaxCPUs: 1, MaxTimeout: 600}}})
	admin := e.adminKey()
	id := e.create(e.keyA, nil)

	// Concurrent sandboxes.
	wantMsg(t, e.do("POST", "/v1/sandboxes", e.keyA, nil), http.StatusTooManyRequests, "ERR_SESSION_QUOTA_EXCEEDED", "concurrent sandbox limit of 1 reached")
	e.create(e.keyB, nil) // another account has its own
	want(t, e.do("DELETE", "/v1/sandboxes/"+id, e.keyA, nil), http.StatusNoContent, "")
	id = e.create(e.keyA, nil)

	// Resources and lifetime.
	wantMsg(t, e.do("POST", "/v1/sandboxes", e.keyB, map[string]any{"resources": map[string]any{"cpus": 2}}), http.StatusBadRequest, "ERR_BAD_REQUEST", "max_cpus of 1")
	wantMsg(t, e.do("POST", "/v1/sandboxes/"+id+"/timeout", e.keyA, map[string]any{"timeout": 601}), http.StatusBadRequest, "ERR_BAD_REQUEST", "max_timeout of 600 s")
	want(t, e.do("POST", "/v1/sandboxes/"+id+"/timeout", e.keyA, map[string]any{"timeout": 600}), http.StatusOK, "")

	// Executions per minute and the monthly executions quota.
	acct := e.do("GET", "/v1/account", e.keyA, nil).json(t)["id"].(string)
	want(t, e.do("POST", "/v1/admin/accounts/"+acct+"/limits", admin, map[string]any{"executions_per_minute": 2}), http.StatusOK, "")
	exec := func() resp {
		return e.do("POST", "/v1/sandboxes/"+id+"/execute", e.keyA, map[string]any{"code": "1+1"})
	}
	want(t, exec(), http.StatusOK, "")
	want(t, exec(), http.StatusOK, "")
	r := exec()
	wantMsg(t, r, http.StatusTooManyRequests, "ERR_RATE_LIMITED", "rate limit of 2 executions per minute reached")
	if r.header.Get("Retry-After") == "" {
		t.Fatal("no Retry-After")
	}
	want(t, e.do("POST", "/v1/admin/accounts/"+acct+"/limits", admin, map[string]any{"executions_per_minute": 0, "monthly_executions": 2}), http.StatusOK, "")
	// The meter counts executions in the background; the quota sees them
	// at once.
	wantMsg(t, exec(), http.StatusTooManyRequests, "ERR_SESSION_QUOTA_EXCEEDED", "monthly executions quota of 2 reached; it resets at "+account.NextMonth(time.Now()).Format(time.RFC3339))

	// Requests per minute, with the headers.
	want(t, e.do("POST", "/v1/admin/accounts/"+acct+"/limits", admin, map[string]any{"requests_per_minute": 3}), http.StatusOK, "")
	for i := 2; i >= 0; i-- {
		r := e.do("GET", "/v1/sandboxes", e.keyA, nil)
		want(t, r, http.StatusOK, "")
		if r.header.Get("X-RateLimit-Limit") != "3" || r.header.Get("X-RateLimit-Remaining") != fmt.Sprint(i) || r.header.Get("X-RateLimit-Reset") == "" {
			t.Fatalf("headers %v", r.header)
		}
	}
	r = e.do("GET", "/v1/sandboxes", e.keyA, nil)
	wantMsg(t, r, http.StatusTooManyRequests, "ERR_RATE_LIMITED", "rate limit of 3 requests per minute reached")
	if r.header.Get("Retry-After") == "" || r.header.Get("X-RateLimit-Remaining") != "0" {
		t.Fatalf("429 headers %v", r.header)
	}
	want(t, e.do("GET", "/v1/sandboxes", e.keyB, nil), http.StatusOK, "") // another account's budget
}

// TestAccountHammer: 8 clients of one account create, use and delete
// sandboxes as fast as they can for 20 s. The engine never holds more
// sandboxes of the account than its cap, and the requests the rate limit
// let through never exceed the bucket: a minute's worth at the start plus
// the refill over the run.
func TestAccountHammer(t *testing.T) {
	if testutil.Race {
		t.Skip("measures admission throughput; the race detector distorts it (make test also runs it without -race)")
	}
	const capN, rpm = 3, 600
	e := newEnv(t, server.Config{Accounts: account.Config{Defaults: account.Limits{MaxSandboxes: capN, RequestsPerMinute: rpm}}})
	var admitted, refused, capHits atomic.Int64
	var most atomic.Int64
	stop := make(chan struct{})
	monitorDone := make(chan struct{})
	go func() { // the engine's own view of live sandboxes
		defer close(monitorDone)
		for {
			select {
			case <-stop:
				return
			default:
			}
			n := int64(0)
			for _, in := range e.engine.List() {
				if in.State == sandbox.StateRunning || in.State == sandbox.StateStarting {
					n++
				}
			}
			for {
				m := most.Load()
				if n <= m || most.CompareAndSwap(m, n) {
					break
				}
			}
			time.Sleep(time.Millisecond) // a polling period, not synchronisation
		}
	}()
	client := &http.Client{}
	call := func(method, path string) (int, string) {
		req, _ := http.NewRequest(method, e.url+path, nil)
		req.Header.Set("Authorization", "Bearer "+e.keyA)
		res, err := client.Do(req)
		if err != nil {
			t.Error(err)
			return 0, ""
		}
		defer res.Body.Close()
		var b strings.Builder
		fmt.Fprint(&b, res.Header.Get("Content-Type"))
		buf := make([]byte, 4096)
		n, _ := res.Body.Read(buf)
		body := string(buf[:n])
		if strings.Contains(body, "ERR_RATE_LIMITED") {
			refused.Add(1)
		} else {
			admitted.Add(1)
		}
		if strings.Contains(body, "concurrent sandbox limit of 3 reached") {
			capHits.Add(1)
		}
		return res.StatusCode, body
	}
	start := time.Now()
	deadline := start.Add(20 * time.Second)
	var wg sync.WaitGroup
	var ids sync.Map
	for c := 0; c < 8; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(deadline) {
				st, body := call("POST", "/v1/sandboxes")
				if st != http.StatusCreated {
					continue
				}
				id := body[strings.Index(body, `"id":"`)+6:]
				id = id[:strings.IndexByte(id, '"')]
				ids.Store(id, true)
				call("GET", "/v1/sandboxes/"+id)
				for time.Now().Before(deadline.Add(10 * time.Second)) {
					if st, _ := call("DELETE", "/v1/sandboxes/"+id); st == http.StatusNoContent {
						ids.Delete(id)
						break
					}
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	close(stop)
	<-monitorDone
	limit := int64(rpm + rpm*elapsed.Seconds()/60)
	t.Logf("%s: %d admitted (bound %d), %d rate-limited, %d at the sandbox cap, at most %d live", elapsed.Round(time.Millisecond),
		admitted.Load(), limit, refused.Load(), capHits.Load(), most.Load())
	if most.Load() > capN {
		t.Fatalf("%d sandboxes of the account ran at once; the cap is %d", most.Load(), capN)
	}
	if admitted.Load() > limit {
		t.Fatalf("%d requests admitted in %s; the bucket allows %d", admitted.Load(), elapsed, limit)
	}
	if admitted.Load() < limit*9/10 || refused.Load() == 0 || capHits.Load() == 0 || most.Load() != capN {
		t.Fatalf("the hammer did not reach both limits: admitted %d of %d, refused %d, cap hits %d, most %d",
			admitted.Load(), limit, refused.Load(), capHits.Load(), most.Load())
	}
	ids.Range(func(k, _ any) bool { t.Errorf("sandbox %s was never deleted", k); return true })

	// No lost updates: the account's total equals the sum of its
	// sandboxes' figures.
	get := func(path string) map[string]any {
		for {
			r := e.do("GET", path, e.keyA, nil)
			if r.status != http.StatusTooManyRequests {
				want(t, r, http.StatusOK, "")
				return r.json(t)
			}
			d, _ := time.ParseDuration(r.header.Get("Retry-After") + "s")
			time.Sleep(d) // the server's own instruction
		}
	}
	bySandbox := get("/v1/account/usage?group_by=sandbox")
	total := get("/v1/account/usage?group_by=day")["total"].(map[string]any)
	var wall, gb float64
	groups := bySandbox["groups"].([]any)
	for _, g := range groups {
		wall += g.(map[string]any)["sandbox_seconds"].(float64)
		gb += g.(map[string]any)["gb_seconds_reserved"].(float64)
	}
	if len(groups) < capN || !near(wall, total["sandbox_seconds"].(float64), 1e-6) || !near(gb, total["gb_seconds_reserved"].(float64), 1e-6) {
		t.Fatalf("%d sandboxes sum to %g s and %g GB-s; the account's total is %v", len(groups), wall, gb, total)
	}
	t.Logf("%d sandboxes metered, %.1f sandbox-seconds", len(groups), wall)
}

// TestAccountLimitsE2B: the E2B surface enforces the same limits, with
// E2B's error body (a numeric code and a message).
func TestAccountLimitsE2B(t *testing.T) {
	e := newEnv(t, server.Config{Accounts: account.Config{Defaults: account.Limits{MaxSandboxes: 1, RequestsPerMinute: 4}}})
	post := func() resp {
		return e.do("POST", "/sandboxes", "", map[string]any{"templateID": "base"}, "X-API-Key", e.keyA)
	}
	want(t, post(), http.StatusCreated, "")
	r := post()
	if r.status != http.StatusTooManyRequests {
		t.Fatalf("second sandbox: %d %s", r.status, r.body)
	}
	if b := r.json(t); b["code"] != 429.0 || b["message"] != "concurrent sandbox limit of 1 reached" {
		t.Fatalf("E2B body %s", r.body)
	}
	want(t, e.do("GET", "/sandboxes", "", nil, "X-API-Key", e.keyA), http.StatusOK, "")
	want(t, e.do("GET", "/sandboxes", "", nil, "X-API-Key", e.keyA), http.StatusOK, "")
	r = e.do("GET", "/sandboxes", "", nil, "X-API-Key", e.keyA)
	if b := r.json(t); r.status != http.StatusTooManyRequests || b["code"] != 429.0 || !strings.Contains(b["message"].(string), "rate limit of 4 requests per minute") || r.header.Get("Retry-After") == "" {
		t.Fatalf("rate limited E2B call: %d %s %v", r.status, r.body, r.header)
	}
}

// TestAccountLimitsFromDatabase: limits the CLI writes to the database
// (not through the API) reach a running server at its next flush.
func TestAccountLimitsFromDatabase(t *testing.T) {
	e := newEnv(t, server.Config{Metering: metering.Config{SampleInterval: 20 * time.Millisecond, FlushInterval: 50 * time.Millisecond}})
	acct := e.do("GET", "/v1/account", e.keyA, nil).json(t)["id"].(string) // loads the account
	if err := e.store.SetAccountLimits(context.Background(), acct, []byte(`{"requests_per_minute":2}`)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the new limit", func() bool {
		return e.do("GET", "/v1/sandboxes", e.keyA, nil).header.Get("X-RateLimit-Limit") == "2"
	})
}
