package server

// Preview URLs: HTTP (and anything HTTP upgrades to) to a port inside a
// sandbox, proxied through its agent (agentproto's port.connect: the
// sandbox has only lo).
//
// A preview lives on an origin of its own, never the API's: the host form
// {port}-{id}.{PreviewDomain} (default "localhost", which browsers resolve
// to the loopback and treat as a public suffix, so that each preview is
// also a site of its own). The server tells the two sides apart by Host
// alone (route):
//   - a Host under the preview domain is a preview, or E2B's envd or
//     interpreter when it names their ports, and nothing else: never the
//     API, the dashboard or the E2B control plane;
//   - any other Host is the API's origin, where an app's answer is never
//     a page a browser runs. The path form /v1/sandboxes/{id}/proxy/{port}/
//     redirects browsers to the host form and serves programs (curl, the
//     SDKs, bench), as does E2B's E2b-Sandbox-Id/E2b-Sandbox-Port header
//     form (internal/e2b hands ports other than envd's and the
//     interpreter's here); what these serve is sandboxed (apiOrigin).
//
// Nothing of the client's credentials for the API reaches an app, in any
// form: Sheepfold's preview token, traffic token, sf_preview parameter and
// cookie, the dashboard's cookie and header, any header carrying an API
// key; on the API's origin also every cookie and Authorization (they are
// the API origin's). Nothing an app answers acts on the API's origin: on
// it, Set-Cookie and the headers that act on an origin are dropped and
// the answer carries Content-Security-Policy: sandbox (an opaque origin,
// no script); on its own origin, its cookies lose their Domain.
//
// Access is private unless the port was made public (PUT
// /v1/sandboxes/{id}/ports/{port}) or the sandbox was created through
// E2B with public traffic (E2B's default). A private port takes the
// sandbox's preview token (Sheepfold-Preview-Token header), a signed and
// expiring sf_preview query parameter (which sets a cookie of the same
// name, scoped to that preview, and redirects to the URL without it), or
// E2B's traffic token (E2B-Traffic-Access-Token). API keys are not
// preview credentials.

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"html"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sheepfold/sheepfold/internal/apierr"
	"github.com/sheepfold/sheepfold/internal/auth"
	"github.com/sheepfold/sheepfold/internal/bound"
	"github.com/sheepfold/sheepfold/internal/e2b"
	"github.com/sheepfold/sheepfold/internal/sandbox"
	"golang.org/x/net/publicsuffix"
)

// Names of the preview credentials.
const (
	previewTokenHeader = "Sheepfold-Preview-Token"
	previewParam       = "sf_preview" // the signed query parameter, and the cookie it sets
	trafficTokenHeader = "E2B-Traffic-Access-Token"
)

// Signed preview URLs live between these bounds.
const (
	defaultPreviewURLTTL = time.Hour
	maxPreviewURLTTL     = 7 * 24 * time.Hour
)

// previewForm says how a request named its sandbox and port.
type previewForm int

const (
	formPath previewForm = iota // /v1/sandboxes/{id}/proxy/{port}/...
	formHost                    // {port}-{id}.{domain}
	formE2B                     // E2b-Sandbox-Id / E2b-Sandbox-Port headers
)

// previewTarget is the sandbox port a preview request goes to.
type previewTarget struct {
	form   previewForm
	id     string
	port   int
	prefix string // formPath: the path up to and excluding the app's own path
}

// apiOrigin reports whether t is served on the API's origin (the path
// and E2B header forms) rather than on an origin of its own.
func (t *previewTarget) apiOrigin() bool { return t.form != formHost }

const proxyPathPrefix = "/v1/sandboxes/"

// DefaultPreviewDomain is the preview domain of a server given none.
const DefaultPreviewDomain = "localhost"

