package server

// Preview URLs: HTTP (and anything HTTP upgrades to) to a port inside a
// sandbox, proxied through its agent (agentproto's port.connect: the
// sandbox has only lo). Three ways in, one proxy:
//   - the path form /v1/sandboxes/{id}/proxy/{port}/...;
//   - the host form {port}-{id}.{PreviewDomain};
//   - E2B's E2b-Sandbox-Id and E2b-Sandbox-Port headers (ports other than
//     envd's and the interpreter's; internal/e2b hands them here).
//
// Access is private unless the port was made public (PUT
// /v1/sandboxes/{id}/ports/{port}) or the sandbox was created through
// E2B with public traffic (E2B's default). A private port takes the
// sandbox's preview token (Sheepfold-Preview-Token header), a signed and
// expiring sf_preview query parameter (which sets a cookie of the same
// name, scoped to that preview, and redirects to the URL without it), or
// E2B's traffic token (E2B-Traffic-Access-Token). API keys are not
// preview credentials: Authorization passes to the app untouched, and
// Sheepfold's own credentials are removed from what the app sees.

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
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
	"github.com/sheepfold/sheepfold/internal/e2b"
	"github.com/sheepfold/sheepfold/internal/sandbox"
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

const proxyPathPrefix = "/v1/sandboxes/"

// previewOf recognises a preview request by its path or Host (the E2B
// header form reaches the proxy through internal/e2b). A Host of the
// preview domain naming envd's or the interpreter's port is E2B's:
// routing headers are set and ok is false, so that internal/e2b takes it.
func (s *Server) previewOf(r *http.Request) (previewTarget, bool) {
	if d := s.cfg.PreviewDomain; d != "" {
		if t, ok := hostTarget(r.Host, d); ok {
			if p := strconv.Itoa(t.port); p == e2b.EnvdPort || p == e2b.InterpreterPort {
				r.Header.Set("E2b-Sandbox-Id", t.id)
				r.Header.Set("E2b-Sandbox-Port", p)
				return previewTarget{}, false
			}
			return t, true
		}
	}
	rest, ok := strings.CutPrefix(r.URL.Path, proxyPathPrefix)
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

// isPreview reports whether r is a preview request, of any form.
func (s *Server) isPreview(r *http.Request) bool {
	if p := r.Header.Get("E2b-Sandbox-Port"); p != "" {
		return p != e2b.EnvdPort && p != e2b.InterpreterPort
	}
	if d := s.cfg.PreviewDomain; d != "" {
		if _, ok := hostTarget(r.Host, d); ok {
			return true
		}
	}
	return strings.HasPrefix(r.URL.Path, proxyPathPrefix) && strings.Contains(r.URL.Path, "/proxy/")
}

// hostTarget parses {port}-{id}.{domain}[:listener port].
func hostTarget(host, domain string) (previewTarget, bool) {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	label, ok := strings.CutSuffix(strings.ToLower(host), "."+strings.ToLower(domain))
	if !ok || strings.Contains(label, ".") {
		return previewTarget{}, false
	}
	ps, id, ok := strings.Cut(label, "-")
	port, err := strconv.Atoi(ps)
	if !ok || err != nil || port < 1 || port > 65535 || strconv.Itoa(port) != ps || id == "" {
		return previewTarget{}, false
	}
	return previewTarget{form: formHost, id: id, port: port}, true
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
	s.metrics.previewRequest()
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
			stripPreviewCredentials(pr.Out)
		},
		ErrorHandler: s.previewError,
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

// stripPreviewCredentials removes Sheepfold's preview credentials and
// E2B's routing headers from what the app sees.
func stripPreviewCredentials(out *http.Request) {
	out.Header.Del(previewTokenHeader)
	out.Header.Del(trafficTokenHeader)
	out.Header.Del("E2b-Sandbox-Id")
	out.Header.Del("E2b-Sandbox-Port")
	if strings.Contains(out.URL.RawQuery, previewParam) {
		q := out.URL.Query()
		q.Del(previewParam)
		out.URL.RawQuery = q.Encode()
	}
	if cs := out.Header.Values("Cookie"); len(cs) > 0 && strings.Contains(strings.Join(cs, ";"), previewParam) {
		var kept []string
		for _, c := range out.Cookies() {
			if c.Name != previewParam {
				kept = append(kept, c.String())
			}
		}
		out.Header.Del("Cookie")
		if len(kept) > 0 {
			out.Header.Set("Cookie", strings.Join(kept, "; "))
		}
	}
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
	s.metrics.previewDialed(time.Since(start))
	return s.metrics.countPreview(nc), nil
}

// previewError answers a request the proxy could not complete.
func (s *Server) previewError(w http.ResponseWriter, r *http.Request, err error) {
	t := r.Context().Value(previewCtxKey{}).(*previewTarget)
	switch {
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
	URL       string    `json:"url,omitempty"`
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
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	id := b.sb.ID
	p := portJSON{Port: port, Addresses: []string{}, Public: s.portPublic(b, port) || s.e2b.PublicTraffic(id),
		ProxyURL: fmt.Sprintf("%s://%s%s%s/proxy/%d/", scheme, r.Host, proxyPathPrefix, id, port)}
	open := p.ProxyURL
	if d := s.cfg.PreviewDomain; d != "" {
		host := fmt.Sprintf("%d-%s.%s", port, id, d)
		if _, lp, err := net.SplitHostPort(r.Host); err == nil {
			host = net.JoinHostPort(host, lp)
		}
		p.URL = scheme + "://" + host + "/"
		open = p.URL
	}
	p.ExpiresAt = time.Now().Add(ttl).Truncate(time.Second).UTC()
	p.SignedURL = open + "?" + url.Values{previewParam: {s.signPreview(id, port, p.ExpiresAt)}}.Encode()
	return p
}

// previewTTL reads expires_in (seconds) for signed URLs.
func previewTTL(r *http.Request) (time.Duration, error) {
	v := r.URL.Query().Get("expires_in")
	if v == "" {
		return defaultPreviewURLTTL, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 1 || time.Duration(n)*time.Second > maxPreviewURLTTL {
		return 0, apierr.New(apierr.BadRequest, "expires_in must be a number of seconds between 1 and %d", int64(maxPreviewURLTTL/time.Second))
	}
	return time.Duration(n) * time.Second, nil
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
