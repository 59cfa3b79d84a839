package client

import (
	"context"
	"encoding/json"
	"net/url"
	"strconv"
	"time"

	"github.com/sheepfold/sheepfold/api"
)

// AccountLimits are an account's limits. In Account.Limits every field is
// set (0 means unlimited); in Account.Overrides and SetAccountLimits only
// the account's own ones are: nil takes (or keeps) the server's default.
type AccountLimits = api.AccountLimits

// Int makes an *int64 for AccountLimits.
func Int(v int64) *int64 { return &v }

// Float makes a *float64 for AccountLimits.MaxCPUs.
func Float(v float64) *float64 { return &v }

// MonthUsage is an account's usage this month, which its quotas count.
type MonthUsage = api.MonthUsage

// Credits are an account's credits in micro-units of the operator's
// currency; BalanceMicros is the ledger's sum.
type Credits = api.Credits

// AccountKey is a key of an account (never its secret).
type AccountKey = api.AccountKey

// Account is an account as the server describes it.
type Account = api.Account

// Storage is what an account keeps in the server's database: records and
// bytes (a record's text plus 128) in all, and by kind ("sandboxes",
// "executions", "events", "alerts", "deliveries") with the most the
// account may keep of each (0: no bound). Past a bound the account loses
// its own oldest records of that kind; a new alert with none
// acknowledged is ErrStorageQuotaExceeded.
type Storage = api.AccountStorage

// StoredAmount is one kind of an account's records and its bounds.
type StoredAmount = api.StoredAmount

// Account returns the caller's own account.
func (c *Client) Account(ctx context.Context) (*Account, error) {
	var a Account
	return &a, c.call(ctx, request{method: "GET", path: "/v1/account"}, &a)
}

// Credits returns the caller's credits.
func (c *Client) Credits(ctx context.Context) (*Credits, error) {
	var cr Credits
	return &cr, c.call(ctx, request{method: "GET", path: "/v1/account/credits"}, &cr)
}

// UsageFigures are metered usage with its estimated cost.
type UsageFigures = api.UsageFigures

// StorageFigures are an account's storage in a usage report.
type StorageFigures = api.StorageFigures

// UsageGroup is one group of a usage report.
type UsageGroup = api.UsageGroup

// Prices are the operator's price table, in micro-units.
type Prices = api.Prices

// UsageReport is GET /v1/account/usage.
type UsageReport = api.UsageReport

// ModelUsage is the account's tokens of one model.
type ModelUsage = api.ModelUsage

// UsageQuery selects a usage report; zero fields take the server's
// defaults (this month, by day).
type UsageQuery struct {
	From, To time.Time
	GroupBy  string // day, hour, sandbox or template
}

// Usage returns the caller's account's metered usage.
func (c *Client) Usage(ctx context.Context, q UsageQuery) (*UsageReport, error) {
	v := url.Values{}
	if !q.From.IsZero() {
		v.Set("from", q.From.UTC().Format(time.RFC3339))
	}
	if !q.To.IsZero() {
		v.Set("to", q.To.UTC().Format(time.RFC3339))
	}
	if q.GroupBy != "" {
		v.Set("group_by", q.GroupBy)
	}
	var r UsageReport
	return &r, c.call(ctx, request{method: "GET", path: "/v1/account/usage", query: v}, &r)
}

// SandboxUsage is one sandbox's usage; Live while it runs.
type SandboxUsage = api.SandboxUsage

// SandboxUsage returns one sandbox's usage so far.
func (c *Client) SandboxUsage(ctx context.Context, id string) (*SandboxUsage, error) {
	var u SandboxUsage
	return &u, c.call(ctx, request{method: "GET", path: sandboxPath(id, "usage")}, &u)
}

// Alert is something an account should look at.
type Alert = api.Alert

// AlertRequest raises an alert.
type AlertRequest = api.CreateAlert

// CreateAlert raises an alert on the caller's account.
func (c *Client) CreateAlert(ctx context.Context, req AlertRequest) (*Alert, error) {
	var a Alert
	return &a, c.call(ctx, request{method: "POST", path: "/v1/alerts", json: req}, &a)
}

