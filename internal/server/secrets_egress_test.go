package server_test

import (
	"context"
	"net/http"
	"strings"
	"testing"

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

	res := server.NewEgressSecrets(e.store, e.srv.Secrets())
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
