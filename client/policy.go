package client

import (
	"context"
	"encoding/json"
)

// PolicyAnswer is a sandbox's security policy as the server reports it.
type PolicyAnswer struct {
	Policy json.RawMessage `json:"policy"`
	// RestartRequired: the last change loosened a rule a running
	// interpreter cannot drop; each code context restarts (losing its
	// state) before its next execution. Loosened names the rules.
	RestartRequired bool     `json:"restart_required"`
	Loosened        []string `json:"loosened,omitempty"`
}

// GetPolicy reads a sandbox's security policy ({} when none was given).
func (c *Client) GetPolicy(ctx context.Context, id string) (*PolicyAnswer, error) {
	var out PolicyAnswer
	return &out, c.call(ctx, request{method: "GET", path: sandboxPath(id) + "/policy"}, &out)
}

// SetPolicy replaces a sandbox's security policy with policy (the whole
// new policy; a map, a struct or json.RawMessage).
func (c *Client) SetPolicy(ctx context.Context, id string, policy any) (*PolicyAnswer, error) {
	var out PolicyAnswer
	return &out, c.call(ctx, request{method: "PUT", path: sandboxPath(id) + "/policy", json: policy}, &out)
}