// route sends each request to its side (see the file's comment): a Host
// under the preview domain to serveHost alone, the path form to
// servePath, E2B's surface to internal/e2b, the rest to the API's mux.
func (s *Server) route(mux http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if label, ok := underDomain(r.Host, s.cfg.PreviewDomain); ok {
			s.serveHost(w, r, label)
			return
		}
		if t, ok := pathTarget(r.URL.Path); ok {
			setRoute(r, "preview")
			s.servePath(w, r, t)
			return
		}
		if e2b.Handles(r) {
			setRoute(r, "e2b")
			s.e2b.ServeHTTP(w, r)
			return
		}
		mux.ServeHTTP(w, r)
	})
}

// serveHost serves a request whose Host is label.{preview domain}: the
// preview it names, or E2B's envd or interpreter for their ports, or a
// page saying there is no such preview. Never anything of the API.
func (s *Server) serveHost(w http.ResponseWriter, r *http.Request, label string) {
	t, ok := hostTarget(label)
	if !ok {
		setRoute(r, "preview")
		d := s.cfg.PreviewDomain
		previewPage(w, http.StatusNotFound, "No such preview",
			fmt.Sprintf("%s is under the preview domain %s, where only {port}-{sandbox id}.%s names a preview. The API is not served here.", r.Host, d, d))
		return
	}
	if p := strconv.Itoa(t.port); p == e2b.EnvdPort || p == e2b.InterpreterPort {
		r.Header.Set("E2b-Sandbox-Id", t.id)
		r.Header.Set("E2b-Sandbox-Port", p)
		setRoute(r, "e2b")
		s.e2b.ServeHTTP(w, r)
		return
	}
	setRoute(r, "preview")
	s.servePreview(w, r, t)
}

// servePath serves the path form. A browser is sent to the host form, so
// that the app runs on its own origin; a program (no Fetch Metadata, no
// browser's User-Agent) is served here, on the API's origin, sandboxed.
func (s *Server) servePath(w http.ResponseWriter, r *http.Request, t previewTarget) {
	if !fromBrowser(r) {
		s.servePreview(w, r, t)
		return
	}
	u := url.URL{Scheme: scheme(r), Host: s.previewHost(r, t.id, t.port), Path: strings.TrimPrefix(r.URL.Path, t.prefix), RawQuery: r.URL.RawQuery}
	if raw, ok := strings.CutPrefix(r.URL.RawPath, t.prefix); ok {
		u.RawPath = raw
	}
	if u.Path == "" {
		u.Path, u.RawPath = "/", ""
	}
	w.Header().Set("Cache-Control", "no-store")
	http.Redirect(w, r, u.String(), http.StatusTemporaryRedirect)
}

// fromBrowser reports whether r comes from a web browser: browsers send
// Fetch Metadata (Sec-Fetch-*) to trustworthy origins (https, localhost)
// and a Mozilla/ User-Agent everywhere. A browser that sends neither is
// still served a sandboxed answer (previewResponse).
func fromBrowser(r *http.Request) bool {
	return r.Header.Get("Sec-Fetch-Mode") != "" || r.Header.Get("Sec-Fetch-Dest") != "" ||
		r.Header.Get("Sec-Fetch-Site") != "" || strings.HasPrefix(r.UserAgent(), "Mozilla/")
}

// scheme is the scheme r reached the server with (behind a TLS proxy,
// its X-Forwarded-Proto).
func scheme(r *http.Request) string {
	if secureRequest(r) {
		return "https"
	}
	return "http"
}

// previewHost is the Host of port of sandbox id's preview, on the port r
// came to (previews share the API's listener).
func (s *Server) previewHost(r *http.Request, id string, port int) string {
	host := strconv.Itoa(port) + "-" + id + "." + s.cfg.PreviewDomain
	if _, lp, err := net.SplitHostPort(r.Host); err == nil && lp != "" {
		host = net.JoinHostPort(host, lp)
	}
	return host
}

