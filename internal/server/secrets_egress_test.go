package server_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/egress"
	"github.com/sheepfold/sheepfold/internal/server"
)

// rulePolicy is a security policy whose rule names the secret name.
func rulePolicy(name string) map[string]any {
	return map[string]any{"network": map[string]any{"mode": "allowlist", "allow": []string{"api.test"},
		"rules": []any{map[string]any{"host": "api.test", "transform": map[string]any{
			"headers": map[string]string{"Authorization": "Bearer ${secrets." + name + "}"}}}}}}
}

// TestPolicySecretsChecked: a policy (at create or PUT) or an env value
// naming a secret the account does not have is refused, naming the field
// and the secret; another account's secret of that name does not count.
// The gateway's resolver finds the secret of the sandbox's own account.
func TestPolicySecretsChecked(t *testing.T) {
	t.Parallel()
	e := newEnv(t, server.Config{})
	want(t, e.do("POST", "/v1/secrets", e.keyB, map[string]any{"name": "openai", "value": "theirs"}), http.StatusCreated, "")

	r := e.do("POST", "/v1/sandboxes", e.keyA, map[string]any{"security_policy": rulePolicy("openai")})
	want(t, r, http.StatusBadRequest, "ERR_INVALID_POLICY")
	if m := r.json(t); !strings.Contains(string(r.body), "network.rules[0].transform.headers.Authorization") || m == nil {
		t.Fatalf("refusal: %s", r.body)
	}
	r = e.do("POST", "/v1/sandboxes", e.keyA, map[string]any{"env": map[string]string{"OPENAI_API_KEY": "${secrets.openai}"}})
	want(t, r, http.StatusBadRequest, "ERR_BAD_REQUEST")
	want(t, e.do("POST", "/v1/sandboxes", e.keyA, map[string]any{"env": map[string]string{"K": "${secrets.}"}}), http.StatusBadRequest, "ERR_BAD_REQUEST")

	want(t, e.do("POST", "/v1/secrets", e.keyA, map[string]any{"name": "openai", "value": "ours"}), http.StatusCreated, "")
	// (The fake runtime has no networks: a sandbox with rules is
	// created in internal/sandbox's TestSecretsThroughSandbox.)
	r = e.do("POST", "/v1/sandboxes", e.keyA, map[string]any{"env": map[string]string{"OPENAI_API_KEY": "${secrets.openai}"}})
	want(t, r, http.StatusCreated, "")
	id := r.json(t)["id"].(string)
	r = e.do("PUT", "/v1/sandboxes/"+id+"/policy", e.keyA, rulePolicy("missing"))
	want(t, r, http.StatusBadRequest, "ERR_INVALID_POLICY")
	if !strings.Contains(string(r.body), `secret \"missing\"`) {
		t.Fatalf("refusal: %s", r.body)
	}

	res := server.NewEgressSecrets(e.store, e.srv.Secrets(), nil)
	defer res.Close()
	if v, err := res.Resolve(context.Background(), id, "openai"); err != nil || string(v) != "ours" {
		t.Fatalf("resolve: %q, %v", v, err)
	}
	if _, err := res.Resolve(context.Background(), id, "missing"); err == nil {
		t.Fatal("a missing secret resolved")
	}
	want(t, e.do("DELETE", "/v1/secrets/openai", e.keyA, nil), http.StatusNoContent, "")
	if _, err := res.Resolve(context.Background(), id, "openai"); err == nil {
		t.Fatal("a deleted secret resolved")
	}
}

