package server_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/server"
	"github.com/sheepfold/sheepfold/internal/store"
)

// storageOf reads GET /v1/account's storage.
func storageOf(t *testing.T, e *env, key string) (out struct {
	Records int64 `json:"records"`
	Bytes   int64 `json:"bytes"`
	Kinds   map[string]struct {
		Records    int64 `json:"records"`
		Bytes      int64 `json:"bytes"`
		MaxRecords int64 `json:"max_records"`
		MaxBytes   int64 `json:"max_bytes"`
	} `json:"kinds"`
}) {
	t.Helper()
	r := e.do("GET", "/v1/account", key, nil)
	want(t, r, http.StatusOK, "")
	var acct struct {
		Storage json.RawMessage `json:"storage"`
	}
	if err := json.Unmarshal(r.body, &acct); err != nil || json.Unmarshal(acct.Storage, &out) != nil {
		t.Fatalf("account %s", r.body)
	}
	return out
}

// TestAlertsAtTheirBound: an account that keeps as many alerts as it may,
// none acknowledged, gets 429 ERR_STORAGE_QUOTA_EXCEEDED for the next
// one, saying how to make room; acknowledging one makes room (the oldest
// acknowledged goes). Another account's room is its own. GET /v1/account
// shows what each keeps and its bounds; /metrics sums them by kind.
func TestAlertsAtTheirBound(t *testing.T) {
	t.Parallel()
	e := newEnv(t, server.Config{Storage: store.Bounds{Alerts: store.Amount{Records: 3}}})
	alert := func(key, msg string) resp {
		return e.do("POST", "/v1/alerts", key, map[string]any{"severity": "low", "message": msg})
	}
	var ids []string
	for range 3 {
		r := alert(e.keyA, "look")
		want(t, r, http.StatusCreated, "")
		ids = append(ids, r.json(t)["id"].(string))
	}
	r := alert(e.keyA, "one more")
	want(t, r, http.StatusTooManyRequests, "ERR_STORAGE_QUOTA_EXCEEDED")
	if msg := r.json(t)["error"].(map[string]any)["message"].(string); !strings.Contains(msg, "acknowledge") || !strings.Contains(msg, "3 records") {
		t.Fatalf("message %q", msg)
	}
	for range 3 {
		want(t, alert(e.keyB, "B's"), http.StatusCreated, "")
	}
	e.bus.Sync(context.Background()) // the alert.created events stored
	st := storageOf(t, e, e.keyA)
	al := st.Kinds[store.KindAlerts]
	if al.Records != 3 || al.MaxRecords != 3 || al.MaxBytes != server.DefaultStorage.Alerts.Bytes || al.Bytes < 3*store.RecordOverhead {
		t.Fatalf("A's alerts as /v1/account shows them: %+v", al)
	}
	if ev := st.Kinds[store.KindEvents]; ev.Records == 0 || ev.MaxRecords != server.DefaultStorage.Events.Records ||
		st.Records < al.Records+ev.Records || st.Bytes < al.Bytes+ev.Bytes {
		t.Fatalf("A's storage %+v", st)
	}

	want(t, e.do("POST", "/v1/alerts/"+ids[1]+"/ack", e.keyA, nil), http.StatusOK, "")
	want(t, alert(e.keyA, "now there is room"), http.StatusCreated, "")
	got := alertsOf(t, e, e.keyA, "")
	if len(got) != 3 {
		t.Fatalf("A keeps %d alerts", len(got))
	}
	for _, a := range got {
		if a["id"] == ids[1] {
			t.Fatalf("the acknowledged alert stayed: %v", got)
		}
	}
	fams := e.scrape(e.adminKey())
	if n := value(fams, "sheepfold_store_records", "kind", "alerts"); n != 6 {
		t.Fatalf("sheepfold_store_records{kind=alerts} = %v, want 6", n)
	}
	if n := value(fams, "sheepfold_store_bytes", "kind", "events"); n <= 0 {
		t.Fatalf("sheepfold_store_bytes{kind=events} = %v", n)
	}
}

// TestStoppedRetention: the executions of a stopped sandbox lose their
// code and output once StoppedRetention has passed (their records stay,
// small); those of a running sandbox keep theirs.
func TestStoppedRetention(t *testing.T) {
	t.Parallel()
	e := newEnv(t, server.Config{StoppedRetention: time.Millisecond, PruneInterval: 20 * time.Millisecond})
	stopped, running := e.create(e.keyA, nil), e.create(e.keyA, nil)
	for _, id := range []string{stopped, running} {
		want(t, e.do("POST", "/v1/sandboxes/"+id+"/execute", e.keyA, map[string]any{"code": "print('kept')"}), http.StatusOK, "")
	}
	history := func(id string) []map[string]any {
		r := e.do("GET", "/v1/sandboxes/"+id+"/executions", e.keyA, nil)
		want(t, r, http.StatusOK, "")
		var out []map[string]any
		for _, x := range r.json(t)["executions"].([]any) {
			out = append(out, x.(map[string]any))
		}
		return out
	}
	before := storageOf(t, e, e.keyA).Kinds[store.KindExecutions]
	want(t, e.do("DELETE", "/v1/sandboxes/"+stopped, e.keyA, nil), http.StatusNoContent, "")
	waitFor(t, "the stopped sandbox's output cleared", func() bool {
		h := history(stopped)
		return len(h) == 1 && h[0]["output"] == nil && h[0]["code"] == ""
	})
	if h := history(stopped); h[0]["status"] != "success" {
		t.Fatalf("the cleared record %v", h[0])
	}
	if h := history(running); len(h) != 1 || h[0]["output"] == nil || h[0]["code"] != "print('kept')" {
		t.Fatalf("a running sandbox's execution: %v", h)
	}
	after := storageOf(t, e, e.keyA).Kinds[store.KindExecutions]
	if after.Records != before.Records || after.Bytes >= before.Bytes {
		t.Fatalf("stored executions %+v, then %+v", before, after)
	}
}