// isPreview reports whether r is a preview request, of any form (its body
// is the app's to bound).
func (s *Server) isPreview(r *http.Request) bool {
	if label, ok := underDomain(r.Host, s.cfg.PreviewDomain); ok {
		t, ok := hostTarget(label)
		p := strconv.Itoa(t.port)
		return ok && p != e2b.EnvdPort && p != e2b.InterpreterPort
	}
	if p := r.Header.Get("E2b-Sandbox-Port"); p != "" {
		return p != e2b.EnvdPort && p != e2b.InterpreterPort
	}
	_, ok := pathTarget(r.URL.Path)
	return ok
}

// dashboardHostAllowed reports whether the dashboard's cookie may
// authenticate on host: not when host is same-site with previews (it and
// the preview domain share a registrable domain, as api.example.com and
// preview.example.com do), since a preview could then set cookies the
// dashboard would receive (a session of the tenant's own, in place of
// the viewer's). With a preview domain that is itself a public suffix
// (localhost by default; a name on the Public Suffix List), each preview
// is a site of its own and no host shares one with it.
func (s *Server) dashboardHostAllowed(host string) bool {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	if net.ParseIP(host) != nil {
		return true
	}
	one := "0-x." + s.cfg.PreviewDomain
	previews, err := publicsuffix.EffectiveTLDPlusOne(one)
	if err != nil || previews == one {
		return true
	}
	site, err := publicsuffix.EffectiveTLDPlusOne(host)
	return err != nil || site != previews
}

// underDomain returns what of host (its port and a final dot aside)
// precedes "."+domain, if host is under domain. The domain itself is not
// under it: with the default "localhost", the API may be reached as
// localhost.
func underDomain(host, domain string) (string, bool) {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	label, ok := strings.CutSuffix(host, "."+domain)
	return label, ok && label != ""
}

// hostTarget parses the label {port}-{id} of a host under the preview
// domain.
func hostTarget(label string) (previewTarget, bool) {
	ps, id, ok := strings.Cut(label, "-")
	port, err := strconv.Atoi(ps)
	if !ok || err != nil || port < 1 || port > 65535 || strconv.Itoa(port) != ps || id == "" || strings.Contains(id, ".") {
		return previewTarget{}, false
	}
	return previewTarget{form: formHost, id: id, port: port}, true
}

// pathTarget parses the path form /v1/sandboxes/{id}/proxy/{port}/...
func pathTarget(path string) (previewTarget, bool) {
	rest, ok := strings.CutPrefix(path, proxyPathPrefix)
	if !ok {
		return previewTarget{}, false
	}
	id, rest, ok := strings.Cut(rest, "/")
	if !ok || id == "" {
		return previewTarget{}, false
	}
	rest, ok = strings.CutPrefix(rest, "proxy/")
	if !ok {
		return previewTarget{}, false
	}
	ps, _, _ := strings.Cut(rest, "/")
	port, err := strconv.Atoi(ps)
	if err != nil || port < 1 || port > 65535 || strconv.Itoa(port) != ps {
		return previewTarget{}, false
	}
	return previewTarget{form: formPath, id: id, port: port, prefix: proxyPathPrefix + id + "/proxy/" + ps}, true
}

// e2bPreview serves E2B's header form (internal/e2b's Config.Ports).
func (s *Server) e2bPreview(w http.ResponseWriter, r *http.Request) {
	port, err := strconv.Atoi(r.Header.Get("E2b-Sandbox-Port"))
	if err != nil || port < 1 || port > 65535 {
		http.Error(w, "E2b-Sandbox-Port must be a port number", http.StatusBadRequest)
		return
	}
	s.servePreview(w, r, previewTarget{form: formE2B, id: r.Header.Get("E2b-Sandbox-Id"), port: port})
}

type previewCtxKey struct{}

