package client

import (
	"context"
	"net/url"
	"strconv"

	"github.com/sheepfold/sheepfold/api"
)

// Secret is what the server shows of a stored secret: never its value.
type Secret = api.Secret

// SecretUse is one use of a secret at the egress gateway: a request it
// put the value into (Outcome "injected"), or one it refused for the
// secret's sake ("misdirected": its placeholder sent where it is not
// substituted; "unavailable": the value could not be resolved).
type SecretUse = api.SecretUse

// CreateSecret stores a secret of the caller's account. The value is
// write-only: no call gives it back. ErrConflict when the name is taken,
// ErrStorageQuotaExceeded when the account keeps as many as it may.
func (c *Client) CreateSecret(ctx context.Context, name, value string, metadata map[string]string) (*Secret, error) {
	var s Secret
	body := map[string]any{"name": name, "value": value}
	if metadata != nil {
		body["metadata"] = metadata
	}
	if err := c.call(ctx, request{method: "POST", path: "/v1/secrets", json: body}, &s); err != nil {
		return nil, err
	}
	return &s, nil
}

// ListSecrets returns the caller's secrets by name (never their values).
func (c *Client) ListSecrets(ctx context.Context) ([]Secret, error) {
	var body struct {
		Secrets []Secret `json:"secrets"`
	}
	if err := c.call(ctx, request{method: "GET", path: "/v1/secrets"}, &body); err != nil {
		return nil, err
	}
	return body.Secrets, nil
}

// GetSecret returns one of the caller's secrets (never its value).
func (c *Client) GetSecret(ctx context.Context, name string) (*Secret, error) {
	var s Secret
	if err := c.call(ctx, request{method: "GET", path: "/v1/secrets/" + url.PathEscape(name)}, &s); err != nil {
		return nil, err
	}
	return &s, nil
}

// RotateSecret stores a new version of a secret's value; metadata, when
// not nil, replaces the secret's.
func (c *Client) RotateSecret(ctx context.Context, name, value string, metadata map[string]string) (*Secret, error) {
	var s Secret
	body := map[string]any{"value": value}
	if metadata != nil {
		body["metadata"] = metadata
	}
	if err := c.call(ctx, request{method: "PUT", path: "/v1/secrets/" + url.PathEscape(name), json: body}, &s); err != nil {
		return nil, err
	}
	return &s, nil
}

// DeleteSecret deletes a secret and its value.
func (c *Client) DeleteSecret(ctx context.Context, name string) error {
	return c.call(ctx, request{method: "DELETE", path: "/v1/secrets/" + url.PathEscape(name)}, nil)
}

// SecretUses lists a secret's uses, newest first: at most limit (1 to
// 1000; 0 for the server's 100), with ids below before (0: from the
// newest; the last use's ID gives the next page).
func (c *Client) SecretUses(ctx context.Context, name string, limit int, before int64) ([]SecretUse, error) {
	q := url.Values{}
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	if before > 0 {
		q.Set("before", strconv.FormatInt(before, 10))
	}
	path := "/v1/secrets/" + url.PathEscape(name) + "/uses"
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	var body struct {
		Uses []SecretUse `json:"uses"`
	}
	if err := c.call(ctx, request{method: "GET", path: path}, &body); err != nil {
		return nil, err
	}
	return body.Uses, nil
}
