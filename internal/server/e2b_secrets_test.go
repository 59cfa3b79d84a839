package server_test

import (
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/server"
)

// e2bSecretFields are the fields of E2B's Secret (its schema.gen.ts),
// sorted: no value among them.
var e2bSecretFields = []string{"createdAt", "currentVersion", "metadata", "name", "secretID", "updatedAt"}

// e2bSecret checks r is one E2B Secret and returns it.
func e2bSecret(t *testing.T, r resp) map[string]any {
	t.Helper()
	m := r.json(t)
	var keys []string
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	if !slices.Equal(keys, e2bSecretFields) {
		t.Fatalf("a Secret with fields %v, want %v: %s", keys, e2bSecretFields, r.body)
	}
	for _, k := range []string{"createdAt", "updatedAt"} {
		if _, err := time.Parse(time.RFC3339Nano, m[k].(string)); err != nil {
			t.Fatalf("%s: %v", k, err)
		}
	}
	if _, ok := m["metadata"].(map[string]any); !ok {
		t.Fatalf("metadata is not an object: %s", r.body)
	}
	return m
}

// TestE2BSecretsAPI: E2B's Secret API (its SDKs' Secret.create, list,
// getInfo, update, destroy) over the account's secrets: names
// lower-cased, sec_ reserved, selection by identifier or name, a new
// version by POST, 204 then 404 on delete, pages with X-Next-Token,
// E2B's error body; the same secrets as /v1/secrets; another account
// sees none of them; no answer ever holds a value.
func TestE2BSecretsAPI(t *testing.T) {
	t.Parallel()
	e := newEnv(t, server.Config{})
	const v1, v2 = "sk-E2B-FIRST-0a1b2c3d", "sk-E2B-SECOND-4e5f6a7b"
	var answers []resp
	do := func(method, path, key string, body any) resp {
		t.Helper()
		r := e.e2bDo(method, path, key, body)
		answers = append(answers, r)
		return r
	}
	code := func(r resp, status int) {
		t.Helper()
		if r.status != status || e2bCode(t, r) != float64(status) || r.json(t)["message"] == "" {
			t.Fatalf("want %d with E2B's error body, got %d %s", status, r.status, r.body)
		}
	}

	r := do("POST", "/secrets", e.keyA, map[string]any{"name": "OpenAI-API-Key", "value": v1, "metadata": map[string]string{"env": "test"}})
	if r.status != http.StatusCreated {
		t.Fatalf("create: %d %s", r.status, r.body)
	}
	s := e2bSecret(t, r)
	id, _ := s["secretID"].(string)
	if !strings.HasPrefix(id, "sec_") || s["name"] != "openai-api-key" || s["currentVersion"] != 1.0 || s["metadata"].(map[string]any)["env"] != "test" {
		t.Fatalf("created %s", r.body)
	}
	r = do("POST", "/secrets", e.keyA, map[string]any{"name": "plain", "value": "x"})
	if p := e2bSecret(t, r); len(p["metadata"].(map[string]any)) != 0 || p["secretID"] == id {
		t.Fatalf("created without metadata: %s", r.body)
	}

	// Selected by identifier, by name, by name in another case.
	for _, sel := range []string{id, "openai-api-key", "OpenAI-API-Key"} {
		r = do("GET", "/secrets/"+sel, e.keyA, nil)
		if r.status != http.StatusOK || e2bSecret(t, r)["secretID"] != id {
			t.Fatalf("get %s: %d %s", sel, r.status, r.body)
		}
	}
	// A new version by identifier: the metadata replaced, the id kept;
	// the same secret through /v1.
	r = do("POST", "/secrets/"+id, e.keyA, map[string]any{"value": v2, "metadata": map[string]string{"env": "prod"}})
	if u := e2bSecret(t, r); r.status != http.StatusOK || u["currentVersion"] != 2.0 || u["secretID"] != id || u["metadata"].(map[string]any)["env"] != "prod" {
		t.Fatalf("update: %d %s", r.status, r.body)
	}
	r = do("POST", "/secrets/openai-api-key", e.keyA, map[string]any{"value": v2})
	if u := e2bSecret(t, r); u["currentVersion"] != 3.0 || u["metadata"].(map[string]any)["env"] != "prod" {
		t.Fatalf("update by name without metadata: %s", r.body)
	}
	r = e.do("GET", "/v1/secrets/openai-api-key", e.keyA, nil)
	answers = append(answers, r)
	if m := r.json(t); r.status != http.StatusOK || m["version"] != 3.0 {
		t.Fatalf("through /v1: %s", r.body)
	}
	// A secret made through /v1 is listed, selectable by name and id.
	want(t, e.do("POST", "/v1/secrets", e.keyA, map[string]any{"name": "Mixed_Case", "value": "y"}), http.StatusCreated, "")

	// Pages: by name, X-Next-Token while more follow.
	var names []string
	token := ""
	for range 5 {
		q := "/secrets?limit=2"
		if token != "" {
			q += "&nextToken=" + token
		}
		r = do("GET", q, e.keyA, nil)
		var page []map[string]any
		if r.status != http.StatusOK || json.Unmarshal(r.body, &page) != nil {
			t.Fatalf("list: %d %s", r.status, r.body)
		}
		for _, p := range page {
			names = append(names, p["name"].(string))
		}
		if token = r.header.Get("X-Next-Token"); token == "" {
			break
		}
	}
	if want := []string{"Mixed_Case", "openai-api-key", "plain"}; !slices.Equal(names, want) {
		t.Fatalf("listed %v, want %v", names, want)
	}
	r = do("GET", "/secrets", e.keyA, nil)
	if r.status != http.StatusOK || r.header.Get("X-Next-Token") != "" || !strings.HasPrefix(string(r.body), "[") {
		t.Fatalf("one page: %d %s", r.status, r.body)
	}

	// Another account sees nothing of them.
	r = do("GET", "/secrets", e.keyB, nil)
	if r.status != http.StatusOK || strings.TrimSpace(string(r.body)) != "[]" {
		t.Fatalf("another account's list: %s", r.body)
	}
	code(do("GET", "/secrets/"+id, e.keyB, nil), http.StatusNotFound)
	code(do("POST", "/secrets/"+id, e.keyB, map[string]any{"value": "theirs"}), http.StatusNotFound)
	code(do("DELETE", "/secrets/openai-api-key", e.keyB, nil), http.StatusNotFound)

	// Bad input, each with E2B's error body.
	code(do("POST", "/secrets", e.keyA, map[string]any{"name": "sec_x", "value": v1}), http.StatusBadRequest)
	code(do("POST", "/secrets", e.keyA, map[string]any{"name": "SEC_x", "value": v1}), http.StatusBadRequest)
	code(do("POST", "/secrets", e.keyA, map[string]any{"name": "a b", "value": v1}), http.StatusBadRequest)
	code(do("POST", "/secrets", e.keyA, map[string]any{"name": "a.b", "value": v1}), http.StatusBadRequest)
	code(do("POST", "/secrets", e.keyA, map[string]any{"name": "ok"}), http.StatusBadRequest)
	code(do("POST", "/secrets", e.keyA, map[string]any{"value": v1}), http.StatusBadRequest)
	code(do("POST", "/secrets", e.keyA, map[string]any{"name": "ok", "value": ""}), http.StatusBadRequest)
	code(do("POST", "/secrets", e.keyA, `{"name": "ok", "value": 12}`), http.StatusBadRequest)
	code(do("POST", "/secrets", e.keyA, `{"name": "ok", "value": "`+v1), http.StatusBadRequest)
	code(do("POST", "/secrets", e.keyA, map[string]any{"name": "OPENAI-api-key", "value": v1}), http.StatusConflict)
	code(do("POST", "/secrets/"+id, e.keyA, map[string]any{"metadata": map[string]string{}}), http.StatusBadRequest)
	code(do("GET", "/secrets/sec_00000000000000000000000000000000", e.keyA, nil), http.StatusNotFound)
	code(do("GET", "/secrets/no.such", e.keyA, nil), http.StatusNotFound)
	code(do("GET", "/secrets?limit=0", e.keyA, nil), http.StatusBadRequest)
	code(do("GET", "/secrets?limit=101", e.keyA, nil), http.StatusBadRequest)
	code(do("GET", "/secrets?nextToken=!!", e.keyA, nil), http.StatusBadRequest)
	code(do("GET", "/secrets", "e2b_0000000000000000000000000000000000000000", nil), http.StatusUnauthorized)
	code(do("PUT", "/secrets/"+id, e.keyA, map[string]any{"value": v1}), http.StatusMethodNotAllowed)

	// Delete by identifier: 204, then 404 (the SDK's destroy: true, false).
	r = do("DELETE", "/secrets/"+id, e.keyA, nil)
	if r.status != http.StatusNoContent {
		t.Fatalf("delete: %d %s", r.status, r.body)
	}
	code(do("DELETE", "/secrets/"+id, e.keyA, nil), http.StatusNotFound)
	want(t, e.do("GET", "/v1/secrets/openai-api-key", e.keyA, nil), http.StatusNotFound, "ERR_NOT_FOUND")
	// Made again under the same name, it is another secret: another id.
	r = do("POST", "/secrets", e.keyA, map[string]any{"name": "openai-api-key", "value": v1})
	if s := e2bSecret(t, r); s["secretID"] == id {
		t.Fatalf("a secret made again kept the old id: %s", r.body)
	}
	code(do("GET", "/secrets/"+id, e.keyA, nil), http.StatusNotFound)

	for _, a := range answers {
		for _, v := range []string{v1, v2, "sk-E2B"} {
			if strings.Contains(string(a.body), v) || strings.Contains(strings.Join(headerValues(a.header), "\n"), v) {
				t.Fatalf("an answer holds a value: %d %s", a.status, a.body)
			}
		}
	}
}