// servePreview checks access to t and proxies r there.
func (s *Server) servePreview(w http.ResponseWriter, r *http.Request, t previewTarget) {
	if !s.previewCredentialed(r, t) && !s.previewMayBePublic(r.Context(), t.id) {
		previewRefused(w, t) // preauth.go: nothing adopted, nothing dialled
		return
	}
	b := s.liveBox(r.Context(), t.id)
	if b == nil {
		if t.form == formE2B {
			writeJSON(w, http.StatusBadGateway, map[string]any{"sandboxId": t.id, "message": "The sandbox was not found", "code": http.StatusBadGateway})
			return
		}
		previewPage(w, http.StatusBadGateway, "Sandbox not found",
			fmt.Sprintf("No running sandbox %q: it may have stopped.", t.id))
		return
	}
	if li := logInfoFrom(r.Context()); li != nil {
		li.owner, li.sandbox = b.owner, t.id
	}
	if t.form == formPath && r.URL.Path == t.prefix {
		// Relative links of the app need the trailing slash.
		u := *r.URL
		u.Path += "/"
		u.RawPath = ""
		http.Redirect(w, r, u.RequestURI(), http.StatusPermanentRedirect)
		return
	}
	if !s.previewAllowed(r, t, b) {
		if signed := r.URL.Query().Get(previewParam); signed != "" && s.validSigned(t, signed) {
			s.setPreviewCookie(w, r, t, signed)
			if r.Method == http.MethodGet || r.Method == http.MethodHead {
				u := *r.URL
				q := u.Query()
				q.Del(previewParam)
				u.RawQuery = q.Encode()
				http.Redirect(w, r, u.RequestURI(), http.StatusFound)
				return
			}
		} else {
			previewRefused(w, t)
			return
		}
	}
	release, err := s.holdPreview(b.owner, t.id) // conns.go
	if err != nil {
		s.previewBusy(w, t, err)
		return
	}
	defer release()
	s.metrics.PreviewRequest()
	s.preview.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), previewCtxKey{}, &t)))
}

// previewRefused answers a preview request that may not reach t.
func previewRefused(w http.ResponseWriter, t previewTarget) {
	previewPage(w, http.StatusUnauthorized, "This preview is private",
		fmt.Sprintf("Port %d of sandbox %s is private: open it with a signed preview URL, or send the sandbox's %s header.", t.port, t.id, previewTokenHeader))
}

// liveBox returns the running sandbox id of any owner, or nil. A replica
// looks it up by its record (shared.go).
func (s *Server) liveBox(ctx context.Context, id string) *box {
	if s.shared() {
		rec, err := s.store.GetSandbox(ctx, id)
		if err != nil {
			return nil
		}
		b, err := s.lookupRecord(ctx, rec)
		if err != nil {
			return nil
		}
		return b
	}
	s.mu.Lock()
	b, ok := s.boxes[id]
	s.mu.Unlock()
	if !ok || b.sb == nil || b.sb.State() != sandbox.StateRunning {
		return nil
	}
	return b
}

// previewAllowed reports whether r may reach t without a signed URL.
func (s *Server) previewAllowed(r *http.Request, t previewTarget, b *box) bool {
	if s.portPublic(b, t.port) || s.e2b.PublicTraffic(t.id) {
		return true
	}
	if tok := r.Header.Get(previewTokenHeader); tok != "" {
		return hmac.Equal([]byte(tok), []byte(s.boxToken(b)))
	}
	if tok := r.Header.Get(trafficTokenHeader); tok != "" {
		return s.e2b.ValidTrafficToken(t.id, tok)
	}
	if c, err := r.Cookie(previewParam); err == nil {
		return s.validSigned(t, c.Value)
	}
	return false
}

// portPublic reports whether port of b was made public.
func (s *Server) portPublic(b *box, port int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return b.public[port]
}

// previewToken is sandbox id's preview token: an HMAC under the server's
// preview key, so nothing is stored, and it dies with the server (as its
// sandboxes do).
func (s *Server) previewToken(id string) string {
	return "sfp_" + s.previewMAC("token", id)
}