// Alerts lists the account's alerts, newest first.
func (c *Client) Alerts(ctx context.Context, unacknowledgedOnly bool) ([]Alert, error) {
	var out struct {
		Alerts []Alert `json:"alerts"`
	}
	v := url.Values{"unacknowledged": {strconv.FormatBool(unacknowledgedOnly)}}
	return out.Alerts, c.call(ctx, request{method: "GET", path: "/v1/alerts", query: v}, &out)
}

// AckAlert acknowledges an alert.
func (c *Client) AckAlert(ctx context.Context, id string) (*Alert, error) {
	var a Alert
	return &a, c.call(ctx, request{method: "POST", path: "/v1/alerts/" + url.PathEscape(id) + "/ack"}, &a)
}

// Admin calls: they need an admin key.

// CreateAccount creates an account with its own limits (nil: defaults).
func (c *Client) CreateAccount(ctx context.Context, name string, limits *AccountLimits) (*Account, error) {
	var a Account
	body := map[string]any{"name": name}
	if limits != nil {
		body["limits"] = limits
	}
	return &a, c.call(ctx, request{method: "POST", path: "/v1/admin/accounts", json: body}, &a)
}

// ListAccounts lists every account.
func (c *Client) ListAccounts(ctx context.Context) ([]Account, error) {
	var out struct {
		Accounts []Account `json:"accounts"`
	}
	return out.Accounts, c.call(ctx, request{method: "GET", path: "/v1/admin/accounts"}, &out)
}

// GetAccount returns an account (by name or id) with its keys.
func (c *Client) GetAccount(ctx context.Context, account string) (*Account, error) {
	var a Account
	return &a, c.call(ctx, request{method: "GET", path: "/v1/admin/accounts/" + url.PathEscape(account)}, &a)
}

// SetAccountLimits sets the given limits of an account; the names in
// reset ("max_cpus", ...) go back to the server's defaults.
func (c *Client) SetAccountLimits(ctx context.Context, account string, set AccountLimits, reset ...string) (*Account, error) {
	body := map[string]any{}
	b, err := jsonObject(set)
	if err != nil {
		return nil, err
	}
	for k, v := range b {
		body[k] = v
	}
	for _, r := range reset {
		body[r] = nil
	}
	var a Account
	return &a, c.call(ctx, request{method: "POST", path: "/v1/admin/accounts/" + url.PathEscape(account) + "/limits", json: body}, &a)
}

// SetAccountRuntime sets the runtime of an account's sandboxes whose
// request and template name none ("" the server's default); locked makes
// it their only one (admin keys only).
func (c *Client) SetAccountRuntime(ctx context.Context, account, runtime string, locked bool) (*Account, error) {
	var a Account
	return &a, c.call(ctx, request{method: "POST", path: "/v1/admin/accounts/" + url.PathEscape(account) + "/runtime",
		json: api.AccountRuntime{Runtime: &runtime, Locked: locked}}, &a)
}

// CreditAccount grants credits (a decimal amount such as "25.00";
// negative takes them back).
func (c *Client) CreditAccount(ctx context.Context, account, amount, reason string) (*Credits, error) {
	var cr Credits
	return &cr, c.call(ctx, request{method: "POST", path: "/v1/admin/accounts/" + url.PathEscape(account) + "/credits",
		json: api.CreditGrant{Amount: &amount, Reason: reason}}, &cr)
}

// KeyRequest describes a new key of an account.
type KeyRequest = api.CreateKey

// NewKey is a created key; Key is its secret, shown only here.
type NewKey = api.NewKey

// CreateKey creates a key of an account.
func (c *Client) CreateKey(ctx context.Context, req KeyRequest) (*NewKey, error) {
	var k NewKey
	return &k, c.call(ctx, request{method: "POST", path: "/v1/admin/keys", json: req}, &k)
}

// jsonObject turns a struct into its JSON object's fields.
func jsonObject(v any) (map[string]any, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	var m map[string]any
	return m, json.Unmarshal(b, &m)
}
