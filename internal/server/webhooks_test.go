package server_test

import (
	"context"
	"crypto/hmac"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/server"
	"github.com/sheepfold/sheepfold/internal/webhooks"
)

// receiver is a loopback webhook receiver that fails its first fail
// requests with 500.
type receiver struct {
	*httptest.Server
	mu   sync.Mutex
	fail int
	ch   chan received
}

type received struct {
	header http.Header
	body   []byte
	event  map[string]any
}

func newReceiver(t *testing.T, fail int) *receiver {
	rc := &receiver{fail: fail, ch: make(chan received, 100)}
	rc.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		rc.mu.Lock()
		failing := rc.fail > 0
		if failing {
			rc.fail--
		}
		rc.mu.Unlock()
		if failing {
			http.Error(w, "not now", http.StatusInternalServerError)
			return
		}
		rv := received{header: r.Header.Clone(), body: body}
		json.Unmarshal(body, &rv.event)
		rc.ch <- rv
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(rc.Close)
	return rc
}

func (rc *receiver) next(t *testing.T) received {
	t.Helper()
	select {
	case rv := <-rc.ch:
		return rv
	case <-time.After(10 * time.Second):
		t.Fatal("no webhook delivery within 10s")
	}
	return received{}
}

func TestWebhooks(t *testing.T) {
	t.Parallel()
	e := newEnv(t, server.Config{WebhookRetryBase: 10 * time.Millisecond, WebhookMaxAttempts: 4,
		WebhookTimeout: 200 * time.Millisecond, WebhookAllowCIDRs: []string{"127.0.0.0/8"}})
	rc := newReceiver(t, 2) // the first two attempts fail: the third succeeds
	r := e.do("POST", "/v1/webhooks", e.keyA, map[string]any{"url": rc.URL + "/hook", "types": []string{"sandbox.created", "sandbox.stopped"}})
	want(t, r, http.StatusCreated, "")
	hook := r.json(t)
	hookID, secret := hook["id"].(string), hook["secret"].(string)
	if hookID == "" || len(secret) < 32 {
		t.Fatalf("created webhook %s", r.body)
	}
	// The secret is shown once: never in the listing.
	r = e.do("GET", "/v1/webhooks", e.keyA, nil)
	want(t, r, http.StatusOK, "")
	var list struct{ Webhooks []map[string]any }
	json.Unmarshal(r.body, &list)
	if len(list.Webhooks) != 1 || list.Webhooks[0]["id"] != hookID || list.Webhooks[0]["secret"] != nil {
		t.Fatalf("listing %s", r.body)
	}
	if r = e.do("GET", "/v1/webhooks", e.keyB, nil); string(r.body) != "{\"webhooks\":[]}\n" {
		t.Fatalf("owner B's listing %s", r.body)
	}

	id := e.create(e.keyA, nil)
	e.create(e.keyB, nil) // another owner's: never delivered here
	first := rc.next(t)   // after two failed attempts
	want(t, e.do("POST", "/v1/sandboxes/"+id+"/execute", e.keyA, map[string]any{"code": "1+1"}), http.StatusOK, "")
	want(t, e.do("DELETE", "/v1/sandboxes/"+id, e.keyA, nil), http.StatusNoContent, "")
	second := rc.next(t)
	for i, rv := range []received{first, second} {
		ts := rv.header.Get("Sheepfold-Timestamp")
		sec, err := strconv.ParseInt(ts, 10, 64)
		if err != nil || time.Since(time.Unix(sec, 0)) > time.Minute {
			t.Fatalf("delivery %d timestamp %q", i, ts)
		}
		sig := rv.header.Get("Sheepfold-Signature")
		if !hmac.Equal([]byte(sig), []byte(webhooks.Sign(secret, ts, rv.body))) {
			t.Fatalf("delivery %d signature %q does not check", i, sig)
		}
		if webhooks.Sign("another secret", ts, rv.body) == sig || webhooks.Sign(secret, ts, append(rv.body, ' ')) == sig {
			t.Fatal("the signature does not depend on the secret and body")
		}
		if rv.event["sandbox_id"] != id || rv.header.Get("Sheepfold-Event-Type") != rv.event["type"] ||
			rv.header.Get("Sheepfold-Event-Id") != strconv.FormatFloat(rv.event["id"].(float64), 'f', -1, 64) ||
			rv.header.Get("Sheepfold-Webhook-Id") != hookID {
			t.Fatalf("delivery %d: headers %v, event %v", i, rv.header, rv.event)
		}
	}
	if first.event["type"] != "sandbox.created" || second.event["type"] != "sandbox.stopped" {
		t.Fatalf("delivered %v then %v, want only the two subscribed types", first.event["type"], second.event["type"])
	}

	// The delivery log: the created event failed twice, then went; the
	// stopped one went at once. Failures say no more than that (the
	// receiver's 500 is the operator's to see).
	// (An attempt is logged after its answer: wait for the last one.)
	var log struct {
		Deliveries []map[string]any
		NextCursor *string `json:"next_cursor"`
	}
	for deadline := time.Now().Add(10 * time.Second); len(log.Deliveries) < 4 && time.Now().Before(deadline); {
		r = e.do("GET", "/v1/webhooks/"+hookID+"/deliveries", e.keyA, nil)
		want(t, r, http.StatusOK, "")
		json.Unmarshal(r.body, &log)
	}
	var got []string
	for _, d := range log.Deliveries {
		got = append(got, d["event_type"].(string)+"#"+strconv.Itoa(int(d["attempt"].(float64)))+":"+
			strconv.Itoa(int(d["status_code"].(float64)))+":"+strconv.FormatBool(d["succeeded"].(bool)))
	}
	want1 := "sandbox.created#1:0:false sandbox.created#2:0:false sandbox.created#3:204:true sandbox.stopped#1:204:true"
	if joined := join(got); joined != want1 {
		t.Fatalf("delivery log %s\nwant %s", joined, want1)
	}
	r = e.do("GET", "/v1/webhooks/"+hookID+"/deliveries?limit=3", e.keyA, nil)
	json.Unmarshal(r.body, &log)
	if len(log.Deliveries) != 3 || log.NextCursor == nil {
		t.Fatalf("first page %s", r.body)
	}
	r = e.do("GET", "/v1/webhooks/"+hookID+"/deliveries?cursor="+*log.NextCursor, e.keyA, nil)
	json.Unmarshal(r.body, &log)
	if len(log.Deliveries) != 1 || log.NextCursor != nil {
		t.Fatalf("second page %s", r.body)
	}

	// Another owner cannot see or delete it.
	want(t, e.do("GET", "/v1/webhooks/"+hookID+"/deliveries", e.keyB, nil), http.StatusNotFound, "ERR_NOT_FOUND")
	want(t, e.do("DELETE", "/v1/webhooks/"+hookID, e.keyB, nil), http.StatusNotFound, "ERR_NOT_FOUND")
	want(t, e.do("DELETE", "/v1/webhooks/"+hookID, e.keyA, nil), http.StatusNoContent, "")
	want(t, e.do("DELETE", "/v1/webhooks/"+hookID, e.keyA, nil), http.StatusNotFound, "ERR_NOT_FOUND")
	e.create(e.keyA, nil)
	select {
	case rv := <-rc.ch:
		t.Fatalf("a deleted webhook got %v", rv.event)
	case <-time.After(300 * time.Millisecond): // nothing may come: waiting is the point
	}
}

