package server_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/client"
	"github.com/sheepfold/sheepfold/internal/metering"
	"github.com/sheepfold/sheepfold/internal/server"
)

// TestGoSDKAccounts drives the accounts, usage, credits and alerts calls
// of the Go SDK against the server.
func TestGoSDKAccounts(t *testing.T) {
	e := newEnv(t, server.Config{Metering: metering.Config{SampleInterval: 20 * time.Millisecond, FlushInterval: 50 * time.Millisecond}})
	ctx := context.Background()
	admin := client.New(e.url, e.adminKey())
	var apiErr *client.Error

	if _, err := client.New(e.url, e.keyA).ListAccounts(ctx); !errors.As(err, &apiErr) || apiErr.Code != "ERR_FORBIDDEN" {
		t.Fatalf("a user key lists accounts: %v", err)
	}
	if _, err := admin.CreateAccount(ctx, "team", &client.AccountLimits{MaxSandboxes: client.Int(-1)}); !errors.As(err, &apiErr) || apiErr.Status != 400 {
		t.Fatalf("negative limit: %v", err)
	}
	a, err := admin.CreateAccount(ctx, "team", &client.AccountLimits{RequestsPerMinute: client.Int(100), MaxCPUs: client.Float(1)})
	if err != nil || a.Name != "team" || *a.Limits.RequestsPerMinute != 100 || *a.Overrides.MaxCPUs != 1 {
		t.Fatalf("CreateAccount = %+v, %v", a, err)
	}
	k, err := admin.CreateKey(ctx, client.KeyRequest{Account: "team", Name: "ci"})
	if err != nil || k.Key == "" || k.Role != "user" || k.AccountID != a.ID {
		t.Fatalf("CreateKey = %+v, %v", k, err)
	}
	if a, err = admin.SetAccountLimits(ctx, "team", client.AccountLimits{RequestsPerMinute: client.Int(3)}, "max_cpus"); err != nil ||
		*a.Overrides.RequestsPerMinute != 3 || a.Overrides.MaxCPUs != nil {
		t.Fatalf("SetAccountLimits = %+v, %v", a, err)
	}
	if cr, err := admin.CreditAccount(ctx, "team", "5.25", "trial"); err != nil || cr.Balance != "5.250000" {
		t.Fatalf("CreditAccount = %+v, %v", cr, err)
	}
	if l, err := admin.ListAccounts(ctx); err != nil || len(l) < 2 {
		t.Fatalf("ListAccounts = %v, %v", l, err)
	}
	if g, err := admin.GetAccount(ctx, "team"); err != nil || len(g.Keys) != 1 {
		t.Fatalf("GetAccount = %+v, %v", g, err)
	}

	c := client.New(e.url, k.Key)
	own, err := c.Account(ctx)
	if err != nil || own.ID != a.ID {
		t.Fatalf("Account = %+v, %v", own, err)
	}
	if st := own.Storage; st == nil || st.Kinds["events"].MaxRecords != server.DefaultStorage.Events.Records ||
		st.Kinds["alerts"].MaxBytes != server.DefaultStorage.Alerts.Bytes {
		t.Fatalf("Account's storage = %+v", own.Storage)
	}
	sb, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	// The fourth call in a minute (Account, CreateSandbox, SandboxUsage,
	// and the next) meets the limit of 3 with a Retry-After.
	if _, err := c.SandboxUsage(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := c.SandboxUsage(ctx, sb.ID); !errors.As(err, &apiErr) || apiErr.Code != "ERR_RATE_LIMITED" || apiErr.RetryAfter <= 0 {
		t.Fatalf("over the rate: %#v", err)
	}
	if _, err := admin.SetAccountLimits(ctx, "team", client.AccountLimits{}, "requests_per_minute"); err != nil {
		t.Fatal(err)
	}
	u, err := c.SandboxUsage(ctx, sb.ID)
	if err != nil || !u.Live || u.SandboxID != sb.ID {
		t.Fatalf("SandboxUsage = %+v, %v", u, err)
	}
	if err := c.Kill(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the usage report", func() bool {
		r, err := c.Usage(ctx, client.UsageQuery{GroupBy: "sandbox", From: time.Now().Add(-time.Hour)})
		return err == nil && len(r.Groups) == 1 && r.Groups[0].SandboxID == sb.ID && r.Total.SandboxSeconds > 0
	})
	if cr, err := c.Credits(ctx); err != nil || cr.GrantedMicros != 5_250_000 {
		t.Fatalf("Credits = %+v, %v", cr, err)
	}
	al, err := c.CreateAlert(ctx, client.AlertRequest{Severity: "low", Message: "hello"})
	if err != nil || al.Kind != "manual" {
		t.Fatalf("CreateAlert = %+v, %v", al, err)
	}
	if _, err := c.AckAlert(ctx, al.ID); err != nil {
		t.Fatal(err)
	}
	if l, err := c.Alerts(ctx, true); err != nil || len(l) != 0 {
		t.Fatalf("unacknowledged = %v, %v", l, err)
	}
	if l, err := c.Alerts(ctx, false); err != nil || len(l) != 1 || !l[0].Acknowledged {
		t.Fatalf("Alerts = %v, %v", l, err)
	}
}
