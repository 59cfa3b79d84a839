package preview

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/sheepfold/sheepfold/internal/bound"
)

// Signed preview URLs live between these bounds.
const (
	DefaultURLTTL = time.Hour
	MaxURLTTL     = 7 * 24 * time.Hour
)

// Keys makes and checks the preview credentials of one server (and of
// its replicas, which share its key): sandboxes' preview tokens and
// signed preview values. Nothing is stored.
type Keys struct {
	key []byte
}

// NewKeys returns the Keys of key, which replicas share.
func NewKeys(key []byte) *Keys { return &Keys{key: key} }

func (k *Keys) mac(parts ...string) string {
	m := hmac.New(sha256.New, k.key)
	m.Write([]byte(strings.Join(parts, "\x00")))
	return hex.EncodeToString(m.Sum(nil)[:20])
}

// Token is sandbox id's preview token: an HMAC under the key, so
// nothing is stored, and it dies with the key (as the server's sandboxes
// do).
func (k *Keys) Token(id string) string {
	return "sfp_" + k.mac("token", id)
}

// Sign returns the value of a signed preview parameter for port of
// sandbox id, valid until exp: "<unix exp>.<HMAC of the sandbox, port and
// exp>".
func (k *Keys) Sign(id string, port int, exp time.Time) string {
	e := strconv.FormatInt(exp.Unix(), 10)
	return e + "." + k.mac("url", id, strconv.Itoa(port), e)
}

// ValidSigned checks a signed preview value for t, and that it has not
// expired.
func (k *Keys) ValidSigned(t Target, v string) bool {
	e, _, ok := strings.Cut(v, ".")
	exp, err := strconv.ParseInt(e, 10, 64)
	if !ok || err != nil || time.Now().Unix() >= exp {
		return false
	}
	return hmac.Equal([]byte(v), []byte(k.Sign(t.ID, t.Port, time.Unix(exp, 0))))
}

// Credentialed reports whether r carries a credential for t that holds
// by itself, one HMAC and nothing looked up: the sandbox's preview token,
// an E2B traffic token of it (isTraffic: whose key Allowed checks next),
// a signed preview parameter or the cookie it set. The server checks it
// before it looks for the sandbox, so that an anonymous request goes on
// only where the port may be public.
func (k *Keys) Credentialed(r *http.Request, t Target, isTraffic func(tok string) bool) bool {
	if tok := r.Header.Get(TokenHeader); tok != "" && hmac.Equal([]byte(tok), []byte(k.Token(t.ID))) {
		return true
	}
	if tok := r.Header.Get(TrafficTokenHeader); tok != "" && isTraffic(tok) {
		return true
	}
	if v := r.URL.Query().Get(Param); v != "" && k.ValidSigned(t, v) {
		return true
	}
	c, err := r.Cookie(Param)
	return err == nil && k.ValidSigned(t, c.Value)
}

// Allowed reports whether r may reach t without a signed parameter: the
// port is public (the server's word), or r carries the sandbox's preview
// token (token, as Token gives it), an E2B traffic token validTraffic
// accepts, or the cookie of a signed value.
func (k *Keys) Allowed(r *http.Request, t Target, public bool, token string, validTraffic func(tok string) bool) bool {
	if public {
		return true
	}
	if tok := r.Header.Get(TokenHeader); tok != "" {
		return hmac.Equal([]byte(tok), []byte(token))
	}
	if tok := r.Header.Get(TrafficTokenHeader); tok != "" {
		return validTraffic(tok)
	}
	if c, err := r.Cookie(Param); err == nil {
		return k.ValidSigned(t, c.Value)
	}
	return false
}

// Redeem serves a request for t that Allowed refused: with a valid
// signed parameter it sets the cookie that keeps it and, for GET and
// HEAD, redirects to the URL without the parameter; without one it
// answers that the preview is private. It reports whether the request
// may go on to the app (a valid parameter on another method).
func (k *Keys) Redeem(w http.ResponseWriter, r *http.Request, t Target) bool {
	signed := r.URL.Query().Get(Param)
	if signed == "" || !k.ValidSigned(t, signed) {
		Refused(w, t)
		return false
	}
	setCookie(w, r, t, signed)
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		return true
	}
	u := *r.URL
	q := u.Query()
	q.Del(Param)
	u.RawQuery = q.Encode()
	http.Redirect(w, r, u.RequestURI(), http.StatusFound)
	return false
}

// setCookie keeps a signed preview value for the rest of its life,
// scoped to this preview (its host, or its path).
func setCookie(w http.ResponseWriter, r *http.Request, t Target, v string) {
	e, _, _ := strings.Cut(v, ".")
	exp, _ := strconv.ParseInt(e, 10, 64)
	path := "/"
	if t.Form == FormPath {
		path = t.Prefix + "/"
	}
	http.SetCookie(w, &http.Cookie{Name: Param, Value: v, Path: path, Expires: time.Unix(exp, 0),
		HttpOnly: true, Secure: r.TLS != nil, SameSite: http.SameSiteLaxMode})
}

// URLs are the addresses of a sandbox port's preview, as a caller that
// reached the server with r would use them.
type URLs struct {
	URL       string    // the host form
	ProxyURL  string    // the path form, on the API's origin
	SignedURL string    // the host form with a signed parameter
	ExpiresAt time.Time // when SignedURL's signature expires
}

// URLsOf returns the URLs of port of sandbox id under domain, the signed
// one valid for ttl.
func (k *Keys) URLsOf(r *http.Request, domain, id string, port int, ttl time.Duration) URLs {
	sch := Scheme(r)
	u := URLs{URL: sch + "://" + Host(r, domain, id, port) + "/",
		ProxyURL: sch + "://" + r.Host + PathPrefix + id + "/proxy/" + strconv.Itoa(port) + "/"}
	u.ExpiresAt = time.Now().Add(ttl).Truncate(time.Second).UTC()
	u.SignedURL = u.URL + "?" + url.Values{Param: {k.Sign(id, port, u.ExpiresAt)}}.Encode()
	return u
}

// TTL reads expires_in (seconds) for signed URLs from r's query.
func TTL(r *http.Request) (time.Duration, error) {
	v := r.URL.Query().Get("expires_in")
	if v == "" {
		return DefaultURLTTL, nil
	}
	n, err := bound.ParseInt("expires_in", v, 1, int64(MaxURLTTL/time.Second))
	return time.Duration(n) * time.Second, err
}
