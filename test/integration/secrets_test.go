package integration

import (
	"context"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/client"
)

// TestSecretsInSandboxGoSDK: through a real server, a sandbox whose
// policy has a rule naming a secret holds only the placeholder (in the
// env it asked for), and carries the server's egress CA (DATA_DIR/
// egress-ca.pem) in its trust stores with the environment that points
// its TLS clients at them; a rule naming a secret the account lacks is
// ERR_INVALID_POLICY; the secret's uses are listed (none yet).
func TestSecretsInSandboxGoSDK(t *testing.T) {
	s := start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := client.New(s.url, s.key)
	const value = "sk-INTEGRATION-a1b2c3d4e5"
	if _, err := c.CreateSecret(ctx, "int_openai", value, nil); err != nil {
		t.Fatal(err)
	}
	defer c.DeleteSecret(context.Background(), "int_openai")
	policy := func(name string) map[string]any {
		return map[string]any{"network": map[string]any{"mode": "allowlist", "allow": []string{"api.example.test"},
			"rules": []any{map[string]any{"host": "api.example.test", "transform": map[string]any{
				"headers": map[string]string{"Authorization": "Bearer ${secrets." + name + "}"}}}}}}
	}
	_, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{Timeout: time.Minute, SecurityPolicy: policy("int_missing")})
	wantCode(t, err, "ERR_INVALID_POLICY")

	sb, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{Timeout: 2 * time.Minute, SecurityPolicy: policy("int_openai"),
		Env: map[string]string{"OPENAI_API_KEY": "${secrets.int_openai}"}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Kill(context.Background(), sb.ID)
	ex, err := c.Execute(ctx, sb.ID, client.ExecuteRequest{Code: `import os
ca = open("/usr/local/share/ca-certificates/sheepfold-egress-ca.crt").read()
print(os.environ["OPENAI_API_KEY"], os.environ["SSL_CERT_FILE"], os.environ["NODE_EXTRA_CA_CERTS"],
      ca.strip() in open(os.environ["SSL_CERT_FILE"]).read(), "int_openai" in str(os.environ))
print(ca)`})
	if err != nil || ex.Error != nil {
		t.Fatalf("execute: %+v, %v", ex, err)
	}
	first, caPEM, _ := strings.Cut(ex.Stdout, "\n")
	if first != "${secrets.int_openai} /etc/ssl/certs/ca-certificates.crt /usr/local/share/ca-certificates/sheepfold-egress-ca.crt True True" {
		t.Fatalf("in the sandbox: %q", first)
	}
	if strings.Contains(ex.Stdout, value) {
		t.Fatal("the value is in the sandbox")
	}
	own, err := os.ReadFile(filepath.Join(s.dataDir, "egress-ca.pem"))
	if err != nil {
		t.Fatal(err)
	}
	blk, _ := pem.Decode(own)
	if blk == nil || strings.TrimSpace(string(pem.EncodeToMemory(blk))) != strings.TrimSpace(caPEM) {
		t.Fatalf("the sandbox's CA %q is not the server's", caPEM)
	}
	if strings.Contains(caPEM, "PRIVATE") {
		t.Fatal("the CA's key is in the sandbox")
	}
	uses, err := c.SecretUses(ctx, "int_openai", 10, 0)
	if err != nil || len(uses) != 0 {
		t.Fatalf("uses: %+v, %v", uses, err)
	}
}