// boxToken is b's preview token, computed once: a preview request checks
// it each time.
func (s *Server) boxToken(b *box) string {
	if p := b.token.Load(); p != nil {
		return *p
	}
	tok := s.previewToken(b.sb.ID)
	b.token.Store(&tok)
	return tok
}

func (s *Server) previewMAC(parts ...string) string {
	m := hmac.New(sha256.New, s.previewKey)
	m.Write([]byte(strings.Join(parts, "\x00")))
	return hex.EncodeToString(m.Sum(nil)[:20])
}

// signPreview returns the value of a signed preview parameter for t,
// valid until exp: "<unix exp>.<HMAC of the sandbox, port and exp>".
func (s *Server) signPreview(id string, port int, exp time.Time) string {
	e := strconv.FormatInt(exp.Unix(), 10)
	return e + "." + s.previewMAC("url", id, strconv.Itoa(port), e)
}

// validSigned checks a signed preview value for t, and that it has not
// expired.
func (s *Server) validSigned(t previewTarget, v string) bool {
	e, _, ok := strings.Cut(v, ".")
	exp, err := strconv.ParseInt(e, 10, 64)
	if !ok || err != nil || time.Now().Unix() >= exp {
		return false
	}
	return hmac.Equal([]byte(v), []byte(s.signPreview(t.id, t.port, time.Unix(exp, 0))))
}

// setPreviewCookie keeps a signed preview value for the rest of its life,
// scoped to this preview (its host, or its path).
func (s *Server) setPreviewCookie(w http.ResponseWriter, r *http.Request, t previewTarget, v string) {
	e, _, _ := strings.Cut(v, ".")
	exp, _ := strconv.ParseInt(e, 10, 64)
	path := "/"
	if t.form == formPath {
		path = t.prefix + "/"
	}
	http.SetCookie(w, &http.Cookie{Name: previewParam, Value: v, Path: path, Expires: time.Unix(exp, 0),
		HttpOnly: true, Secure: r.TLS != nil, SameSite: http.SameSiteLaxMode})
}

// newPreviewProxy returns the reverse proxy of every preview: one
// transport whose connections to "{id}:{port}" are port.connect calls to
// that sandbox's agent, kept alive and reused between requests.
func (s *Server) newPreviewProxy() *httputil.ReverseProxy {
	tr := &http.Transport{
		Proxy:               nil, // never the environment's proxy
		DialContext:         s.dialPreview,
		MaxIdleConns:        1024,
		MaxIdleConnsPerHost: 64,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true, // pass the client's Accept-Encoding and the app's encoding through
	}
	return &httputil.ReverseProxy{
		Transport:  tr,
		BufferPool: previewBuffers,
		Rewrite: func(pr *httputil.ProxyRequest) {
			t := pr.In.Context().Value(previewCtxKey{}).(*previewTarget)
			pr.Out.URL.Scheme = "http"
			pr.Out.URL.Host = t.id + ":" + strconv.Itoa(t.port)
			if t.form == formPath {
				pr.Out.URL.Path = strings.TrimPrefix(pr.In.URL.Path, t.prefix)
				pr.Out.URL.RawPath = strings.TrimPrefix(pr.In.URL.RawPath, t.prefix)
				pr.Out.Header.Set("X-Forwarded-Prefix", t.prefix)
			}
			pr.Out.Host = pr.In.Host
			pr.SetXForwarded()
			stripPreviewCredentials(pr.Out, t.apiOrigin())
		},
		ModifyResponse: previewResponse,
		ErrorHandler:   s.previewError,
	}
}

// previewBuffers are the proxy's copy buffers, reused: without a pool,
// ReverseProxy allocates 32 KiB for every response it copies, which was
// two thirds of the bytes a small preview GET allocated.
var previewBuffers = &bufferPool{}

type bufferPool struct{ p sync.Pool }

const previewBufferSize = 32 << 10

func (b *bufferPool) Get() []byte {
	if v, ok := b.p.Get().(*[]byte); ok {
		return *v
	}
	return make([]byte, previewBufferSize)
}

