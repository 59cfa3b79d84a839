package server_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/account"
	"github.com/sheepfold/sheepfold/internal/events"
	"github.com/sheepfold/sheepfold/internal/metering"
	"github.com/sheepfold/sheepfold/internal/sandbox"
	"github.com/sheepfold/sheepfold/internal/server"
)

// waitFor polls cond (the meter and the bus work in the background) until
// it holds or 10 s pass.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// waitFlushes waits until each server has finished n more metering
// flushes (each followed by the alert rules).
func waitFlushes(t *testing.T, n int64, envs ...*env) {
	t.Helper()
	for _, e := range envs {
		target := e.srv.MeterFlushes() + n
		waitFor(t, fmt.Sprintf("%d more metering flushes", n), func() bool { return e.srv.MeterFlushes() >= target })
	}
}

func alertsOf(t *testing.T, e *env, key, query string) []map[string]any {
	t.Helper()
	r := e.do("GET", "/v1/alerts"+query, key, nil)
	want(t, r, http.StatusOK, "")
	var out []map[string]any
	for _, a := range r.json(t)["alerts"].([]any) {
		out = append(out, a.(map[string]any))
	}
	return out
}

func TestAlerts(t *testing.T) {
	fast := metering.Config{SampleInterval: 20 * time.Millisecond, FlushInterval: 50 * time.Millisecond}
	e := newEnv(t, server.Config{Metering: fast, Accounts: account.Config{Defaults: account.Limits{MonthlyExecutions: 5}, SecurityAlertSeverity: "high"}})

	// Manual alerts; bad values name their field.
	for body, msg := range map[string]string{
		`{"message":"x"}`:                                      "severity must be",
		`{"severity":"dire","message":"x"}`:                    "severity must be",
		`{"severity":"low"}`:                                   "message is required",
		`{"severity":"low","message":"x","extra":1}`:           `unknown field "extra"`,
		`{"severity":"low","message":"x","sandbox_id":7}`:      `"sandbox_id" must be a string`,
		`{"severity":"low","message":"x","sandbox_id":"nope"}`: `sandbox_id "nope" is not a sandbox of this account`,
	} {
		wantMsg(t, e.do("POST", "/v1/alerts", e.keyA, body), http.StatusBadRequest, "ERR_BAD_REQUEST", msg)
	}
	id := e.create(e.keyA, nil)
	r := e.do("POST", "/v1/alerts", e.keyA, map[string]any{"severity": "critical", "message": "the agent went rogue", "sandbox_id": id, "session_id": "s1"})
	want(t, r, http.StatusCreated, "")
	al := r.json(t)
	if al["acknowledged"] != false || al["kind"] != "manual" || al["sandbox_id"] != id {
		t.Fatalf("created %s", r.body)
	}
	wantMsg(t, e.do("POST", "/v1/alerts", e.keyB, map[string]any{"severity": "low", "message": "x", "sandbox_id": id}),
		http.StatusBadRequest, "ERR_BAD_REQUEST", "is not a sandbox of this account")
	want(t, e.do("POST", "/v1/alerts/"+al["id"].(string)+"/ack", e.keyB, nil), http.StatusNotFound, "ERR_NOT_FOUND")
	r = e.do("POST", "/v1/alerts/"+al["id"].(string)+"/ack", e.keyA, nil)
	want(t, r, http.StatusOK, "")
	if r.json(t)["acknowledged"] != true {
		t.Fatalf("ack %s", r.body)
	}
	if l := alertsOf(t, e, e.keyA, "?unacknowledged=true"); len(l) != 0 {
		t.Fatalf("unacknowledged after ack: %v", l)
	}
	wantMsg(t, e.do("GET", "/v1/alerts?unacknowledged=maybe", e.keyA, nil), http.StatusBadRequest, "ERR_BAD_REQUEST", "unacknowledged must be")
	if l := alertsOf(t, e, e.keyB, ""); len(l) != 0 {
		t.Fatalf("another account's alerts: %v", l)
	}

	// Quota rules: 4 of 5 executions is 80 %, 5 is 100 %; each once.
	for i := 0; i < 4; i++ {
		want(t, e.do("POST", "/v1/sandboxes/"+id+"/execute", e.keyA, map[string]any{"code": "1"}), http.StatusOK, "")
	}
	quota := func(pct string) int {
		n := 0
		for _, a := range alertsOf(t, e, e.keyA, "") {
			if a["kind"] == "quota" && strings.HasPrefix(a["message"].(string), pct+" % of the monthly executions quota") {
				n++
			}
		}
		return n
	}
	waitFor(t, "the 80 % alert", func() bool { return quota("80") == 1 })
	want(t, e.do("POST", "/v1/sandboxes/"+id+"/execute", e.keyA, map[string]any{"code": "1"}), http.StatusOK, "")
	waitFor(t, "the 100 % alert", func() bool { return quota("100") == 1 })
	// Several more flushes, each checking the rules: still one of each.
	waitFlushes(t, 3, e)
	if quota("80") != 1 || quota("100") != 1 {
		t.Fatalf("quota alerts repeated: %v", alertsOf(t, e, e.keyA, ""))
	}

	// Security violations at or above "high" become alerts, lower ones not.
	acct := e.do("GET", "/v1/account", e.keyA, nil).json(t)["id"].(string)
	e.srv.Events().Emit(events.Event{Type: events.SecurityViolation, SandboxID: id, Owner: acct,
		Details: map[string]any{"kind": events.KindModuleBlocked, "target": "socket"}})
	e.srv.Events().Emit(events.Event{Type: events.SecurityViolation, SandboxID: id, Owner: acct,
		Details: map[string]any{"kind": events.KindSubprocessDenied, "target": "/bin/sh"}})
	waitFor(t, "the security alert", func() bool {
		for _, a := range alertsOf(t, e, e.keyA, "") {
			if a["kind"] == "security_violation" {
				return strings.Contains(a["message"].(string), "subprocess_denied /bin/sh") && a["severity"] == "high"
			}
		}
		return false
	})
	n := 0
	for _, a := range alertsOf(t, e, e.keyA, "") {
		if a["kind"] == "security_violation" {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("%d security alerts; only the high one should be", n)
	}
}

// TestCredits: metered cost is deducted as it accrues; at zero new
// sandboxes and executions are refused, running sandboxes stop after the
// grace period, and the balance always equals the ledger's sum.
func TestCredits(t *testing.T) {
	urt := &usageRuntime{cpu: map[string]uint64{}}
	prices := metering.Prices{CPUSecond: 1_000_000} // a unit per CPU-second
	e := newEnv(t, server.Config{
		Metering: metering.Config{SampleInterval: 20 * time.Millisecond, FlushInterval: 50 * time.Millisecond, Prices: &prices},
		Accounts: account.Config{EnforceCredits: true, CreditsGrace: 300 * time.Millisecond, FreeCreditsMicros: 2_000_000},
	}, func(c *sandbox.Config) { urt.Runtime = c.Runtime; c.Runtime = urt })
	admin := e.adminKey()
	r := e.do("POST", "/v1/admin/accounts", admin, map[string]any{"name": "team"})
	want(t, r, http.StatusCreated, "")
	if c := r.json(t)["credits"].(map[string]any); c["free_micros"] != 2e6 || c["balance_micros"] != 2e6 {
		t.Fatalf("free credits of a new account: %v", c)
	}
	key := e.do("POST", "/v1/admin/keys", admin, map[string]any{"account": "team"}).json(t)["key"].(string)
	id := e.create(key, nil)
	urt.set(id, 1_500_000_000) // 1.5 units
	credits := func() map[string]any {
		r := e.do("GET", "/v1/account/credits", key, nil)
		want(t, r, http.StatusOK, "")
		return r.json(t)
	}
	waitFor(t, "the cost in the ledger", func() bool { return credits()["spent_micros"] == 1.5e6 })
	c := credits()
	if c["balance"] != "0.500000" || c["free_left_micros"] != 0.5e6 || c["enforced"] != true {
		t.Fatalf("after 1.5 CPU-seconds: %v", c)
	}
	urt.set(id, 2_500_000_000) // past the balance
	waitFor(t, "exhaustion", func() bool { return credits()["available_micros"].(float64) <= 0 })
	wantMsg(t, e.do("POST", "/v1/sandboxes", key, nil), http.StatusTooManyRequests, "ERR_SESSION_QUOTA_EXCEEDED", "credits exhausted")
	// The running sandbox stops after the grace period.
	waitFor(t, "the sandbox to stop", func() bool {
		r := e.do("GET", "/v1/sandboxes/"+id, key, nil)
		return r.status == http.StatusOK && r.json(t)["stop_reason"] == "credits exhausted"
	})
	waitFor(t, "the credits alert", func() bool {
		for _, a := range alertsOf(t, e, key, "") {
			if a["kind"] == "credits" && a["severity"] == "critical" {
				return true
			}
		}
		return false
	})
	// A grant brings the account back.
	want(t, e.do("POST", "/v1/admin/accounts/team/credits", admin, map[string]any{"amount": "10"}), http.StatusOK, "")
	e.create(key, nil)

	// The balance is the ledger's sum.
	acct := e.do("GET", "/v1/account", key, nil).json(t)["id"].(string)
	ct, err := e.store.CreditTotals(context.Background(), acct)
	if err != nil {
		t.Fatal(err)
	}
	c = credits()
	if c["balance_micros"] != float64(ct.Balance()) || ct.Balance() != 2e6+10e6-2.5e6 {
		t.Fatalf("balance %v, ledger %+v (sum %d)", c["balance_micros"], ct, ct.Balance())
	}
}
