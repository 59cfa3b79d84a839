package preview

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sheepfold/sheepfold/internal/auth"
	"github.com/sheepfold/sheepfold/internal/sandbox"
)

// ProxyConfig is what the proxy needs of the server.
type ProxyConfig struct {
	// Dial opens a connection to port of the running sandbox id (through
	// its agent). Its errors sandbox.ErrEgressPort and
	// sandbox.ErrNoListener are explained to the client.
	Dial func(ctx context.Context, id string, port int) (net.Conn, error)
	// StripHeaders and StripCookies are the server's other credentials
	// (the dashboard's header and cookie), removed from what an app sees
	// as the preview's own are.
	StripHeaders []string
	StripCookies []string
	// Logger logs what an app or a dial failed with [slog.Default()].
	Logger *slog.Logger
	// RequestID names a request in the log [none].
	RequestID func(context.Context) string
}

// Proxy is the reverse proxy of every preview: one transport whose
// connections to "{id}:{port}" are Dial calls, kept alive and reused
// between requests.
type Proxy struct {
	cfg ProxyConfig
	rp  *httputil.ReverseProxy
}

type ctxKey struct{}

// NewProxy returns the proxy of cfg.
func NewProxy(cfg ProxyConfig) *Proxy {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.RequestID == nil {
		cfg.RequestID = func(context.Context) string { return "" }
	}
	p := &Proxy{cfg: cfg}
	tr := &http.Transport{
		Proxy:               nil, // never the environment's proxy
		DialContext:         p.dial,
		MaxIdleConns:        1024,
		MaxIdleConnsPerHost: 64,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true, // pass the client's Accept-Encoding and the app's encoding through
	}
	p.rp = &httputil.ReverseProxy{
		Transport:  tr,
		BufferPool: buffers,
		Rewrite: func(pr *httputil.ProxyRequest) {
			t := pr.In.Context().Value(ctxKey{}).(*Target)
			pr.Out.URL.Scheme = "http"
			pr.Out.URL.Host = t.ID + ":" + strconv.Itoa(t.Port)
			if t.Form == FormPath {
				pr.Out.URL.Path = strings.TrimPrefix(pr.In.URL.Path, t.Prefix)
				pr.Out.URL.RawPath = strings.TrimPrefix(pr.In.URL.RawPath, t.Prefix)
				pr.Out.Header.Set("X-Forwarded-Prefix", t.Prefix)
			}
			pr.Out.Host = pr.In.Host
			pr.SetXForwarded()
			p.strip(pr.Out, t.APIOrigin())
		},
		ModifyResponse: response,
		ErrorHandler:   p.failed,
	}
	return p
}

// Serve proxies r to t. The caller has decided that r may reach it
// (Keys.Allowed, Keys.Redeem) and holds whatever shares it keeps.
func (p *Proxy) Serve(w http.ResponseWriter, r *http.Request, t Target) {
	p.rp.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), ctxKey{}, &t)))
}

// AddSlash redirects a request for the path form's bare prefix to the
// prefix and a slash, since the app's relative links need it, and reports
// whether it did.
func AddSlash(w http.ResponseWriter, r *http.Request, t Target) bool {
	if t.Form != FormPath || r.URL.Path != t.Prefix {
		return false
	}
	u := *r.URL
	u.Path += "/"
	u.RawPath = ""
	http.Redirect(w, r, u.RequestURI(), http.StatusPermanentRedirect)
	return true
}

// buffers are the proxy's copy buffers, reused: without a pool,
// ReverseProxy allocates 32 KiB for every response it copies, which was
// two thirds of the bytes a small preview GET allocated.
var buffers = &bufferPool{}

type bufferPool struct{ p sync.Pool }

const bufferSize = 32 << 10

func (b *bufferPool) Get() []byte {
	if v, ok := b.p.Get().(*[]byte); ok {
		return *v
	}
	return make([]byte, bufferSize)
}