func (b *bufferPool) Put(buf []byte) {
	if cap(buf) == previewBufferSize {
		buf = buf[:previewBufferSize]
		b.p.Put(&buf)
	}
}

// stripPreviewCredentials removes from what the app sees whatever the
// client holds for Sheepfold: the preview and traffic tokens, E2B's
// routing headers, the dashboard's header, the sf_preview parameter,
// Sheepfold's cookies, and any header carrying an API key. On the API's
// origin every cookie and Authorization belong to that origin (a
// dashboard session, a login of a proxy in front of the server): none
// passes. On the preview's own origin they are the app's, and pass.
func stripPreviewCredentials(out *http.Request, apiOrigin bool) {
	h := out.Header
	h.Del(previewTokenHeader)
	h.Del(trafficTokenHeader)
	h.Del("E2b-Sandbox-Id")
	h.Del("E2b-Sandbox-Port")
	h.Del(uiHeader)
	if strings.Contains(out.URL.RawQuery, previewParam) {
		q := out.URL.Query()
		q.Del(previewParam)
		out.URL.RawQuery = q.Encode()
	}
	if apiOrigin {
		h.Del("Cookie")
		h.Del("Authorization")
	} else if cs := h.Values("Cookie"); len(cs) > 0 {
		if all := strings.Join(cs, ";"); strings.Contains(all, previewParam) || strings.Contains(all, uiCookie) {
			var kept []string
			for _, c := range out.Cookies() {
				if c.Name != previewParam && c.Name != uiCookie {
					kept = append(kept, c.String())
				}
			}
			h.Del("Cookie")
			if len(kept) > 0 {
				h.Set("Cookie", strings.Join(kept, "; "))
			}
		}
	}
	for name, vs := range h {
		if slices.ContainsFunc(vs, carriesKey) {
			delete(h, name)
		}
	}
}

// carriesKey reports whether a header value holds an API key (auth's
// shape: sf_ or e2b_ and 40 lowercase hex characters), as is or inside
// HTTP Basic credentials.
func carriesKey(v string) bool {
	if hasKey(v) {
		return true
	}
	if sch, rest, ok := strings.Cut(v, " "); ok && strings.EqualFold(sch, "Basic") {
		b, err := base64.StdEncoding.DecodeString(strings.TrimSpace(rest))
		return err == nil && hasKey(string(b))
	}
	return false
}

func hasKey(v string) bool {
	for _, p := range []string{auth.PrefixSheepfold, auth.PrefixE2B} {
		for rest := v; ; {
			i := strings.Index(rest, p)
			if i < 0 {
				break
			}
			rest = rest[i+len(p):]
			if len(rest) >= 40 && isLowerHex(rest[:40]) {
				return true
			}
		}
	}
	return false
}

