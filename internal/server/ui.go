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
	// DefaultUISessionsPerAccount is an account's share of dashboard
	// sessions (Config.UISessionsPerAccount).
	DefaultUISessionsPerAccount = 32
)

// maxUISessions bounds every account's sessions together: with each
// account's own bound (Config.UISessionsPerAccount) it takes thousands of
// accounts to reach it, and then logins of accounts with no session to
// spare get 503 until sessions end. A variable for tests.
var maxUISessions = 100000

type uiSession struct {
	secret  string
	owner   string // the account of the key
	expires time.Time
}

// uiSessions maps a session token's SHA-256 to its key. Each account has
// a share (perAccount): a login past it ends the account's oldest
// session, so that one tenant logging in without end takes nothing of
// the others'.
type uiSessions struct {
	perAccount int

	// mu guards m and byOwner.
	mu sync.Mutex
	m  map[[32]byte]uiSession
	// byOwner lists each account's sessions, oldest first; an entry
	// whose session has ended (no longer in m) is dropped at the
	// account's next login.
	byOwner map[string][][32]byte
}

func (u *uiSessions) add(secret, owner string, now time.Time) (string, error) {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	token := hex.EncodeToString(b[:])
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.m == nil {
		u.m, u.byOwner = map[[32]byte]uiSession{}, map[string][][32]byte{}
	}
	// The account's own sessions first: drop the ended, then end the
	// oldest until a new one fits its share.
	live := u.byOwner[owner][:0]
	for _, k := range u.byOwner[owner] {
		if s, ok := u.m[k]; ok && !now.After(s.expires) {
			live = append(live, k)
		} else {
			delete(u.m, k)
		}
	}
	if n := u.perAccount; n > 0 && len(live) >= n {
		for _, k := range live[:len(live)-n+1] {
			delete(u.m, k)
		}
		live = append(live[:0], live[len(live)-n+1:]...)
	}
	if len(u.m) >= maxUISessions {
		for k, s := range u.m {
			if now.After(s.expires) {
				delete(u.m, k)
			}
		}
		if len(u.m) >= maxUISessions {
			u.byOwner[owner] = live
			return "", apierr.New(apierr.Capacity, "too many dashboard sessions; try again later")
		}
	}
	k := sha256.Sum256([]byte(token))
	u.m[k] = uiSession{secret: secret, owner: owner, expires: now.Add(uiSessionLife)}
	u.byOwner[owner] = append(live, k)
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
	p, err := s.auth.Check(r.Context(), req.Key)
	if err != nil {
		return err
	}
	// A login is a request of its key: under its account's request rate.
	if li := logInfoFrom(r.Context()); li != nil {
		li.owner = p.Owner
	}
	if err := s.paces.wait(r.Context(), p.Owner); err != nil {
		return err
	}
	if !s.cfg.NoAccounting {
		if err := s.limitRequest(w, r, p); err != nil {
			return err
		}
	}
	token, err := s.ui.add(req.Key, p.Owner, time.Now())
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
