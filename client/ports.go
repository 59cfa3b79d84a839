package client

import (
	"context"
	"net/url"
	"strconv"
	"time"

	"github.com/sheepfold/sheepfold/api"
)

// Port is a port of a sandbox and its preview URLs.
type Port = api.Port

// Ports are a sandbox's listening and public ports, and its preview token.
type Ports = api.PortList

// Ports lists a sandbox's listening ports with their preview URLs; the
// signed URLs live for signedFor (0: the server's default, an hour).
func (c *Client) Ports(ctx context.Context, sandboxID string, signedFor time.Duration) (*Ports, error) {
	var q url.Values
	if signedFor > 0 {
		q = url.Values{"expires_in": {strconv.FormatInt(int64(signedFor/time.Second), 10)}}
	}
	var out Ports
	return &out, c.call(ctx, request{method: "GET", path: sandboxPath(sandboxID, "ports"), query: q}, &out)
}

// SetPortPublic makes a port's preview public (no credential needed) or
// private again.
func (c *Client) SetPortPublic(ctx context.Context, sandboxID string, port int, public bool) (*Port, error) {
	var out Port
	return &out, c.call(ctx, request{method: "PUT", path: sandboxPath(sandboxID, "ports", strconv.Itoa(port)),
		json: map[string]bool{"public": public}}, &out)
}
