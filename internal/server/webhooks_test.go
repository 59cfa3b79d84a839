package server_test

import (
	"crypto/hmac"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/server"
)

// receiver is a loopback webhook receiver that fails its first fail
// requests with 500.
type receiver struct {
	*httptest.Server
	mu   sync.Mutex
	got  []received
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
	e := newEnv(t, server.Config{WebhookRetryBase: 10 * time.Millisecond, WebhookMaxAttempts: 4})
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
	want(t, e.do("POST", "/v1/sandboxes/"+id+"/execute", e.keyA, map[string]any{"code": "1+1"}), http.StatusOK, "")
	want(t, e.do("DELETE", "/v1/sandboxes/"+id, e.keyA, nil), http.StatusNoContent, "")

	first := rc.next(t)
	second := rc.next(t)
	for i, rv := range []received{first, second} {
		ts := rv.header.Get("Sheepfold-Timestamp")
		sec, err := strconv.ParseInt(ts, 10, 64)
		if err != nil || time.Since(time.Unix(sec, 0)) > time.Minute {
			t.Fatalf("delivery %d timestamp %q", i, ts)
		}
		sig := rv.header.Get("Sheepfold-Signature")
		if !hmac.Equal([]byte(sig), []byte(server.Sign(secret, ts, rv.body))) {
			t.Fatalf("delivery %d signature %q does not check", i, sig)
		}
		if server.Sign("another secret", ts, rv.body) == sig || server.Sign(secret, ts, append(rv.body, ' ')) == sig {
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
	// stopped one went at once.
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
	want1 := "sandbox.created#1:500:false sandbox.created#2:500:false sandbox.created#3:204:true sandbox.stopped#1:204:true"
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
		map[string]any{"url": "http://user:pw@127.0.0.1/x"},
		map[string]any{"url": "http://127.0.0.1/x", "types": []string{"nope"}},
		map[string]any{"url": "http://127.0.0.1/x", "extra": 1},
		// The cloud metadata service and the rest of link-local, in every spelling.
		map[string]any{"url": "http://169.254.169.254/latest/meta-data/"},
		map[string]any{"url": "http://169.254.1.1:8080/"},
		map[string]any{"url": "http://[::ffff:169.254.169.254]/"},
		map[string]any{"url": "http://[fe80::1]/"},
		map[string]any{"url": "http://0.0.0.0/"},
		map[string]any{"url": "http://[fd00:ec2::254]/"},
	} {
		want(t, e.do("POST", "/v1/webhooks", e.keyA, body), http.StatusBadRequest, "ERR_BAD_REQUEST")
	}
	// Loopback is allowed by default (a receiver on this host).
	want(t, e.do("POST", "/v1/webhooks", e.keyA, map[string]any{"url": "http://127.0.0.1:9/x"}), http.StatusCreated, "")

	// An operator's allowlist admits only what it names.
	e2 := newEnv(t, server.Config{WebhookAllowHosts: []string{"hooks.example.com", "10.0.0.0/8"}})
	want(t, e2.do("POST", "/v1/webhooks", e2.keyA, map[string]any{"url": "http://127.0.0.1:9/x"}), http.StatusBadRequest, "ERR_BAD_REQUEST")
	want(t, e2.do("POST", "/v1/webhooks", e2.keyA, map[string]any{"url": "http://10.1.2.3/x"}), http.StatusCreated, "")
	if server.CheckWebhookHosts([]string{"a.example.com", "10.0.0.0/8", "::1"}) != nil ||
		server.CheckWebhookHosts([]string{"http://x/"}) == nil {
		t.Fatal("CheckWebhookHosts")
	}
}
