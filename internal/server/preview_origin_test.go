package server_test

import (
	"crypto/sha256"
	"encoding/base64"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"

	"github.com/sheepfold/sheepfold/internal/server"
)

// chromeUA is a browser's User-Agent; Chromium also sends Fetch Metadata.
const chromeUA = "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/156.0.0.0 Safari/537.36"

// TestPreviewHostNeverAPI: a Host under the preview domain is a preview
// or nothing, never the API or the dashboard, whatever its path; the
// domain's own name and every other Host are the API.
func TestPreviewHostNeverAPI(t *testing.T) {
	t.Parallel()
	e := newEnv(t, server.Config{PreviewDomain: "preview.localhost"})
	app := startApp(t)
	id := e.create(e.keyA, nil)
	port := strconv.Itoa(app.port)
	bearer := "Bearer " + e.keyA

	// Control: the API answers on its own Host, and on the domain's name.
	for _, host := range []string{"", "preview.localhost"} {
		if r := e.get("GET", host, "/v1/account", "Authorization", bearer); r.status != http.StatusOK {
			t.Fatalf("control: /v1/account on %q: %d %s", host, r.status, r.body)
		}
	}
	for _, c := range []struct{ host, path string }{
		{"api.preview.localhost", "/v1/account"},
		{"x.y.preview.localhost", "/v1/sandboxes"},
		{"API.Preview.Localhost.", "/v1/account"},
		{"0-" + id + ".preview.localhost", "/v1/account"},
		{"api.preview.localhost", "/ui/"},
		{"api.preview.localhost", "/v2/sandboxes"},
	} {
		r := e.get("GET", c.host, c.path, "Authorization", bearer, "X-API-Key", e.keyA)
		if r.status != http.StatusNotFound || !strings.Contains(string(r.body), "No such preview") {
			t.Fatalf("%s%s: %d %s", c.host, c.path, r.status, r.body)
		}
	}
	// A preview's own /v1/... is the app's, not the API's.
	r := e.get("GET", port+"-"+id+".preview.localhost", "/v1/account", "Authorization", bearer)
	if r.status != http.StatusUnauthorized || !strings.Contains(string(r.body), "private") {
		t.Fatalf("a private preview's /v1/account: %d %s", r.status, r.body)
	}
	want(t, e.do("PUT", "/v1/sandboxes/"+id+"/ports/"+port, e.keyA, map[string]any{"public": true}), http.StatusOK, "")
	r = e.get("GET", port+"-"+id+".preview.localhost", "/v1/account", "Authorization", bearer)
	want(t, r, http.StatusOK, "")
	if got := r.json(t); got["uri"] != "/v1/account" || got["authorization"] != "" {
		t.Fatalf("the app's /v1/account: %v", got)
	}
}

// TestPreviewPathFormBrowsers: the path form sends a browser to the
// host form (the app's own origin), with the app's path and query; a
// program is served, sandboxed.
func TestPreviewPathFormBrowsers(t *testing.T) {
	t.Parallel()
	e := newEnv(t, server.Config{})
	app := startApp(t)
	id := e.create(e.keyA, nil)
	port := strconv.Itoa(app.port)
	want(t, e.do("PUT", "/v1/sandboxes/"+id+"/ports/"+port, e.keyA, map[string]any{"public": true}), http.StatusOK, "")
	prefix := "/v1/sandboxes/" + id + "/proxy/" + port
	hostForm := "http://" + port + "-" + id + ".localhost:" + strings.Split(e.url, ":")[2]

	for name, hdr := range map[string][]string{
		"fetch metadata":      {"Sec-Fetch-Mode", "navigate", "Sec-Fetch-Dest", "document", "Sec-Fetch-Site", "none"},
		"user agent":          {"User-Agent", chromeUA},
		"script subresource":  {"Sec-Fetch-Dest", "script"},
		"cross-site fetching": {"Sec-Fetch-Site", "cross-site"},
	} {
		for path, to := range map[string]string{
			prefix + "/a/b%2Fc?q=1&sf_preview=9.x": hostForm + "/a/b%2Fc?q=1&sf_preview=9.x",
			prefix:                                 hostForm + "/",
			prefix + "/":                           hostForm + "/",
		} {
			r := e.get("GET", "", path, hdr...)
			if r.status != http.StatusTemporaryRedirect || r.header.Get("Location") != to || r.header.Get("Set-Cookie") != "" {
				t.Fatalf("%s, %s: %d %q, want a redirect to %s", name, path, r.status, r.header.Get("Location"), to)
			}
		}
	}
	// A program: served here, as before, sandboxed.
	r := e.get("GET", "", prefix+"/x", "User-Agent", "curl/8.0")
	want(t, r, http.StatusOK, "")
	if got := r.json(t); got["uri"] != "/x" || r.header.Get("Content-Security-Policy") != "sandbox" {
		t.Fatalf("program: %v %v", got, r.header)
	}
	// The ports API names the host form; the path form stays listed.
	pl := e.ports(e.keyA, id, "")
	for _, p := range pl.Ports {
		if p.Port == app.port && (p.URL != hostForm+"/" || p.ProxyURL != e.url+prefix+"/" || !strings.HasPrefix(p.SignedURL, hostForm+"/?sf_preview=")) {
			t.Fatalf("ports: %+v", p)
		}
	}
}