// TestSecretUsesAudit: the gateway's uses of a secret, recorded through
// EgressSecrets, are listed by GET /v1/secrets/{name}/uses (newest first,
// paged) to the secret's account only; injected ones count in use_count
// and last_used_at. A use naming a secret the account lacks is dropped.
func TestSecretUsesAudit(t *testing.T) {
	t.Parallel()
	e := newEnv(t, server.Config{})
	want(t, e.do("POST", "/v1/secrets", e.keyA, map[string]any{"name": "openai", "value": "sk-AUDIT-123456"}), http.StatusCreated, "")
	want(t, e.do("POST", "/v1/secrets", e.keyB, map[string]any{"name": "openai", "value": "theirs"}), http.StatusCreated, "")
	r := e.do("POST", "/v1/sandboxes", e.keyA, map[string]any{"env": map[string]string{"OPENAI_API_KEY": "${secrets.openai}"}})
	want(t, r, http.StatusCreated, "")
	id := r.json(t)["id"].(string)

	res := server.NewEgressSecrets(e.store, e.srv.Secrets(), nil)
	at := time.Now().UTC().Truncate(time.Second)
	res.Used(egress.SecretUse{Secret: "openai", SandboxID: id, Host: "api.test", Method: "POST", Path: "/v1/chat", Outcome: egress.OutcomeInjected, At: at})
	res.Used(egress.SecretUse{Secret: "openai", SandboxID: id, Host: "evil.test", Method: "GET", Path: "/", Outcome: egress.OutcomeMisdirected, At: at.Add(time.Second)})
	res.Used(egress.SecretUse{Secret: "nope", SandboxID: id, Host: "evil.test", Method: "GET", Path: "/", Outcome: egress.OutcomeMisdirected, At: at})
	res.Close() // writes what is queued

	r = e.do("GET", "/v1/secrets/openai/uses", e.keyA, nil)
	want(t, r, http.StatusOK, "")
	l := r.json(t)["uses"].([]any)
	if len(l) != 2 || l[0].(map[string]any)["outcome"] != "misdirected" || l[1].(map[string]any)["host"] != "api.test" ||
		l[1].(map[string]any)["sandbox_id"] != id || l[1].(map[string]any)["path"] != "/v1/chat" {
		t.Fatalf("uses: %s", r.body)
	}
	r = e.do("GET", "/v1/secrets/openai/uses?limit=1", e.keyA, nil)
	want(t, r, http.StatusOK, "")
	next, _ := r.json(t)["next"].(string)
	r = e.do("GET", "/v1/secrets/openai/uses?limit=1&before="+next, e.keyA, nil)
	if l := r.json(t)["uses"].([]any); len(l) != 1 || l[0].(map[string]any)["outcome"] != "injected" {
		t.Fatalf("second page: %s", r.body)
	}
	r = e.do("GET", "/v1/secrets/openai", e.keyA, nil)
	if m := r.json(t); m["use_count"] != 1.0 || m["last_used_at"] == nil {
		t.Fatalf("secret after uses: %s", r.body)
	}
	if strings.Contains(string(r.body), "sk-AUDIT") {
		t.Fatal("the value is in an answer")
	}
	if r := e.do("GET", "/v1/secrets/openai/uses", e.keyB, nil); len(r.json(t)["uses"].([]any)) != 0 {
		t.Fatalf("another account's uses: %s", r.body)
	}
	want(t, e.do("GET", "/v1/secrets/nope/uses", e.keyA, nil), http.StatusNotFound, "ERR_NOT_FOUND")
	want(t, e.do("GET", "/v1/secrets/openai/uses?limit=0", e.keyA, nil), http.StatusBadRequest, "ERR_BAD_REQUEST")
	want(t, e.do("GET", "/v1/secrets/openai/uses?before=x", e.keyA, nil), http.StatusBadRequest, "ERR_BAD_REQUEST")
}

// BenchmarkEgressSecretsResolve is what the server adds to a request
// through an injecting rule: the sandbox's owner (remembered) and the
// secret read from the store and opened.
func BenchmarkEgressSecretsResolve(b *testing.B) {
	e := newEnv(b, server.Config{})
	if r := e.do("POST", "/v1/secrets", e.keyA, map[string]any{"name": "openai", "value": "sk-bench-0123456789"}); r.status != http.StatusCreated {
		b.Fatal(string(r.body))
	}
	r := e.do("POST", "/v1/sandboxes", e.keyA, map[string]any{})
	id, _ := r.json(b)["id"].(string)
	res := server.NewEgressSecrets(e.store, e.srv.Secrets(), nil)
	defer res.Close()
	ctx := context.Background()
	b.ResetTimer()
	for b.Loop() {
		if _, err := res.Resolve(ctx, id, "openai"); err != nil {
			b.Fatal(err)
		}
	}
}
