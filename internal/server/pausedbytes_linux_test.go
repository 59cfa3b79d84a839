package server_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/account"
	"github.com/sheepfold/sheepfold/internal/metering"
	"github.com/sheepfold/sheepfold/internal/server"
)

// TestPausedBytesBound: the attack is an account that parks sandboxes
// paused on the server's disk without end. Past --max-paused-mb-per-account
// a pause is refused with ERR_STORAGE_QUOTA_EXCEEDED and the sandbox runs
// on with its variable (a sandbox holds at least its Python's memory,
// more than the 1 MiB bound). The control: with room (4 GiB) the same
// pause goes through, and while paused the sandbox's checkpoint and disk
// are metered as paused_gb_seconds in the usage report, per sandbox and
// in the total.
func TestPausedBytesBound(t *testing.T) {
	for _, tc := range []struct {
		name  string
		bound int64
		ok    bool
	}{{"bounded", 1 << 20, false}, {"room", 4 << 30, true}} {
		t.Run(tc.name, func(t *testing.T) {
			e := runcEnvWith(t, server.Config{MaxPausedBytesPerAccount: tc.bound,
				Metering: metering.Config{SampleInterval: 50 * time.Millisecond, FlushInterval: 100 * time.Millisecond}})
			id := e.create(e.keyA, map[string]any{})
			want(t, e.do("POST", "/v1/sandboxes/"+id+"/execute", e.keyA, map[string]any{"code": "x = 6 * 7"}), http.StatusOK, "")
			r := e.do("POST", "/v1/sandboxes/"+id+"/pause", e.keyA, nil)
			if !tc.ok {
				wantMsg(t, r, http.StatusTooManyRequests, "ERR_STORAGE_QUOTA_EXCEEDED", "max-paused-mb-per-account")
				if st := e.do("GET", "/v1/sandboxes/"+id, e.keyA, nil).json(t)["state"]; st != "running" {
					t.Fatalf("after a refused pause the sandbox is %v", st)
				}
				r := e.do("POST", "/v1/sandboxes/"+id+"/execute", e.keyA, map[string]any{"code": "print(x)"})
				if want(t, r, http.StatusOK, ""); r.json(t)["stdout"] != "42\n" {
					t.Fatalf("after a refused pause: %s", r.body)
				}
				return
			}
			want(t, r, http.StatusOK, "")
			paused := func() (sandbox, total float64) {
				rep := e.do("GET", "/v1/account/usage?group_by=sandbox", e.keyA, nil).json(t)
				for _, g := range rep["groups"].([]any) {
					if g := g.(map[string]any); g["sandbox_id"] == id {
						sandbox, _ = g["paused_gb_seconds"].(float64)
					}
				}
				total, _ = rep["total"].(map[string]any)["paused_gb_seconds"].(float64)
				return sandbox, total
			}
			waitFor(t, "paused storage in the usage report", func() bool { sb, tot := paused(); return sb > 0 && tot >= sb })
			// A running sandbox adds none.
			r = e.do("POST", "/v1/sandboxes/"+id+"/execute", e.keyA, map[string]any{"code": "print(x)"})
			if want(t, r, http.StatusOK, ""); r.json(t)["stdout"] != "42\n" {
				t.Fatalf("after the resume: %s", r.body)
			}
		})
	}
}

// TestResumeRefusedNoCredits: a paused sandbox of an account whose
// credits are used up is not resumed (429 ERR_SESSION_QUOTA_EXCEEDED,
// "stays paused"), neither by resume nor by an execution, and stays
// paused with its checkpoint; credits granted again, it resumes with its
// variable. The control is the resume after the grant.
func TestResumeRefusedNoCredits(t *testing.T) {
	e := runcEnvWith(t, server.Config{Accounts: account.Config{EnforceCredits: true, CreditsGrace: time.Hour, FreeCreditsMicros: 1_000_000}})
	admin := e.adminKey()
	want(t, e.do("POST", "/v1/admin/accounts", admin, map[string]any{"name": "team"}), http.StatusCreated, "")
	key := e.do("POST", "/v1/admin/keys", admin, map[string]any{"account": "team"}).json(t)["key"].(string)
	id := e.create(key, nil)
	want(t, e.do("POST", "/v1/sandboxes/"+id+"/execute", key, map[string]any{"code": "x = 6 * 7"}), http.StatusOK, "")
	want(t, e.do("POST", "/v1/sandboxes/"+id+"/pause", key, nil), http.StatusOK, "")
	want(t, e.do("POST", "/v1/admin/accounts/team/credits", admin, map[string]any{"amount": "-1.00"}), http.StatusOK, "")
	wantMsg(t, e.do("POST", "/v1/sandboxes/"+id+"/resume", key, nil), http.StatusTooManyRequests, "ERR_SESSION_QUOTA_EXCEEDED", "stays paused")
	wantMsg(t, e.do("POST", "/v1/sandboxes/"+id+"/execute", key, map[string]any{"code": "print(x)"}), http.StatusTooManyRequests, "ERR_SESSION_QUOTA_EXCEEDED", "stays paused")
	if st := e.do("GET", "/v1/sandboxes/"+id, key, nil).json(t)["state"]; st != "paused" {
		t.Fatalf("after a refused resume the sandbox is %v", st)
	}
	want(t, e.do("POST", "/v1/admin/accounts/team/credits", admin, map[string]any{"amount": "1.00"}), http.StatusOK, "")
	r := e.do("POST", "/v1/sandboxes/"+id+"/execute", key, map[string]any{"code": "print(x)"})
	if want(t, r, http.StatusOK, ""); r.json(t)["stdout"] != "42\n" {
		t.Fatalf("after the grant: %s", r.body)
	}
}