// TestPreviewStripsCredentials: what a client holds for Sheepfold never
// reaches an app, in any form; on the API's origin no cookie and no
// Authorization reach it either. Control: the same headers under other
// names, and the app's own credentials on its own origin, pass.
func TestPreviewStripsCredentials(t *testing.T) {
	t.Parallel()
	e := newEnv(t, server.Config{PreviewDomain: "e2b.localhost"})
	app := startApp(t)
	port := strconv.Itoa(app.port)
	sb := e.e2bCreate(e.keyA, map[string]any{"templateID": "base"}) // public traffic: no preview credential needed
	id := sb.ID
	basicKey := "Basic " + base64.StdEncoding.EncodeToString([]byte("user:"+e.keyA))
	e2bKey := "e2b_" + strings.Repeat("0a", 20)
	sent := []string{
		"Cookie", "sheepfold_ui=session; app=1; sf_preview=1.x",
		"Authorization", "Bearer app-token",
		"X-Sheepfold-UI", "1",
		"X-API-Key", e.keyA,
		"X-Custom", "token " + e2bKey,
		"X-Auth", basicKey,
		"X-App", "kept",
	}
	seen := func(r resp) http.Header {
		t.Helper()
		want(t, r, http.StatusOK, "")
		h := http.Header{}
		for k, vs := range r.json(t)["headers"].(map[string]any) {
			for _, v := range vs.([]any) {
				h.Add(k, v.(string))
			}
		}
		return h
	}
	secrets := []string{"session", e.keyA, e2bKey, basicKey, "sf_preview"}
	leaked := func(h http.Header) string {
		for k, vs := range h {
			for _, v := range vs {
				for _, sec := range secrets {
					if strings.Contains(v, sec) {
						return k + ": " + v
					}
				}
			}
		}
		return ""
	}

	// The host form: the app's own cookie and Authorization pass.
	h := seen(e.get("GET", port+"-"+id+".e2b.localhost", "/", sent...))
	if l := leaked(h); l != "" || h.Get("Cookie") != "app=1" || h.Get("Authorization") != "Bearer app-token" || h.Get("X-App") != "kept" ||
		h.Get("X-Sheepfold-UI") != "" {
		t.Fatalf("host form: the app saw %v (leaked %q)", h, l)
	}
	// The API's origin: the path form (a program's) and E2B's headers.
	for name, r := range map[string]resp{
		"path form":  e.get("GET", "", "/v1/sandboxes/"+id+"/proxy/"+port+"/", sent...),
		"e2b header": e.get("GET", "", "/", append([]string{"E2b-Sandbox-Id", id, "E2b-Sandbox-Port", port}, sent...)...),
	} {
		h := seen(r)
		if l := leaked(h); l != "" || h.Get("Cookie") != "" || h.Get("Authorization") != "" || h.Get("X-App") != "kept" ||
			h.Get("E2b-Sandbox-Id") != "" {
			t.Fatalf("%s: the app saw %v (leaked %q)", name, h, l)
		}
	}
	// Control: the check sees what was sent when nothing strips it.
	if l := leaked(http.Header{"X-Custom": {"token " + e2bKey}, "X-Auth": {basicKey}}); l == "" {
		t.Fatal("control: the leak check sees nothing")
	}
}

