package server_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"testing"

	"github.com/sheepfold/sheepfold/internal/server"
)

// TestSecretsAPI: the routes of /v1/secrets, their codes, and one
// account's secrets unseen by another.
func TestSecretsAPI(t *testing.T) {
	t.Parallel()
	e := newEnv(t, server.Config{})
	r := e.do("POST", "/v1/secrets", e.keyA, map[string]any{"name": "openai", "value": "v1", "metadata": map[string]string{"team": "x"}})
	want(t, r, http.StatusCreated, "")
	if m := r.json(t); m["name"] != "openai" || m["version"] != 1.0 || m["metadata"].(map[string]any)["team"] != "x" || m["last_used_at"] != nil {
		t.Fatalf("created: %s", r.body)
	}
	want(t, e.do("POST", "/v1/secrets", e.keyA, map[string]any{"name": "openai", "value": "v"}), http.StatusConflict, "ERR_CONFLICT")
	want(t, e.do("POST", "/v1/secrets", e.keyA, map[string]any{"name": "bad.name", "value": "v"}), http.StatusBadRequest, "ERR_BAD_REQUEST")
	want(t, e.do("POST", "/v1/secrets", e.keyA, map[string]any{"name": "empty"}), http.StatusBadRequest, "ERR_BAD_REQUEST")
	want(t, e.do("POST", "/v1/secrets", e.keyA, map[string]any{"name": "x", "value": "v", "extra": 1}), http.StatusBadRequest, "ERR_BAD_REQUEST")
	want(t, e.do("GET", "/v1/secrets/bad.name", e.keyA, nil), http.StatusBadRequest, "ERR_BAD_REQUEST")
	want(t, e.do("GET", "/v1/secrets", "", nil), http.StatusUnauthorized, "ERR_AUTHENTICATION_FAILED")

	// Another account sees, changes and deletes none of it.
	want(t, e.do("GET", "/v1/secrets/openai", e.keyB, nil), http.StatusNotFound, "ERR_NOT_FOUND")
	want(t, e.do("PUT", "/v1/secrets/openai", e.keyB, map[string]any{"value": "theirs"}), http.StatusNotFound, "ERR_NOT_FOUND")
	want(t, e.do("DELETE", "/v1/secrets/openai", e.keyB, nil), http.StatusNotFound, "ERR_NOT_FOUND")
	if r := e.do("GET", "/v1/secrets", e.keyB, nil); r.status != 200 || string(bytes.TrimSpace(r.body)) != `{"secrets":[]}` {
		t.Fatalf("B's list: %d %s", r.status, r.body)
	}

	r = e.do("PUT", "/v1/secrets/openai", e.keyA, map[string]any{"value": "v2"})
	want(t, r, http.StatusOK, "")
	if m := r.json(t); m["version"] != 2.0 || m["metadata"].(map[string]any)["team"] != "x" {
		t.Fatalf("new version: %s", r.body)
	}
	r = e.do("POST", "/v1/secrets/openai/versions", e.keyA, map[string]any{"value": "v3", "metadata": map[string]string{}})
	want(t, r, http.StatusOK, "")
	if m := r.json(t); m["version"] != 3.0 || len(m["metadata"].(map[string]any)) != 0 {
		t.Fatalf("third version: %s", r.body)
	}
	if v, err := e.srv.Secrets().Resolve(context.Background(), ownerOf(t, e, e.keyA), "openai"); err != nil || string(v) != "v3" {
		t.Fatalf("resolve: %q, %v", v, err)
	}
	r = e.do("GET", "/v1/secrets", e.keyA, nil)
	want(t, r, http.StatusOK, "")
	l := r.json(t)["secrets"].([]any)
	if len(l) != 1 || l[0].(map[string]any)["version"] != 3.0 || l[0].(map[string]any)["last_used_at"] == nil {
		t.Fatalf("list after a use: %s", r.body)
	}
	want(t, e.do("DELETE", "/v1/secrets/openai", e.keyA, nil), http.StatusNoContent, "")
	want(t, e.do("GET", "/v1/secrets/openai", e.keyA, nil), http.StatusNotFound, "ERR_NOT_FOUND")
	want(t, e.do("PUT", "/v1/secrets/openai", e.keyA, map[string]any{"value": "v4"}), http.StatusNotFound, "ERR_NOT_FOUND")
}

// ownerOf is the account a key acts for.
func ownerOf(t *testing.T, e *env, key string) string {
	t.Helper()
	r := e.do("GET", "/v1/account", key, nil)
	want(t, r, http.StatusOK, "")
	id, _ := r.json(t)["id"].(string)
	if id == "" {
		t.Fatalf("no account id: %s", r.body)
	}
	return id
}

