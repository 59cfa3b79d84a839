package client

import (
	"context"
	"net/url"
	"strconv"
	"time"
)

// Port is a port of a sandbox and its preview URLs.
type Port struct {
	Port      int      `json:"port"`
	Listening bool     `json:"listening"` // something listens on it inside the sandbox
	Addresses []string `json:"addresses"` // what its listeners are bound to
	Public    bool     `json:"public"`    // its preview needs no credential
	// URL is the preview's own origin, http://{port}-{id}.{preview
	// domain}:{server port}/ (servers before its own origins: empty
	// without a preview domain); ProxyURL the path form, for programs
	// (browsers are sent to URL).
	URL      string `json:"url,omitempty"`
	ProxyURL string `json:"proxy_url"`
	// SignedURL opens the preview in a browser (it sets a cookie) until
	// ExpiresAt, private or not.
	SignedURL string    `json:"signed_url"`
	ExpiresAt time.Time `json:"signed_url_expires_at"`
}

// Ports are a sandbox's listening and public ports, and its preview token.
type Ports struct {
	Ports []Port `json:"ports"`
	// Token opens any private port of the sandbox when sent in the
	// TokenHeader header (Sheepfold-Preview-Token).
	Token       string `json:"token"`
	TokenHeader string `json:"token_header"`
}

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
