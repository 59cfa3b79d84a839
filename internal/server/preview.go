package server

// Previews' edge: which requests are previews (route, by Host, then
// path, then E2B's headers), the running sandbox a preview names, whether
// its port is public, the stream it holds, and the ports API
// (GET /v1/sandboxes/{id}/ports, PUT .../ports/{port}). What a preview is
// (its forms, its credentials, the proxy and what it strips) is
// internal/preview's.

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/sheepfold/sheepfold/api"
	"github.com/sheepfold/sheepfold/internal/apierr"
	"github.com/sheepfold/sheepfold/internal/e2b"
	"github.com/sheepfold/sheepfold/internal/preview"
)

// DefaultPreviewDomain is the preview domain of a server given none.
const DefaultPreviewDomain = preview.DefaultDomain

// route sends each request to its side (see the file's comment): a Host
// under the preview domain to serveHost alone, the path form to
// servePath, E2B's surface to internal/e2b, the rest to the API's mux.
func (s *Server) route(mux http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if label, ok := preview.UnderDomain(r.Host, s.cfg.PreviewDomain); ok {
			s.serveHost(w, r, label)
			return
		}
		if t, ok := preview.PathTarget(r.URL.Path); ok {
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
	t, ok := preview.HostTarget(label)
	if !ok {
		setRoute(r, "preview")
		d := s.cfg.PreviewDomain
		preview.Page(w, http.StatusNotFound, "No such preview",
			fmt.Sprintf("%s is under the preview domain %s, where only {port}-{sandbox id}.%s names a preview. The API is not served here.", r.Host, d, d))
		return
	}
	if p := strconv.Itoa(t.Port); p == e2b.EnvdPort || p == e2b.InterpreterPort {
		r.Header.Set("E2b-Sandbox-Id", t.ID)
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
func (s *Server) servePath(w http.ResponseWriter, r *http.Request, t preview.Target) {
	if !preview.FromBrowser(r) {
		s.servePreview(w, r, t)
		return
	}
	preview.Redirect(w, r, s.cfg.PreviewDomain, t)
}

// isPreview reports whether r is a preview request, of any form (its body
// is the app's to bound).
func (s *Server) isPreview(r *http.Request) bool {
	if label, ok := preview.UnderDomain(r.Host, s.cfg.PreviewDomain); ok {
		t, ok := preview.HostTarget(label)
		p := strconv.Itoa(t.Port)
		return ok && p != e2b.EnvdPort && p != e2b.InterpreterPort
	}
	if p := r.Header.Get("E2b-Sandbox-Port"); p != "" {
		return p != e2b.EnvdPort && p != e2b.InterpreterPort
	}
	_, ok := preview.PathTarget(r.URL.Path)
	return ok
}

// dashboardHostAllowed reports whether the dashboard's cookie may
// authenticate on host (preview.DashboardAllowed).
func (s *Server) dashboardHostAllowed(host string) bool {
	return preview.DashboardAllowed(s.cfg.PreviewDomain, host)
}

// e2bPreview serves E2B's header form (internal/e2b's Config.Ports).
func (s *Server) e2bPreview(w http.ResponseWriter, r *http.Request) {
	port, err := strconv.Atoi(r.Header.Get("E2b-Sandbox-Port"))
	if err != nil || port < 1 || port > 65535 {
		http.Error(w, "E2b-Sandbox-Port must be a port number", http.StatusBadRequest)
		return
	}
	s.servePreview(w, r, preview.Target{Form: preview.FormE2B, ID: r.Header.Get("E2b-Sandbox-Id"), Port: port})
}

// servePreview checks access to t and proxies r there.
func (s *Server) servePreview(w http.ResponseWriter, r *http.Request, t preview.Target) {
	if !s.previewCredentialed(r, t) && !s.previewMayBePublic(r.Context(), t.ID) {
		preview.Refused(w, t) // preauth.go: nothing adopted, nothing dialled
		return
	}
	b := s.liveBox(r.Context(), t.ID)
	if b == nil {
		if t.Form == preview.FormE2B {
			writeJSON(w, http.StatusBadGateway, map[string]any{"sandboxId": t.ID, "message": "The sandbox was not found", "code": http.StatusBadGateway})
			return
		}
		preview.Page(w, http.StatusBadGateway, "Sandbox not found",
			fmt.Sprintf("No running sandbox %q: it may have stopped.", t.ID))
		return
	}
	if li := logInfoFrom(r.Context()); li != nil {
		li.owner, li.sandbox = b.owner, t.ID
	}
	if preview.AddSlash(w, r, t) {
		return
	}
	public := s.portPublic(b, t.Port) || s.e2b.PublicTraffic(t.ID)
	traffic := func(tok string) bool { return s.e2b.ValidTrafficToken(t.ID, tok) }
	if !s.previewKeys.Allowed(r, t, public, s.boxToken(b), traffic) && !s.previewKeys.Redeem(w, r, t) {
		return
	}
	release, err := s.holdPreview(b.owner, t.ID) // conns.go
	if err != nil {
		s.previewBusy(w, t, err)
		return
	}
	defer release()
	s.metrics.PreviewRequest()
	s.preview.Serve(w, r, t)
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
	if !ok || b.sb == nil || !live(b.sb) {
		return nil
	}
	return b
}

// portPublic reports whether port of b was made public.
func (s *Server) portPublic(b *box, port int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return b.public[port]
}

// boxToken is b's preview token, computed once: a preview request checks
// it each time.
func (s *Server) boxToken(b *box) string {
	if p := b.token.Load(); p != nil {
		return *p
	}
	tok := s.previewKeys.Token(b.sb.ID)
	b.token.Store(&tok)
	return tok
}

// dialPreview opens a connection to port of running sandbox id through
// its agent, for the preview proxy.
func (s *Server) dialPreview(ctx context.Context, id string, port int) (net.Conn, error) {
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

// The ports API.

func (s *Server) portRoutes(add addFunc) {
	add("GET /v1/sandboxes/{id}/ports", true, s.listPorts)
	add("PUT /v1/sandboxes/{id}/ports/{port}", true, s.setPort)
}

func (s *Server) listPorts(w http.ResponseWriter, r *http.Request) error {
	b, err := s.lookup(r)
	if err != nil {
		return err
	}
	ttl, err := preview.TTL(r)
	if err != nil {
		return err
	}
	listening, err := b.sb.Ports(r.Context())
	if err != nil {
		return err
	}
	byPort := map[int]*api.Port{}
	var order []int
	entry := func(port int) *api.Port {
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
	out := api.PortList{Ports: make([]api.Port, 0, len(order)), Token: s.previewKeys.Token(b.sb.ID), TokenHeader: preview.TokenHeader}
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
	p := s.portOf(r, b, port, preview.DefaultURLTTL)
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
func (s *Server) portOf(r *http.Request, b *box, port int, ttl time.Duration) api.Port {
	id := b.sb.ID
	u := s.previewKeys.URLsOf(r, s.cfg.PreviewDomain, id, port, ttl)
	return api.Port{Port: port, Addresses: []string{}, Public: s.portPublic(b, port) || s.e2b.PublicTraffic(id),
		URL: u.URL, ProxyURL: u.ProxyURL, SignedURL: u.SignedURL, ExpiresAt: u.ExpiresAt}
}