func join(l []string) string {
	out := ""
	for i, s := range l {
		if i > 0 {
			out += " "
		}
		out += s
	}
	return out
}

func TestWebhookValidation(t *testing.T) {
	t.Parallel()
	e := newEnv(t, server.Config{})
	for _, body := range []any{
		map[string]any{"url": ""},
		map[string]any{"url": "ftp://example.com/x"},
		map[string]any{"url": "/relative"},
		map[string]any{"url": "http://user:pw@203.0.113.1/x"},
		map[string]any{"url": "http://203.0.113.1/x", "types": []string{"nope"}},
		map[string]any{"url": "http://203.0.113.1/x", "extra": 1},
		// The cloud metadata service and the rest of link-local, in every spelling.
		map[string]any{"url": "http://169.254.169.254/latest/meta-data/"},
		map[string]any{"url": "http://169.254.1.1:8080/"},
		map[string]any{"url": "http://[::ffff:169.254.169.254]/"},
		map[string]any{"url": "http://[fe80::1]/"},
		map[string]any{"url": "http://0.0.0.0/"},
		map[string]any{"url": "http://[fd00:ec2::254]/"},
		// Loopback, private and carrier-grade NAT: not by default.
		map[string]any{"url": "http://127.0.0.1:9/x"},
		map[string]any{"url": "http://localhost:9/x"},
		map[string]any{"url": "http://[::1]:9/x"},
		map[string]any{"url": "http://10.1.2.3/x"},
		map[string]any{"url": "http://192.168.0.1/x"},
		map[string]any{"url": "http://100.100.100.200/x"},
	} {
		want(t, e.do("POST", "/v1/webhooks", e.keyA, body), http.StatusBadRequest, "ERR_BAD_REQUEST")
	}
	// A public address, and a name (judged where it is dialled).
	want(t, e.do("POST", "/v1/webhooks", e.keyA, map[string]any{"url": "http://203.0.113.1/x"}), http.StatusCreated, "")
	want(t, e.do("POST", "/v1/webhooks", e.keyA, map[string]any{"url": "https://hooks.example.com/x"}), http.StatusCreated, "")

	// The operator's ranges admit loopback; metadata stays refused.
	e1 := newEnv(t, server.Config{WebhookAllowCIDRs: []string{"127.0.0.0/8", "169.254.0.0/16"}})
	want(t, e1.do("POST", "/v1/webhooks", e1.keyA, map[string]any{"url": "http://127.0.0.1:9/x"}), http.StatusCreated, "")
	want(t, e1.do("POST", "/v1/webhooks", e1.keyA, map[string]any{"url": "http://169.254.169.254/x"}), http.StatusBadRequest, "ERR_BAD_REQUEST")
	want(t, e1.do("POST", "/v1/webhooks", e1.keyA, map[string]any{"url": "http://10.1.2.3/x"}), http.StatusBadRequest, "ERR_BAD_REQUEST")

	// An operator's allowlist admits only what it names; its CIDRs are
	// allowed ranges.
	e2 := newEnv(t, server.Config{WebhookAllowHosts: []string{"hooks.example.com", "10.0.0.0/8"}})
	want(t, e2.do("POST", "/v1/webhooks", e2.keyA, map[string]any{"url": "http://127.0.0.1:9/x"}), http.StatusBadRequest, "ERR_BAD_REQUEST")
	want(t, e2.do("POST", "/v1/webhooks", e2.keyA, map[string]any{"url": "http://203.0.113.1/x"}), http.StatusBadRequest, "ERR_BAD_REQUEST")
	want(t, e2.do("POST", "/v1/webhooks", e2.keyA, map[string]any{"url": "http://10.1.2.3/x"}), http.StatusCreated, "")
	want(t, e2.do("POST", "/v1/webhooks", e2.keyA, map[string]any{"url": "https://hooks.example.com/x"}), http.StatusCreated, "")
}