// TestSecretValueNeverShown: after a secret is created, given new
// versions, used and deleted, and after requests that fail with a value
// in them, no value is in any API answer, any line of the server's log
// (at debug), or the database files (events, webhooks' deliveries and
// execution history live there), while the secret's name, which is not
// secret, is in each: the control that the search looks where it should.
// Through /v1 and through E2B's Secret API (/secrets).
func TestSecretValueNeverShown(t *testing.T) {
	t.Parallel()
	logs := &logRecords{}
	e := newLoggedEnv(t, server.Config{}, logs)
	values := []string{"sk-live-4f1c9e0a77b2", "sk-live-second-8d03", "sk-live-third-51aa", "sk-live-refused-c3e9", "sk-live-broken-77f0"}
	const name = "canary_name_6b1d"
	var answers bytes.Buffer
	do := func(method, path string, body any) resp {
		r := e.do(method, path, e.keyA, body)
		fmt.Fprintf(&answers, "%d %v %s\n", r.status, r.header, r.body)
		return r
	}
	want(t, do("POST", "/v1/secrets", map[string]any{"name": name, "value": values[0], "metadata": map[string]string{"use": "test"}}), 201, "")
	want(t, do("GET", "/v1/secrets", nil), 200, "")
	want(t, do("GET", "/v1/secrets/"+name, nil), 200, "")
	want(t, do("PUT", "/v1/secrets/"+name, map[string]any{"value": values[1]}), 200, "")
	want(t, do("POST", "/v1/secrets/"+name+"/versions", map[string]any{"value": values[2]}), 200, "")
	if v, err := e.srv.Secrets().Resolve(context.Background(), ownerOf(t, e, e.keyA), name); err != nil || string(v) != values[2] {
		t.Fatalf("resolve: %q, %v", v, err)
	}
	// Refusals with a value in the request.
	want(t, do("POST", "/v1/secrets", map[string]any{"name": name, "value": values[3]}), 409, "ERR_CONFLICT")
	want(t, do("POST", "/v1/secrets", map[string]any{"name": "bad name", "value": values[3]}), 400, "ERR_BAD_REQUEST")
	want(t, do("POST", "/v1/secrets", map[string]any{"name": "ok", "value": values[3], "unknown": values[3]}), 400, "ERR_BAD_REQUEST")
	want(t, do("POST", "/v1/secrets", `{"name":"ok","value":"`+values[4]), 400, "ERR_BAD_REQUEST")
	want(t, do("PUT", "/v1/secrets/"+name, `{"value":["`+values[4]+`"]}`), 400, "ERR_BAD_REQUEST")
	want(t, do("PUT", "/v1/secrets/nope", map[string]any{"value": values[3]}), 404, "ERR_NOT_FOUND")
	want(t, do("GET", "/v1/secrets/"+name, nil), 200, "")
	want(t, do("DELETE", "/v1/secrets/"+name, nil), 204, "")

	// The same through E2B's Secret API, its refusals carrying values too.
	e2b := func(method, path string, body any, status int) resp {
		t.Helper()
		r := e.e2bDo(method, path, e.keyA, body)
		fmt.Fprintf(&answers, "%d %v %s\n", r.status, r.header, r.body)
		if r.status != status {
			t.Fatalf("E2B %s %s: %d %s", method, path, r.status, r.body)
		}
		return r
	}
	e2bValues := []string{"sk-e2b-live-0b7d31", "sk-e2b-second-a9c2", "sk-e2b-refused-5e44"}
	values = append(values, e2bValues...)
	id := e2b("POST", "/secrets", map[string]any{"name": "E2B_" + name, "value": e2bValues[0]}, 201).json(t)["secretID"].(string)
	e2b("GET", "/secrets", nil, 200)
	e2b("GET", "/secrets/"+id, nil, 200)
	e2b("POST", "/secrets/"+id, map[string]any{"value": e2bValues[1], "metadata": map[string]string{"k": "v"}}, 200)
	e2b("POST", "/secrets", map[string]any{"name": "e2b_" + name, "value": e2bValues[2]}, 409)
	e2b("POST", "/secrets", map[string]any{"name": "sec_" + name, "value": e2bValues[2]}, 400)
	e2b("POST", "/secrets", map[string]any{"name": "bad name", "value": e2bValues[2]}, 400)
	e2b("POST", "/secrets", `{"name":"ok","value":"`+e2bValues[2], 400)
	e2b("POST", "/secrets/"+id, `{"value":["`+e2bValues[2]+`"]}`, 400)
	e2b("POST", "/secrets/nope", map[string]any{"value": e2bValues[2]}, 404)
	e2b("DELETE", "/secrets/"+id, nil, 204)

	var logText strings.Builder
	logs.mu.Lock()
	for _, r := range logs.recs {
		logText.WriteString(r.Message)
		r.Attrs(func(a slog.Attr) bool { fmt.Fprintf(&logText, " %s=%v", a.Key, a.Value); return true })
		logText.WriteByte('\n')
	}
	logs.mu.Unlock()
	var db []byte
	for _, f := range []string{e.dbPath, e.dbPath + "-wal"} {
		b, err := os.ReadFile(f)
		if err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
		db = append(db, b...)
	}
	places := map[string][]byte{"API answers": answers.Bytes(), "server log": []byte(logText.String()), "database files": db}
	for where, text := range places {
		if !bytes.Contains(text, []byte(name)) {
			t.Errorf("control: the secret's name is not in the %s (%d bytes): the search looks in the wrong place", where, len(text))
		}
		for _, v := range values {
			if bytes.Contains(text, []byte(v)) {
				t.Errorf("the value %q is in the %s", v, where)
			}
		}
	}
}
