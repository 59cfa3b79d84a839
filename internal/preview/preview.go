// Package preview is what a preview is: HTTP (and anything HTTP upgrades
// to) from a client to a port inside a sandbox, proxied through its agent
// (agentproto's port.connect: the sandbox has only lo). It owns the forms
// a request names a preview in (Target), the credentials that open a
// private one (the sandbox's preview token, signed expiring URLs and the
// cookie they set: Keys), and the reverse proxy that carries a request
// there and its answer back (Proxy), with the rules that keep Sheepfold's
// credentials from an app and an app's answer from acting on the API's
// origin.
//
// It does not route, authenticate API keys, hold a tenant's shares,
// decide which ports are public or find sandboxes: the server
// (internal/server, preview.go) looks at each request's Host and path,
// finds the running sandbox, decides whether its port is public (a port
// made public through /v1, E2B's public traffic), holds the stream and
// then hands the request here; the proxy reaches a sandbox only through
// the Dial it is given.
//
// # Origins
//
// A preview lives on an origin of its own, never the API's: the host form
// {port}-{id}.{domain} (DefaultDomain "localhost", which browsers resolve
// to the loopback and treat as a public suffix, so that each preview is
// also a site of its own). The server tells the two sides apart by Host
// alone:
//   - a Host under the preview domain is a preview, or E2B's envd or
//     interpreter when it names their ports, and nothing else: never the
//     API, the dashboard or the E2B control plane;
//   - any other Host is the API's origin, where an app's answer is never
//     a page a browser runs. The path form /v1/sandboxes/{id}/proxy/{port}/
//     redirects browsers to the host form (Redirect) and serves programs
//     (curl, the SDKs, bench), as does E2B's E2b-Sandbox-Id/E2b-Sandbox-Port
//     header form; what these serve is sandboxed (Target.APIOrigin).
//
// Nothing of the client's credentials for the API reaches an app, in any
// form: Sheepfold's preview token, traffic token, sf_preview parameter and
// cookie, the dashboard's cookie and header (ProxyConfig's StripHeaders
// and StripCookies), any header carrying an API key; on the API's origin
// also every cookie and Authorization (they are the API origin's). Nothing
// an app answers acts on the API's origin: on it, Set-Cookie and the
// headers that act on an origin are dropped and the answer carries
// Content-Security-Policy: sandbox (an opaque origin, no script); on its
// own origin, its cookies lose their Domain. A dashboard's cookie
// authenticates nothing on a host that shares a registrable domain with
// the previews (DashboardAllowed, golang.org/x/net/publicsuffix).
//
// # Access
//
// Access is private unless the server says the port is public. A private
// port takes the sandbox's preview token (Sheepfold-Preview-Token header:
// an HMAC of the sandbox id under a key drawn at start, so nothing is
// stored and tokens die with the server, as sandboxes do), a signed and
// expiring sf_preview query parameter ("<expiry>.<HMAC of sandbox, port,
// expiry>", which sets a cookie of the same name, scoped to that preview,
// and redirects to the URL without it), or E2B's traffic token
// (E2B-Traffic-Access-Token, which internal/e2b checks). API keys are not
// preview credentials. Refusals and failures are small HTML pages (Page):
// 401 private, 403 the sandbox's egress proxy port, 502 nothing listening,
// 502 the app did not answer.
//
// # The proxy
//
// One httputil.ReverseProxy whose transport dials "{sandbox id}:{port}"
// through ProxyConfig.Dial and keeps those connections alive between
// requests (64 idle per sandbox port), so a request on a warm connection
// costs two extra copies through the agent, no new dial; its 32 KiB copy
// buffers come from a pool, so a small GET allocates about 15 kB
// (internal/server's BenchmarkPreview). The app sees the client's Host and
// X-Forwarded-For/-Host/-Proto (and X-Forwarded-Prefix for the path
// form, whose prefix is cut); upgrades (WebSocket) are hijacked and
// copied both ways; streamed responses are flushed as they come.
//
// Imports: internal/auth (the shape of an API key, which never reaches an
// app), internal/bound (expires_in) and internal/sandbox (the dial
// errors a page explains).
package preview

import (
	"errors"
	"fmt"
	"html"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"golang.org/x/net/publicsuffix"
)

// Names of the preview credentials.
const (
	TokenHeader        = "Sheepfold-Preview-Token"
	Param              = "sf_preview" // the signed query parameter, and the cookie it sets
	TrafficTokenHeader = "E2B-Traffic-Access-Token"
)

// DefaultDomain is the preview domain of a server given none.
const DefaultDomain = "localhost"

// PathPrefix begins the path form /v1/sandboxes/{id}/proxy/{port}/...
const PathPrefix = "/v1/sandboxes/"

// Form says how a request named its sandbox and port.
type Form int

const (
	FormPath Form = iota // /v1/sandboxes/{id}/proxy/{port}/...
	FormHost             // {port}-{id}.{domain}
	FormE2B              // E2b-Sandbox-Id / E2b-Sandbox-Port headers
)

// Target is the sandbox port a preview request goes to.
type Target struct {
	Form   Form
	ID     string
	Port   int
	Prefix string // FormPath: the path up to and excluding the app's own path
}

// APIOrigin reports whether t is served on the API's origin (the path
// and E2B header forms) rather than on an origin of its own.
func (t *Target) APIOrigin() bool { return t.Form != FormHost }

// UnderDomain returns what of host (its port and a final dot aside)
// precedes "."+domain, if host is under domain. The domain itself is not
// under it: with the default "localhost", the API may be reached as
// localhost.
func UnderDomain(host, domain string) (string, bool) {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	label, ok := strings.CutSuffix(host, "."+domain)
	return label, ok && label != ""
}

