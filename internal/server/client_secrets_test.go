package server_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/client"
	"github.com/sheepfold/sheepfold/internal/egress"
	"github.com/sheepfold/sheepfold/internal/server"
)

// TestGoSDKSecrets drives /v1/secrets through the Go SDK.
func TestGoSDKSecrets(t *testing.T) {
	t.Parallel()
	e := newEnv(t, server.Config{})
	ctx := context.Background()
	c := client.New(e.url, e.keyA)
	s, err := c.CreateSecret(ctx, "db_password", "hunter2", map[string]string{"env": "prod"})
	if err != nil || s.Name != "db_password" || s.Version != 1 || s.Metadata["env"] != "prod" || s.LastUsedAt != nil || s.CreatedAt.IsZero() {
		t.Fatalf("create: %+v, %v", s, err)
	}
	if _, err := c.CreateSecret(ctx, "db_password", "x", nil); !errors.Is(err, client.ErrConflict) {
		t.Fatalf("create twice: %v", err)
	}
	if _, err := c.CreateSecret(ctx, "db.password", "x", nil); !errors.Is(err, client.ErrBadRequest) {
		t.Fatalf("a bad name: %v", err)
	}
	if s, err = c.RotateSecret(ctx, "db_password", "hunter3", nil); err != nil || s.Version != 2 || s.Metadata["env"] != "prod" {
		t.Fatalf("rotate: %+v, %v", s, err)
	}
	if s, err = c.GetSecret(ctx, "db_password"); err != nil || s.Version != 2 {
		t.Fatalf("get: %+v, %v", s, err)
	}
	if l, err := c.ListSecrets(ctx); err != nil || len(l) != 1 || l[0].Name != "db_password" {
		t.Fatalf("list: %+v, %v", l, err)
	}
	if _, err := client.New(e.url, e.keyB).GetSecret(ctx, "db_password"); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("another account's secret: %v", err)
	}
	// Uses: recorded as the gateway records them, listed newest first.
	sb, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{Env: map[string]string{"DB": "${secrets.db_password}"}})
	if err != nil {
		t.Fatal(err)
	}
	rec := server.NewEgressSecrets(e.store, e.srv.Secrets(), nil)
	for i := range 3 {
		rec.Used(egress.SecretUse{Secret: "db_password", SandboxID: sb.ID, Host: "db.test", Method: "POST", Path: fmt.Sprintf("/q%d", i),
			Outcome: egress.OutcomeInjected, At: time.Now()})
	}
	rec.Close()
	u, err := c.SecretUses(ctx, "db_password", 2, 0)
	if err != nil || len(u) != 2 || u[0].Path != "/q2" || u[0].SandboxID != sb.ID || u[0].Outcome != "injected" {
		t.Fatalf("uses: %+v, %v", u, err)
	}
	if u, err = c.SecretUses(ctx, "db_password", 0, u[1].ID); err != nil || len(u) != 1 || u[0].Path != "/q0" {
		t.Fatalf("uses, next page: %+v, %v", u, err)
	}
	if s, err = c.GetSecret(ctx, "db_password"); err != nil || s.UseCount != 3 || s.LastUsedAt == nil {
		t.Fatalf("after uses: %+v, %v", s, err)
	}
	if err := c.DeleteSecret(ctx, "db_password"); err != nil {
		t.Fatal(err)
	}
	if err := c.DeleteSecret(ctx, "db_password"); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("delete twice: %v", err)
	}
}

// TestPythonSDKSecrets runs sdk/python/tests/test_secrets.py against a
// server.
func TestPythonSDKSecrets(t *testing.T) {
	t.Parallel()
	e := newEnv(t, server.Config{})
	cmd := exec.Command("/usr/bin/python3", "-m", "unittest", "-v", "test_secrets")
	cmd.Dir = "../../sdk/python/tests"
	cmd.Env = append(os.Environ(), "SHEEPFOLD_SECRETS_URL="+e.url, "SHEEPFOLD_SECRETS_KEY="+e.keyA, "SHEEPFOLD_SECRETS_OTHER_KEY="+e.keyB)
	out, err := cmd.CombinedOutput()
	if err != nil || !bytes.Contains(out, []byte("\nOK")) || bytes.Contains(out, []byte("skipped")) {
		t.Fatalf("python secrets client: %v\n%s", err, out)
	}
}