// deliveryLog waits until a webhook's log has n records and returns them.
func (e *env) deliveryLog(t *testing.T, key, hookID string, n int) []map[string]any {
	t.Helper()
	var log struct{ Deliveries []map[string]any }
	for deadline := time.Now().Add(10 * time.Second); len(log.Deliveries) < n; {
		if time.Now().After(deadline) {
			t.Fatalf("webhook %s logged %v, want %d records", hookID, log.Deliveries, n)
		}
		r := e.do("GET", "/v1/webhooks/"+hookID+"/deliveries", key, nil)
		want(t, r, http.StatusOK, "")
		json.Unmarshal(r.body, &log)
	}
	return log.Deliveries
}

// TestWebhookReportsOnlyDelivered: the attack maps the server's host
// through the delivery log, registering hooks to its ports (the operator
// allows loopback here, as for a receiver on the same host): one port is
// closed, one answers 401, one hangs. The remotes behave differently (the
// control: the 401 one and the hanging one got the request, the closed
// one could not), yet the tenant reads the same record of each, and each
// record appears only once the attempt's whole timeout has passed.
func TestWebhookReportsOnlyDelivered(t *testing.T) {
	t.Parallel()
	const timeout = 400 * time.Millisecond
	e := newEnv(t, server.Config{WebhookAllowCIDRs: []string{"127.0.0.0/8"}, WebhookMaxAttempts: 1, WebhookTimeout: timeout})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closedURL := "http://" + ln.Addr().String() + "/x"
	ln.Close()
	hit := make(chan string, 10)
	unauthorized := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hit <- "401"
		http.Error(w, "who are you", http.StatusUnauthorized)
	}))
	t.Cleanup(unauthorized.Close)
	release := make(chan struct{})
	hanging := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hit <- "hang"
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(hanging.Close)
	t.Cleanup(func() { close(release) })

	var ids []string
	for _, u := range []string{closedURL, unauthorized.URL + "/x", hanging.URL + "/x"} {
		r := e.do("POST", "/v1/webhooks", e.keyA, map[string]any{"url": u, "types": []string{"sandbox.created"}})
		want(t, r, http.StatusCreated, "")
		ids = append(ids, r.json(t)["id"].(string))
	}
	start := time.Now()
	e.create(e.keyA, nil)
	got := map[string]bool{}
	for len(got) < 2 {
		select {
		case h := <-hit:
			got[h] = true
		case <-time.After(10 * time.Second):
			t.Fatalf("the receivers saw %v", got)
		}
	}
	var records []string
	for _, id := range ids {
		d := e.deliveryLog(t, e.keyA, id, 1)[0]
		if elapsed := time.Since(start); elapsed < timeout {
			t.Fatalf("webhook %s's failure was recorded after %s, before the attempt's timeout %s", id, elapsed, timeout)
		}
		// Nor does the store keep the cause (an export, a dashboard).
		if stored, err := e.store.ListDeliveries(context.Background(), id, 0, 10); err != nil || len(stored) != 1 ||
			stored[0].Error != "not delivered" || stored[0].StatusCode != 0 || stored[0].DurationMS != 0 {
			t.Fatalf("stored %+v, %v", stored, err)
		}
		delete(d, "id")
		delete(d, "timestamp")
		b, _ := json.Marshal(d)
		records = append(records, string(b))
	}
	want1 := `{"attempt":1,"duration_ms":0,"error":"not delivered","event_id":` // then the same event, type and status
	for _, r := range records {
		if !strings.HasPrefix(r, want1) || r != records[0] || !strings.Contains(r, `"status_code":0,"succeeded":false`) {
			t.Fatalf("records differ or say more than \"not delivered\":\n%s", strings.Join(records, "\n"))
		}
	}
}

