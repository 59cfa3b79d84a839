package preview_test

import (
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/sheepfold/sheepfold/internal/preview"
	"github.com/sheepfold/sheepfold/internal/sandbox"
)

// app is a sandbox's app for the proxy: it answers "hello" with the
// headers the test asks for; dial reaches it.
func app(t *testing.T, answer http.Header) (dial func(context.Context, string, int) (net.Conn, error)) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for k, vs := range answer {
			w.Header()[k] = vs
		}
		io.WriteString(w, "hello")
	}))
	t.Cleanup(srv.Close)
	return func(ctx context.Context, id string, port int) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "tcp", srv.Listener.Addr().String())
	}
}

func serve(t *testing.T, p *preview.Proxy, r *http.Request, tg preview.Target) *httptest.ResponseRecorder {
	t.Helper()
	w := httptest.NewRecorder()
	p.Serve(w, r, tg)
	return w
}

func TestProxyStripsCredentials(t *testing.T) {
	t.Parallel()
	key := "sf_" + strings.Repeat("0123456789", 4)
	for _, apiOrigin := range []bool{false, true} {
		got := make(chan *http.Request, 1)
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { got <- r }))
		p := preview.NewProxy(preview.ProxyConfig{
			Dial: func(ctx context.Context, id string, port int) (net.Conn, error) {
				if id != "abc" || port != 8080 {
					return nil, fmt.Errorf("dialled %s:%d", id, port)
				}
				var d net.Dialer
				return d.DialContext(ctx, "tcp", srv.Listener.Addr().String())
			},
			StripHeaders: []string{"X-Dashboard"}, StripCookies: []string{"dash"}})
		tg := preview.Target{Form: preview.FormHost, ID: "abc", Port: 8080}
		u := "http://8080-abc.localhost/x?keep=1&" + preview.Param + "=1.abc"
		if apiOrigin {
			tg, _ = preview.PathTarget("/v1/sandboxes/abc/proxy/8080/x")
			u = "http://api.example.com/v1/sandboxes/abc/proxy/8080/x?keep=1&" + preview.Param + "=1.abc"
		}
		r := httptest.NewRequest("GET", u, nil)
		r.Header.Set(preview.TokenHeader, "sfp_x")
		r.Header.Set(preview.TrafficTokenHeader, "t")
		r.Header.Set("E2b-Sandbox-Id", "abc")
		r.Header.Set("X-Dashboard", "1")
		r.Header.Set("X-Api-Key", key)
		r.Header.Set("X-Other", "Basic "+base64.StdEncoding.EncodeToString([]byte("u:"+key)))
		r.Header.Set("Authorization", "Bearer app-token")
		r.Header.Set("Cookie", "app=1; dash=s; "+preview.Param+"=v")
		if w := serve(t, p, r, tg); w.Code != http.StatusOK {
			t.Fatalf("apiOrigin %v: %d %s", apiOrigin, w.Code, w.Body)
		}
		in := <-got
		srv.Close()
		for _, h := range []string{preview.TokenHeader, preview.TrafficTokenHeader, "E2b-Sandbox-Id", "X-Dashboard", "X-Api-Key", "X-Other"} {
			if v := in.Header.Get(h); v != "" {
				t.Errorf("apiOrigin %v: the app saw %s: %q", apiOrigin, h, v)
			}
		}
		if in.URL.Path != "/x" || in.URL.RawQuery != "keep=1" {
			t.Errorf("apiOrigin %v: the app saw %s?%s", apiOrigin, in.URL.Path, in.URL.RawQuery)
		}
		wantCookie, wantAuth := "app=1", "Bearer app-token"
		if apiOrigin {
			wantCookie, wantAuth = "", ""
			if in.Header.Get("X-Forwarded-Prefix") != tg.Prefix {
				t.Errorf("X-Forwarded-Prefix %q", in.Header.Get("X-Forwarded-Prefix"))
			}
		}
		if in.Header.Get("Cookie") != wantCookie || in.Header.Get("Authorization") != wantAuth {
			t.Errorf("apiOrigin %v: the app saw Cookie %q, Authorization %q", apiOrigin, in.Header.Get("Cookie"), in.Header.Get("Authorization"))
		}
	}
}

func TestProxyAnswersStayOnTheirOrigin(t *testing.T) {
	t.Parallel()
	answer := http.Header{"Set-Cookie": {"a=1; Domain=example.com; Path=/"}, "Strict-Transport-Security": {"max-age=1"}}
	dial := app(t, answer)
	p := preview.NewProxy(preview.ProxyConfig{Dial: dial})

	own := serve(t, p, httptest.NewRequest("GET", "http://8080-abc.localhost/", nil), preview.Target{Form: preview.FormHost, ID: "abc", Port: 8080})
	if c := own.Header().Get("Set-Cookie"); c != "a=1; Path=/" || own.Header().Get("Content-Security-Policy") != "" {
		t.Errorf("own origin: Set-Cookie %q, CSP %q", c, own.Header().Get("Content-Security-Policy"))
	}
	tg, _ := preview.PathTarget("/v1/sandboxes/abc/proxy/8080/")
	api := serve(t, p, httptest.NewRequest("GET", "http://api.example.com/v1/sandboxes/abc/proxy/8080/", nil), tg)
	if api.Header().Get("Set-Cookie") != "" || api.Header().Get("Strict-Transport-Security") != "" ||
		api.Header().Get("Content-Security-Policy") != "sandbox" || api.Header().Get("X-Content-Type-Options") != "nosniff" {
		t.Errorf("API origin: %v", api.Header())
	}
	if api.Body.String() != "hello" {
		t.Errorf("body %q", api.Body)
	}
}

func TestProxyFailures(t *testing.T) {
	t.Parallel()
	tg := preview.Target{Form: preview.FormHost, ID: "abc", Port: 8080}
	for _, c := range []struct {
		err  error
		code int
		page string
	}{
		{sandbox.ErrEgressPort, http.StatusForbidden, "Not a preview"},
		{fmt.Errorf("dial: %w", sandbox.ErrNoListener), http.StatusBadGateway, "Nothing is listening"},
		{fmt.Errorf("agent gone"), http.StatusBadGateway, "The app did not answer"},
	} {
		p := preview.NewProxy(preview.ProxyConfig{Dial: func(context.Context, string, int) (net.Conn, error) { return nil, c.err }})
		w := serve(t, p, httptest.NewRequest("GET", "http://8080-abc.localhost/", nil), tg)
		if w.Code != c.code || !strings.Contains(w.Body.String(), c.page) || w.Header().Get("Content-Type") != "text/html; charset=utf-8" {
			t.Errorf("%v: %d %q", c.err, w.Code, w.Body)
		}
	}
}