// HostTarget parses the label {port}-{id} of a host under the preview
// domain.
func HostTarget(label string) (Target, bool) {
	ps, id, ok := strings.Cut(label, "-")
	port, err := strconv.Atoi(ps)
	if !ok || err != nil || port < 1 || port > 65535 || strconv.Itoa(port) != ps || id == "" || strings.Contains(id, ".") {
		return Target{}, false
	}
	return Target{Form: FormHost, ID: id, Port: port}, true
}

// PathTarget parses the path form /v1/sandboxes/{id}/proxy/{port}/...
func PathTarget(path string) (Target, bool) {
	rest, ok := strings.CutPrefix(path, PathPrefix)
	if !ok {
		return Target{}, false
	}
	id, rest, ok := strings.Cut(rest, "/")
	if !ok || id == "" {
		return Target{}, false
	}
	rest, ok = strings.CutPrefix(rest, "proxy/")
	if !ok {
		return Target{}, false
	}
	ps, _, _ := strings.Cut(rest, "/")
	port, err := strconv.Atoi(ps)
	if err != nil || port < 1 || port > 65535 || strconv.Itoa(port) != ps {
		return Target{}, false
	}
	return Target{Form: FormPath, ID: id, Port: port, Prefix: PathPrefix + id + "/proxy/" + ps}, true
}

// FromBrowser reports whether r comes from a web browser: browsers send
// Fetch Metadata (Sec-Fetch-*) to trustworthy origins (https, localhost)
// and a Mozilla/ User-Agent everywhere. A browser that sends neither is
// still served a sandboxed answer (the proxy's answers on the API's
// origin).
func FromBrowser(r *http.Request) bool {
	return r.Header.Get("Sec-Fetch-Mode") != "" || r.Header.Get("Sec-Fetch-Dest") != "" ||
		r.Header.Get("Sec-Fetch-Site") != "" || strings.HasPrefix(r.UserAgent(), "Mozilla/")
}

// Scheme is the scheme r reached the server with (behind a TLS proxy,
// its X-Forwarded-Proto).
func Scheme(r *http.Request) string {
	if r.TLS != nil || r.Header.Get("X-Forwarded-Proto") == "https" {
		return "https"
	}
	return "http"
}

// Host is the Host of port of sandbox id's preview under domain, on the
// port r came to (previews share the API's listener).
func Host(r *http.Request, domain, id string, port int) string {
	host := strconv.Itoa(port) + "-" + id + "." + domain
	if _, lp, err := net.SplitHostPort(r.Host); err == nil && lp != "" {
		host = net.JoinHostPort(host, lp)
	}
	return host
}

// Redirect sends a browser that asked for t in the path form to the host
// form under domain, so that the app runs on its own origin.
func Redirect(w http.ResponseWriter, r *http.Request, domain string, t Target) {
	u := url.URL{Scheme: Scheme(r), Host: Host(r, domain, t.ID, t.Port), Path: strings.TrimPrefix(r.URL.Path, t.Prefix), RawQuery: r.URL.RawQuery}
	if raw, ok := strings.CutPrefix(r.URL.RawPath, t.Prefix); ok {
		u.RawPath = raw
	}
	if u.Path == "" {
		u.Path, u.RawPath = "/", ""
	}
	w.Header().Set("Cache-Control", "no-store")
	http.Redirect(w, r, u.String(), http.StatusTemporaryRedirect)
}

// DashboardAllowed reports whether the dashboard's cookie may
// authenticate on host: not when host is same-site with previews under
// domain (it and the preview domain share a registrable domain, as
// api.example.com and preview.example.com do), since a preview could then
// set cookies the dashboard would receive (a session of the tenant's own,
// in place of the viewer's). With a preview domain that is itself a
// public suffix (localhost by default; a name on the Public Suffix List),
// each preview is a site of its own and no host shares one with it.
func DashboardAllowed(domain, host string) bool {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	if net.ParseIP(host) != nil {
		return true
	}
	one := "0-x." + domain
	previews, err := publicsuffix.EffectiveTLDPlusOne(one)
	if err != nil || previews == one {
		return true
	}
	site, err := publicsuffix.EffectiveTLDPlusOne(host)
	return err != nil || site != previews
}

// CheckDomain checks a preview domain (serve --preview-domain): a DNS
// name without scheme, port or wildcard, such as "preview.example.com" or
// "localhost".
func CheckDomain(d string) error {
	if len(d) > 200 {
		return errors.New("too long")
	}
	for _, label := range strings.Split(d, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return fmt.Errorf("%q is not a DNS name (give the domain alone, as preview.example.com)", d)
		}
		for _, c := range label {
			if !(c == '-' || '0' <= c && c <= '9' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z') {
				return fmt.Errorf("%q is not a DNS name (give the domain alone, as preview.example.com)", d)
			}
		}
	}
	return nil
}

// Page writes a small HTML page for a preview that cannot be shown.
func Page(w http.ResponseWriter, status int, title, msg string) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	fmt.Fprintf(w, "<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>%s</title></head>\n<body><h1>%s</h1>\n<p>%s</p>\n<p><small>Sheepfold preview · %d</small></p></body></html>\n",
		html.EscapeString(title), html.EscapeString(title), html.EscapeString(msg), status)
}

// Refused answers a preview request that may not reach t.
func Refused(w http.ResponseWriter, t Target) {
	Page(w, http.StatusUnauthorized, "This preview is private",
		fmt.Sprintf("Port %d of sandbox %s is private: open it with a signed preview URL, or send the sandbox's %s header.", t.Port, t.ID, TokenHeader))
}