// TestWebhookTenantsDoNotWait: tenant A registers its 20 webhooks at a
// receiver that never answers and makes events; tenant B's delivery
// arrives within 2 s all the same. The control runs the same attack on a
// server whose per-account cap is the whole pool (what one shared queue
// amounts to): B's delivery then waits for A's.
func TestWebhookTenantsDoNotWait(t *testing.T) {
	t.Parallel()
	const bound = 2 * time.Second
	run := func(t *testing.T, cfg server.Config) (time.Duration, bool) {
		cfg.WebhookAllowCIDRs = []string{"127.0.0.0/8"}
		cfg.WebhookMaxAttempts = 1
		e := newEnv(t, cfg)
		release := make(chan struct{})
		hung := make(chan struct{}, 1000)
		tarpit := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			hung <- struct{}{}
			select {
			case <-release:
			case <-r.Context().Done():
			}
		}))
		t.Cleanup(tarpit.Close)
		t.Cleanup(func() { close(release) })
		for range 20 {
			want(t, e.do("POST", "/v1/webhooks", e.keyA, map[string]any{"url": tarpit.URL + "/x"}), http.StatusCreated, "")
		}
		rc := newReceiver(t, 0)
		want(t, e.do("POST", "/v1/webhooks", e.keyB, map[string]any{"url": rc.URL + "/x"}), http.StatusCreated, "")
		e.create(e.keyA, nil)
		e.create(e.keyA, nil)
		// A's deliveries hold every slot they may take.
		for range cfg.WebhookAccountWorkers {
			select {
			case <-hung:
			case <-time.After(10 * time.Second):
				t.Fatal("A's deliveries did not start")
			}
		}
		start := time.Now()
		e.create(e.keyB, nil)
		select {
		case <-rc.ch:
			return time.Since(start), true
		case <-time.After(bound): // the bound is what is measured
			return bound, false
		}
	}
	t.Run("per-account", func(t *testing.T) {
		t.Parallel()
		d, ok := run(t, server.Config{WebhookWorkers: 8, WebhookAccountWorkers: 4, WebhookTimeout: time.Minute})
		if !ok {
			t.Fatalf("B's delivery did not arrive within %s while A's receivers hang", bound)
		}
		t.Logf("B's delivery arrived after %s", d)
	})
	t.Run("control: one shared pool", func(t *testing.T) {
		t.Parallel()
		if _, ok := run(t, server.Config{WebhookWorkers: 4, WebhookAccountWorkers: 4, WebhookTimeout: time.Minute}); ok {
			t.Fatal("B's delivery arrived although A held every slot: the control does not reproduce the attack")
		}
	})
}