// TestPreviewAnswersStayOnTheirOrigin: an app's cookies never land on the
// API's origin, nor does anything else that acts on an origin; on its
// own origin its cookies are host-only.
func TestPreviewAnswersStayOnTheirOrigin(t *testing.T) {
	t.Parallel()
	e := newEnv(t, server.Config{PreviewDomain: "e2b.localhost"})
	app := startApp(t)
	port := strconv.Itoa(app.port)
	id := e.e2bCreate(e.keyA, map[string]any{"templateID": "base"}).ID
	q := "/set-cookie?domain=" + url.QueryEscape("localhost")

	// Own origin: cookies kept, their Domain removed.
	r := e.get("GET", port+"-"+id+".e2b.localhost", q)
	cs := r.header.Values("Set-Cookie")
	if r.status != http.StatusNoContent || len(cs) != 2 || cs[0] != "app=1; Path=/; HttpOnly" || cs[1] != "wide=1; Path=/; SameSite=Lax" ||
		r.header.Get("Content-Security-Policy") != "" {
		t.Fatalf("host form: %d %q %v", r.status, cs, r.header)
	}
	// The API's origin: nothing that acts on it, and a sandboxed answer.
	for name, r := range map[string]resp{
		"path form":  e.get("GET", "", "/v1/sandboxes/"+id+"/proxy/"+port+q),
		"e2b header": e.get("GET", "", q, "E2b-Sandbox-Id", id, "E2b-Sandbox-Port", port),
	} {
		if r.status != http.StatusNoContent || len(r.header.Values("Set-Cookie")) != 0 || r.header.Get("Clear-Site-Data") != "" ||
			r.header.Get("Alt-Svc") != "" || r.header.Get("Content-Security-Policy") != "sandbox" || r.header.Get("X-Content-Type-Options") != "nosniff" {
			t.Fatalf("%s: %d %v", name, r.status, r.header)
		}
	}
}

// TestDashboardNotSameSiteAsPreviews: where previews share a site with
// the dashboard's host (preview.example.com and api.example.com), a
// preview could set the dashboard's cookies (a session of its tenant's
// in place of the viewer's): the dashboard's cookie authenticates
// nothing there, and its login is refused. Control: the same session
// works on a host of another site, and a preview domain that is a public
// suffix (localhost) shares a site with no host.
func TestDashboardNotSameSiteAsPreviews(t *testing.T) {
	t.Parallel()
	e := newEnv(t, server.Config{PreviewDomain: "preview.example.com"})
	ui := []string{"X-Sheepfold-UI", "1"}
	login := func(host string) resp {
		return e.send("POST", host, "/ui/login", `{"key":"`+e.keyA+`"}`, ui...)
	}
	r := login("api.example.net")
	want(t, r, http.StatusNoContent, "")
	session := strings.Split(r.header.Get("Set-Cookie"), ";")[0]
	if r := e.get("GET", "api.example.net", "/v1/account", append(ui, "Cookie", session)...); r.status != http.StatusOK {
		t.Fatalf("control: the session on another site: %d %s", r.status, r.body)
	}
	for _, host := range []string{"api.example.com", "example.com:8443", "preview.example.com", "API.Example.COM."} {
		r := login(host)
		if r.status != http.StatusForbidden || !strings.Contains(string(r.body), "ERR_FORBIDDEN") {
			t.Fatalf("login on %s: %d %s", host, r.status, r.body)
		}
		if r := e.get("GET", host, "/v1/account", append(ui, "Cookie", session)...); r.status != http.StatusUnauthorized {
			t.Fatalf("session on %s: %d %s", host, r.status, r.body)
		}
	}
	// API keys are no cookie: they work on any host.
	if r := e.get("GET", "api.example.com", "/v1/account", "Authorization", "Bearer "+e.keyA); r.status != http.StatusOK {
		t.Fatalf("key on api.example.com: %d", r.status)
	}

	d := newEnv(t, server.Config{}) // localhost: each preview a site of its own
	for _, host := range []string{"localhost:8080", "127.0.0.1", "api.example.com"} {
		want(t, d.send("POST", host, "/ui/login", `{"key":"`+d.keyA+`"}`, ui...), http.StatusNoContent, "")
	}
}

// TestE2BDownloadsAreNoPages: a signed download URL needs no header, so
// a tenant can send one to a viewer and have it opened on the API's
// origin (no sandbox header) or a preview host: what it answers is the
// tenant's file, served as data a browser neither sniffs nor runs.
func TestE2BDownloadsAreNoPages(t *testing.T) {
	t.Parallel()
	e := newEnv(t, server.Config{})
	sb := e.e2bCreate(e.keyA, map[string]any{"templateID": "base"})
	page := `<!doctype html><script>fetch("/v1/account")</script>`
	want(t, e.envd(sb, "POST", "/files?path=page.html", page, "Content-Type", "application/octet-stream"), http.StatusOK, "")
	sum := sha256.Sum256([]byte("page.html:read::" + sb.Token))
	signed := "/files?path=page.html&signature=" + url.QueryEscape("v1_"+strings.TrimRight(base64.StdEncoding.EncodeToString(sum[:]), "="))
	for _, host := range []string{"", "49983-" + sb.ID + ".localhost"} {
		r := e.get("GET", host, signed, "User-Agent", chromeUA)
		if r.status != http.StatusOK || string(r.body) != page || r.header.Get("Content-Type") != "application/octet-stream" ||
			r.header.Get("X-Content-Type-Options") != "nosniff" || r.header.Get("Content-Security-Policy") != "sandbox" {
			t.Fatalf("host %q: %d %v %q", host, r.status, r.header, r.body)
		}
	}
}
