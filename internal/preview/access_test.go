package preview_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/preview"
)

func TestKeys(t *testing.T) {
	t.Parallel()
	k, other := preview.NewKeys([]byte("k1")), preview.NewKeys([]byte("k2"))
	tg := preview.Target{Form: preview.FormHost, ID: "abc", Port: 8080}
	if k.Token("abc") == other.Token("abc") || k.Token("abc") == k.Token("abd") || !strings.HasPrefix(k.Token("abc"), "sfp_") {
		t.Fatal("tokens are not per key and sandbox")
	}
	exp := time.Now().Add(time.Hour)
	v := k.Sign("abc", 8080, exp)
	if !k.ValidSigned(tg, v) {
		t.Fatal("a signed value is refused")
	}
	for name, bad := range map[string]string{
		"another key":                      other.Sign("abc", 8080, exp),
		"another port":                     k.Sign("abc", 8081, exp),
		"expired":                          k.Sign("abc", 8080, time.Now().Add(-time.Second)),
		"a later expiry with the same MAC": fmt.Sprint(exp.Unix()+60) + v[strings.Index(v, "."):],
		"garbage":                          "x",
	} {
		if k.ValidSigned(tg, bad) {
			t.Errorf("%s: accepted", name)
		}
	}

	traffic := func(tok string) bool { return tok == "good" }
	req := func(hdr ...string) *http.Request {
		r := httptest.NewRequest("GET", "http://8080-abc.localhost/", nil)
		for i := 0; i < len(hdr); i += 2 {
			r.Header.Set(hdr[i], hdr[i+1])
		}
		return r
	}
	cookie := (&http.Cookie{Name: preview.Param, Value: v}).String()
	for _, c := range []struct {
		name   string
		r      *http.Request
		public bool
		want   bool
	}{
		{"anonymous", req(), false, false},
		{"public", req(), true, true},
		{"the token", req(preview.TokenHeader, k.Token("abc")), false, true},
		{"another sandbox's token", req(preview.TokenHeader, k.Token("abd")), false, false},
		{"a traffic token", req(preview.TrafficTokenHeader, "good"), false, true},
		{"a bad traffic token", req(preview.TrafficTokenHeader, "bad"), false, false},
		{"the cookie", req("Cookie", cookie), false, true},
		{"an API key", req("Authorization", "Bearer sf_"+strings.Repeat("a", 40)), false, false},
	} {
		if got := k.Allowed(c.r, tg, c.public, k.Token("abc"), traffic); got != c.want {
			t.Errorf("Allowed, %s: %v, want %v", c.name, got, c.want)
		}
		if c.public {
			continue
		}
		if got := k.Credentialed(c.r, tg, traffic); got != c.want {
			t.Errorf("Credentialed, %s: %v, want %v", c.name, got, c.want)
		}
	}
	if !k.Credentialed(httptest.NewRequest("GET", "/?"+url.Values{preview.Param: {v}}.Encode(), nil), tg, traffic) {
		t.Error("Credentialed refuses a signed parameter")
	}
}

func TestRedeem(t *testing.T) {
	t.Parallel()
	k := preview.NewKeys([]byte("k"))
	tg, _ := preview.PathTarget("/v1/sandboxes/abc/proxy/8080/app")
	v := k.Sign("abc", 8080, time.Now().Add(time.Hour))
	u := "http://api.example.com/v1/sandboxes/abc/proxy/8080/app?a=1&" + url.Values{preview.Param: {v}}.Encode()

	w := httptest.NewRecorder()
	if k.Redeem(w, httptest.NewRequest("GET", u, nil), tg) {
		t.Fatal("a GET with a signed parameter goes on instead of being redirected")
	}
	if w.Code != http.StatusFound || w.Header().Get("Location") != "/v1/sandboxes/abc/proxy/8080/app?a=1" {
		t.Fatalf("GET: %d to %q", w.Code, w.Header().Get("Location"))
	}
	c := w.Result().Cookies()
	if len(c) != 1 || c[0].Name != preview.Param || c[0].Value != v || !c[0].HttpOnly || c[0].Path != "/v1/sandboxes/abc/proxy/8080/" {
		t.Fatalf("cookie: %+v", c)
	}

	w = httptest.NewRecorder()
	if !k.Redeem(w, httptest.NewRequest("POST", u, nil), tg) || len(w.Result().Cookies()) != 1 {
		t.Fatalf("a POST with a signed parameter: %d, cookies %v", w.Code, w.Result().Cookies())
	}

	w = httptest.NewRecorder()
	if k.Redeem(w, httptest.NewRequest("GET", "http://api.example.com/v1/sandboxes/abc/proxy/8080/app?"+preview.Param+"=1.x", nil), tg) || w.Code != http.StatusUnauthorized {
		t.Fatalf("a forged parameter: %d", w.Code)
	}
}