func (b *bufferPool) Put(buf []byte) {
	if cap(buf) == bufferSize {
		buf = buf[:bufferSize]
		b.p.Put(&buf)
	}
}

// strip removes from what the app sees whatever the client holds for
// Sheepfold: the preview and traffic tokens, E2B's routing headers, the
// server's other credentials (ProxyConfig.StripHeaders, StripCookies),
// the sf_preview parameter and cookie, and any header carrying an API
// key. On the API's origin every cookie and Authorization belong to that
// origin (a dashboard session, a login of a proxy in front of the
// server): none passes. On the preview's own origin they are the app's,
// and pass.
func (p *Proxy) strip(out *http.Request, apiOrigin bool) {
	h := out.Header
	h.Del(TokenHeader)
	h.Del(TrafficTokenHeader)
	h.Del("E2b-Sandbox-Id")
	h.Del("E2b-Sandbox-Port")
	for _, k := range p.cfg.StripHeaders {
		h.Del(k)
	}
	if strings.Contains(out.URL.RawQuery, Param) {
		q := out.URL.Query()
		q.Del(Param)
		out.URL.RawQuery = q.Encode()
	}
	ours := func(name string) bool { return name == Param || slices.Contains(p.cfg.StripCookies, name) }
	if apiOrigin {
		h.Del("Cookie")
		h.Del("Authorization")
	} else if cs := h.Values("Cookie"); len(cs) > 0 {
		all := strings.Join(cs, ";")
		if strings.Contains(all, Param) || slices.ContainsFunc(p.cfg.StripCookies, func(c string) bool { return strings.Contains(all, c) }) {
			var kept []string
			for _, c := range out.Cookies() {
				if !ours(c.Name) {
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

// response keeps an app's answer from acting on an origin not its own.
// On the API's origin (programs' path form, E2B's header form) it sets
// no cookie and nothing else of that origin, and a browser that renders
// it anyway gives it an opaque origin and runs no script in it
// (Content-Security-Policy: sandbox). On the preview's own origin its
// cookies stay there: their Domain attribute, which could widen them to
// the parent domain the API may be under, is removed.
func response(res *http.Response) error {
	t, _ := res.Request.Context().Value(ctxKey{}).(*Target)
	h := res.Header
	if t == nil || t.APIOrigin() {
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

// dial opens a connection to "{id}:{port}" through ProxyConfig.Dial.
func (p *Proxy) dial(ctx context.Context, _, addr string) (net.Conn, error) {
	id, ps, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	port, err := strconv.Atoi(ps)
	if err != nil {
		return nil, err
	}
	return p.cfg.Dial(ctx, id, port)
}

// failed answers a request the proxy could not complete.
func (p *Proxy) failed(w http.ResponseWriter, r *http.Request, err error) {
	t := r.Context().Value(ctxKey{}).(*Target)
	switch {
	case errors.Is(err, sandbox.ErrEgressPort):
		Page(w, http.StatusForbidden, "Not a preview",
			fmt.Sprintf("Port %d of sandbox %s is its egress proxy, which only its own code reaches.", t.Port, t.ID))
	case errors.Is(err, sandbox.ErrNoListener):
		Page(w, http.StatusBadGateway, "Nothing is listening",
			fmt.Sprintf("Nothing listens on port %d inside sandbox %s. Start a server on that port (on 127.0.0.1, ::1 or all addresses) and reload.", t.Port, t.ID))
	case r.Context().Err() != nil:
		// The client went away.
	default:
		p.cfg.Logger.Warn("preview proxy", "request_id", p.cfg.RequestID(r.Context()), "sandbox", t.ID, "port", t.Port, "err", err)
		Page(w, http.StatusBadGateway, "The app did not answer",
			fmt.Sprintf("Port %d of sandbox %s could not be reached or broke off its answer.", t.Port, t.ID))
	}
}
