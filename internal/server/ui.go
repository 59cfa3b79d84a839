package server

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"sync"
	"time"

	"github.com/sheepfold/sheepfold/internal/apierr"
	"github.com/sheepfold/sheepfold/internal/auth"
	"github.com/sheepfold/sheepfold/internal/ui"
)

// The dashboard (/ui/) logs in with an API key: POST /ui/login checks it
// and answers with an HttpOnly, SameSite=Strict cookie naming a session
// that only this server's memory maps to the key. The page never keeps
// the key (not in its URL, not in storage); its API requests carry the
// cookie and the X-Sheepfold-UI header, which no cross-site page can set
// without a CORS preflight this server never grants. Each request checks
// the key again, so a revoked key ends its sessions at once.
const (
	uiCookie      = "sheepfold_ui"
	uiHeader      = "X-Sheepfold-UI"
	uiSessionLife = 12 * time.Hour
	maxUISessions = 10000
)

type uiSession struct {
	secret  string
	expires time.Time
}

// uiSessions maps a session token's SHA-256 to its key.
type uiSessions struct {
	mu sync.Mutex
	m  map[[32]byte]uiSession
}

func (u *uiSessions) add(secret string, now time.Time) (string, error) {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	token := hex.EncodeToString(b[:])
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.m == nil {
		u.m = map[[32]byte]uiSession{}
	}
	if len(u.m) >= maxUISessions {
		for k, s := range u.m {
			if now.After(s.expires) {
				delete(u.m, k)
			}
		}
		if len(u.m) >= maxUISessions {
			return "", apierr.New(apierr.Capacity, "too many dashboard sessions; try again later")
		}
	}
	u.m[sha256.Sum256([]byte(token))] = uiSession{secret: secret, expires: now.Add(uiSessionLife)}
	return token, nil
}

func (u *uiSessions) secret(token string, now time.Time) string {
	k := sha256.Sum256([]byte(token))
	u.mu.Lock()
	defer u.mu.Unlock()
	s, ok := u.m[k]
	if !ok {
		return ""
	}
	if now.After(s.expires) {
		delete(u.m, k)
		return ""
	}
	return s.secret
}

func (u *uiSessions) remove(token string) {
	u.mu.Lock()
	delete(u.m, sha256.Sum256([]byte(token)))
	u.mu.Unlock()
}

// secretOf is the key a request authenticates with: its X-API-Key or
// bearer token, else a dashboard session's (cookie and header both).
func (s *Server) secretOf(r *http.Request) string {
	if k := auth.FromRequest(r); k != "" {
		return k
	}
	if r.Header.Get(uiHeader) == "" {
		return ""
	}
	c, err := r.Cookie(uiCookie)
	if err != nil || !s.dashboardHostAllowed(r.Host) {
		return ""
	}
	return s.ui.secret(c.Value, time.Now())
}

func (s *Server) uiRoutes(add addFunc, mux *http.ServeMux) {
	mux.Handle("GET /ui/", ui.Handler("/ui/"))
	add("POST /ui/login", false, s.uiLogin)
	add("POST /ui/logout", false, s.uiLogout)
}

func secureRequest(r *http.Request) bool {
	return r.TLS != nil || r.Header.Get("X-Forwarded-Proto") == "https"
}

func (s *Server) uiLogin(w http.ResponseWriter, r *http.Request) error {
	if r.Header.Get(uiHeader) == "" {
		return apierr.New(apierr.BadRequest, "the dashboard's requests carry the %s header", uiHeader)
	}
	if !s.dashboardHostAllowed(r.Host) {
		return apierr.New(apierr.Forbidden, "the dashboard is not served on %s: it shares a site with the previews under %s, whose pages could set its cookies; serve previews under a domain of their own (serve --preview-domain)", r.Host, s.cfg.PreviewDomain)
	}
	var req struct {
		Key string `json:"key"`
	}
	if err := decodeJSON(w, r, &req, false); err != nil {
		return err
	}
	if _, err := s.auth.Check(r.Context(), req.Key); err != nil {
		return err
	}
	token, err := s.ui.add(req.Key, time.Now())
	if err != nil {
		return err
	}
	http.SetCookie(w, &http.Cookie{Name: uiCookie, Value: token, Path: "/", MaxAge: int(uiSessionLife.Seconds()),
		HttpOnly: true, Secure: secureRequest(r), SameSite: http.SameSiteStrictMode})
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *Server) uiLogout(w http.ResponseWriter, r *http.Request) error {
	if c, err := r.Cookie(uiCookie); err == nil {
		s.ui.remove(c.Value)
	}
	http.SetCookie(w, &http.Cookie{Name: uiCookie, Value: "", Path: "/", MaxAge: -1, HttpOnly: true,
		Secure: secureRequest(r), SameSite: http.SameSiteStrictMode})
	w.WriteHeader(http.StatusNoContent)
	return nil
}