func isLowerHex(s string) bool {
	for _, c := range []byte(s) {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// apiOriginDropped are the answer headers that act on the origin they
// are served from: none of an app's may act on the API's.
var apiOriginDropped = []string{"Set-Cookie", "Set-Cookie2", "Clear-Site-Data", "Alt-Svc",
	"Strict-Transport-Security", "Service-Worker-Allowed", "Origin-Agent-Cluster"}

// previewResponse keeps an app's answer from acting on an origin not its
// own. On the API's origin (programs' path form, E2B's header form) it
// sets no cookie and nothing else of that origin, and a browser that
// renders it anyway gives it an opaque origin and runs no script in it
// (Content-Security-Policy: sandbox). On the preview's own origin its
// cookies stay there: their Domain attribute, which could widen them to
// the parent domain the API may be under, is removed.
func previewResponse(res *http.Response) error {
	t, _ := res.Request.Context().Value(previewCtxKey{}).(*previewTarget)
	h := res.Header
	if t == nil || t.apiOrigin() {
		for _, k := range apiOriginDropped {
			h.Del(k)
		}
		h.Add("Content-Security-Policy", "sandbox")
		h.Set("X-Content-Type-Options", "nosniff")
		return nil
	}
	for i, c := range h["Set-Cookie"] {
		h["Set-Cookie"][i] = hostOnlyCookie(c)
	}
	return nil
}

// hostOnlyCookie returns a Set-Cookie value without its Domain attribute.
func hostOnlyCookie(c string) string {
	if !strings.Contains(strings.ToLower(c), "domain") {
		return c
	}
	parts := strings.Split(c, ";")
	kept := parts[:1]
	for _, a := range parts[1:] {
		name, _, _ := strings.Cut(a, "=")
		if !strings.EqualFold(strings.TrimSpace(name), "domain") {
			kept = append(kept, a)
		}
	}
	return strings.Join(kept, ";")
}

// dialPreview opens a connection to "{id}:{port}" through the sandbox's
// agent.
func (s *Server) dialPreview(ctx context.Context, _, addr string) (net.Conn, error) {
	id, ps, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	port, err := strconv.Atoi(ps)
	if err != nil {
		return nil, err
	}
	b := s.liveBox(ctx, id)
	if b == nil {
		return nil, notFound(id)
	}
	start := time.Now()
	nc, err := b.sb.DialPort(ctx, port)
	if err != nil {
		return nil, err
	}
	s.metrics.PreviewDialed(time.Since(start))
	return s.metrics.CountPreview(nc), nil
}

// previewError answers a request the proxy could not complete.
func (s *Server) previewError(w http.ResponseWriter, r *http.Request, err error) {
	t := r.Context().Value(previewCtxKey{}).(*previewTarget)
	switch {
	case errors.Is(err, sandbox.ErrEgressPort):
		previewPage(w, http.StatusForbidden, "Not a preview",
			fmt.Sprintf("Port %d of sandbox %s is its egress proxy, which only its own code reaches.", t.port, t.id))
	case errors.Is(err, sandbox.ErrNoListener):
		previewPage(w, http.StatusBadGateway, "Nothing is listening",
			fmt.Sprintf("Nothing listens on port %d inside sandbox %s. Start a server on that port (on 127.0.0.1, ::1 or all addresses) and reload.", t.port, t.id))
	case r.Context().Err() != nil:
		// The client went away.
	default:
		s.log.Warn("preview proxy", "request_id", requestIDFrom(r.Context()), "sandbox", t.id, "port", t.port, "err", err)
		previewPage(w, http.StatusBadGateway, "The app did not answer",
			fmt.Sprintf("Port %d of sandbox %s could not be reached or broke off its answer.", t.port, t.id))
	}
}

// previewPage writes a small HTML page for a preview that cannot be shown.
func previewPage(w http.ResponseWriter, status int, title, msg string) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	fmt.Fprintf(w, "<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>%s</title></head>\n<body><h1>%s</h1>\n<p>%s</p>\n<p><small>Sheepfold preview · %d</small></p></body></html>\n",
		html.EscapeString(title), html.EscapeString(title), html.EscapeString(msg), status)
}

// The ports API.

func (s *Server) portRoutes(add addFunc) {
	add("GET /v1/sandboxes/{id}/ports", true, s.listPorts)
	add("PUT /v1/sandboxes/{id}/ports/{port}", true, s.setPort)
}

// portJSON is one port of GET /v1/sandboxes/{id}/ports.
type portJSON struct {
	Port      int       `json:"port"`
	Listening bool      `json:"listening"`
	Addresses []string  `json:"addresses"`
	Public    bool      `json:"public"`
	URL       string    `json:"url"`
	ProxyURL  string    `json:"proxy_url"`
	SignedURL string    `json:"signed_url"`
	ExpiresAt time.Time `json:"signed_url_expires_at"`
}

type portsJSON struct {
	Ports []portJSON `json:"ports"`
	// Token is the sandbox's preview token, for the Sheepfold-Preview-Token header.
	Token       string `json:"token"`
	TokenHeader string `json:"token_header"`
}

func (s *Server) listPorts(w http.ResponseWriter, r *http.Request) error {
	b, err := s.lookup(r)
	if err != nil {
		return err
	}
	ttl, err := previewTTL(r)
	if err != nil {
		return err
	}
	listening, err := b.sb.Ports(r.Context())
	if err != nil {
		return err
	}
	byPort := map[int]*portJSON{}
	var order []int
	entry := func(port int) *portJSON {
		if p, ok := byPort[port]; ok {
			return p
		}
		p := s.portOf(r, b, port, ttl)
		byPort[port] = &p
		order = append(order, port)
		return &p
	}
	for _, l := range listening {
		p := entry(l.Port)
		p.Listening = true
		p.Addresses = append(p.Addresses, l.Address)
	}
	s.mu.Lock()
	var public []int
	for port, on := range b.public {
		if on {
			public = append(public, port)
		}
	}
	s.mu.Unlock()
	for _, port := range public {
		entry(port)
	}
	out := portsJSON{Ports: make([]portJSON, 0, len(order)), Token: s.previewToken(b.sb.ID), TokenHeader: previewTokenHeader}
	slices.Sort(order)
	for _, port := range order {
		out.Ports = append(out.Ports, *byPort[port])
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s *Server) setPort(w http.ResponseWriter, r *http.Request) error {
	b, err := s.lookup(r)
	if err != nil {
		return err
	}
	port, err := strconv.Atoi(r.PathValue("port"))
	if err != nil || port < 1 || port > 65535 {
		return apierr.New(apierr.BadRequest, "port must be a number between 1 and 65535")
	}
	var req struct {
		Public *bool `json:"public"`
	}
	if err := decodeJSON(w, r, &req, false); err != nil {
		return err
	}
	if req.Public == nil {
		return apierr.New(apierr.BadRequest, "field \"public\" is required")
	}
	s.mu.Lock()
	if b.public == nil {
		b.public = map[int]bool{}
	}
	if *req.Public {
		b.public[port] = true
	} else {
		delete(b.public, port)
	}
	s.mu.Unlock()
	p := s.portOf(r, b, port, defaultPreviewURLTTL)
	if ls, err := b.sb.Ports(r.Context()); err == nil {
		for _, l := range ls {
			if l.Port == port {
				p.Listening = true
				p.Addresses = append(p.Addresses, l.Address)
			}
		}
	}
	writeJSON(w, http.StatusOK, p)
	return nil
}

// portOf describes port of b: its URLs as the caller reached the server.
func (s *Server) portOf(r *http.Request, b *box, port int, ttl time.Duration) portJSON {
	sch := scheme(r)
	id := b.sb.ID
	p := portJSON{Port: port, Addresses: []string{}, Public: s.portPublic(b, port) || s.e2b.PublicTraffic(id),
		URL:      sch + "://" + s.previewHost(r, id, port) + "/",
		ProxyURL: fmt.Sprintf("%s://%s%s%s/proxy/%d/", sch, r.Host, proxyPathPrefix, id, port)}
	p.ExpiresAt = time.Now().Add(ttl).Truncate(time.Second).UTC()
	p.SignedURL = p.URL + "?" + url.Values{previewParam: {s.signPreview(id, port, p.ExpiresAt)}}.Encode()
	return p
}

// previewTTL reads expires_in (seconds) for signed URLs.
func previewTTL(r *http.Request) (time.Duration, error) {
	v := r.URL.Query().Get("expires_in")
	if v == "" {
		return defaultPreviewURLTTL, nil
	}
	n, err := bound.ParseInt("expires_in", v, 1, int64(maxPreviewURLTTL/time.Second))
	return time.Duration(n) * time.Second, err
}

// CheckPreviewDomain checks a preview domain (serve --preview-domain): a
// DNS name without scheme, port or wildcard, such as "preview.example.com"
// or "localhost".
func CheckPreviewDomain(d string) error {
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