func headerValues(h http.Header) []string {
	var out []string
	for k, vs := range h {
		out = append(out, k+": "+strings.Join(vs, ", "))
	}
	return out
}

// TestE2BSandboxSecretsChecked: a sandbox created through the E2B
// surface whose rules or envVars name a secret, in E2B's placeholder form
// or Sheepfold's, that the account does not have is refused (400 naming
// the field), as through /v1; a malformed E2B placeholder too.
func TestE2BSandboxSecretsChecked(t *testing.T) {
	t.Parallel()
	e := newEnv(t, server.Config{})
	want(t, e.do("POST", "/v1/secrets", e.keyB, map[string]any{"name": "gh-token", "value": "theirs"}), http.StatusCreated, "")
	rules := func(v string) map[string]any {
		return map[string]any{"templateID": "python", "network": map[string]any{"allowOut": []string{"api.test"},
			"rules": map[string]any{"api.test": []any{map[string]any{"transform": map[string]any{"headers": map[string]string{"Authorization": v}}}}}}}
	}
	for _, body := range []map[string]any{
		rules("Bearer ${e2b.secrets.gh-token}"),
		rules("Bearer ${e2b.secrets.GH-Token}"),
		rules("Bearer ${e2b.secrets.}"),
		{"templateID": "python", "envVars": map[string]string{"GH": "${e2b.secrets.gh-token}"}},
	} {
		r := e.e2bDo("POST", "/v2/sandboxes", e.keyA, body)
		if r.status != http.StatusBadRequest || e2bCode(t, r) != 400 {
			t.Fatalf("%v: %d %s", body, r.status, r.body)
		}
	}
	r := e.e2bDo("POST", "/v2/sandboxes", e.keyA, rules("Bearer ${e2b.secrets.gh-token}"))
	if msg, _ := r.json(t)["message"].(string); !strings.Contains(msg, `"gh-token"`) || !strings.Contains(msg, "network.rules[0].transform.headers.Authorization") {
		t.Fatalf("the refusal does not name the secret and the field: %s", r.body)
	}
	// Once the account has it, the envVars placeholder is accepted.
	r = e.e2bDo("POST", "/secrets", e.keyA, map[string]any{"name": "GH-Token", "value": "ours"})
	if r.status != http.StatusCreated {
		t.Fatalf("create: %s", r.body)
	}
	e.e2bCreate(e.keyA, map[string]any{"templateID": "python", "envVars": map[string]string{"GH": "${e2b.secrets.GH-TOKEN}"}})
}
