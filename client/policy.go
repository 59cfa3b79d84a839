package client

import (
	"context"

	"github.com/sheepfold/sheepfold/api"
)

// PolicyAnswer is a sandbox's security policy as the server reports it.
type PolicyAnswer = api.PolicyAnswer

// GetPolicy reads a sandbox's security policy ({} when none was given).
func (c *Client) GetPolicy(ctx context.Context, id string) (*PolicyAnswer, error) {
	var out PolicyAnswer
	return &out, c.call(ctx, request{method: "GET", path: sandboxPath(id) + "/policy"}, &out)
}

// SetPolicy applies policy (a map, a struct or json.RawMessage) over a
// sandbox's security policy: each section it sets replaces that section
// whole, each it leaves out keeps its rules, an empty one ({}) clears
// it. The answer holds the whole policy now. resource_limits.memory_mb
// and disk_write_mb resize the running sandbox (up to the account's
// maxima); filesystem rules are fixed at create.
func (c *Client) SetPolicy(ctx context.Context, id string, policy any) (*PolicyAnswer, error) {
	var out PolicyAnswer
	return &out, c.call(ctx, request{method: "PUT", path: sandboxPath(id) + "/policy", json: policy}, &out)
}
