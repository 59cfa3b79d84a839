package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/auth"
	"github.com/sheepfold/sheepfold/internal/server"
	"github.com/sheepfold/sheepfold/internal/testutil/nodejs"
)

// hostilePage is what a tenant's app serves to whoever opens its
// preview: its script tries, with the viewer's browser, everything a
// page on the API's origin could do, and leaves what it obtained in
// window.__results. Its answer also tries to set a cookie for the API's
// origin (Domain=localhost).
const hostilePage = `<!doctype html>
<html><head><meta charset="utf-8"><title>a tenant's app</title></head>
<body><h1>a tenant's app</h1>
<script>
(async () => {
  const api = new URLSearchParams(location.search).get('api')
  const r = { location: location.href }
  const attempt = async (f) => { try { return await f() } catch (e) { return { error: e.name + ': ' + e.message } } }
  r.cookie = document.cookie
  for (const p of ['/v1/sandboxes', '/v1/account']) {
    r[p] = await attempt(async () => {
      const res = await fetch(api + p, { credentials: 'include', headers: { 'X-Sheepfold-UI': '1' } })
      return { status: res.status, body: (await res.text()).slice(0, 300) }
    })
  }
  document.cookie = 'planted_host=1; path=/'
  document.cookie = 'planted_domain=1; domain=localhost; path=/'
  r.opener = await attempt(async () => ({ read: window.opener.document.body.innerText.slice(0, 300) }))
  r.popup = await attempt(() => new Promise((resolve, reject) => {
    const w = window.open(api + '/ui/')
    if (!w) return reject(new Error('popup blocked'))
    const start = Date.now()
    const poll = () => {
      try {
        if (w.document.querySelector('#sandboxes, #no-sandboxes')) {
          resolve({ read: w.document.body.innerText.slice(0, 300) })
          return
        }
      } catch (e) { return reject(e) }
      if (Date.now() - start > 30000) return reject(new Error('the window never showed the dashboard'))
      setTimeout(poll, 50)
    }
    poll()
  }))
  r.iframe = await attempt(() => new Promise((resolve, reject) => {
    const f = document.createElement('iframe')
    f.onload = () => { try { resolve({ read: f.contentDocument.body.innerText.slice(0, 100) }) } catch (e) { reject(e) } }
    f.src = api + '/v1/openapi.json'
    document.body.appendChild(f)
  }))
  window.__results = r
})()
</script></body></html>
`

// attempt is one thing the hostile page tried: what it read, or why not.
type attempt struct {
	Status int    `json:"status"`
	Body   string `json:"body"`
	Read   string `json:"read"`
	Error  string `json:"error"`
}

type hostileResults struct {
	Location   string   `json:"location"`
	Final      string   `json:"final"`
	Cookie     string   `json:"cookie"`
	Sandboxes  attempt  `json:"/v1/sandboxes"`
	Account    attempt  `json:"/v1/account"`
	Opener     attempt  `json:"opener"`
	Popup      attempt  `json:"popup"`
	Iframe     attempt  `json:"iframe"`
	APICookies []string `json:"apiCookies"`
}

// TestPreviewBrowserIsolation: a logged-in dashboard viewer (an admin)
// opens another tenant's preview in Chromium; the preview's script gets
// none of the viewer's cookies, cannot call the API as the viewer, sets
// no cookie on the API's origin and cannot script the dashboard (opener,
// a window it opens, a frame of the API's origin), whether opened by
// its host form or by the path form (which sends browsers there); the
// app never receives the viewer's session cookie. Control: the same page
// served through a plain proxy on the API's origin, as previews were
// served before, obtains each of them.
func TestPreviewBrowserIsolation(t *testing.T) {
	t.Parallel()
	e := newEnv(t, server.Config{}) // previews on {port}-{id}.localhost
	admin := adminKey(t, e)

	// The tenant's app (the fake runtime's sandbox ports are the host's
	// loopback) records what reaches it.
	var mu sync.Mutex
	seen := map[bool][]http.Header{} // by whether the request came through a preview; guarded by mu
	appAddr, appPort := serveApp(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		preview := strings.Contains(r.Host, ".localhost")
		seen[preview] = append(seen[preview], r.Header.Clone())
		mu.Unlock()
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Header().Add("Set-Cookie", "planted_header=1; Domain=localhost; Path=/")
		w.Write([]byte(hostilePage))
	}))

	// The server, with the control beside it: /old-proxy/ passes to the
	// same app as the path form once did, on the API's origin.
	old := httputil.NewSingleHostReverseProxy(&url.URL{Scheme: "http", Host: appAddr})
	api, lport := serveBrowsable(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if rest, ok := strings.CutPrefix(r.URL.Path, "/old-proxy"); ok && !strings.Contains(r.Host, ".localhost") {
			r.URL.Path = rest
			old.ServeHTTP(w, r)
			return
		}
		e.srv.ServeHTTP(w, r)
	}))

	id := e.create(e.keyB, nil)
	want(t, e.do("PUT", "/v1/sandboxes/"+id+"/ports/"+strconv.Itoa(appPort), e.keyB, map[string]any{"public": true}), http.StatusOK, "")
	q := "?api=" + url.QueryEscape(api)
	hostForm := "http://" + strconv.Itoa(appPort) + "-" + id + ".localhost:" + lport + "/"
	raw := runBrowser(t, api, admin, [][2]string{
		{"host", hostForm + q},
		{"path", api + "/v1/sandboxes/" + id + "/proxy/" + strconv.Itoa(appPort) + "/" + q},
		{"control", api + "/old-proxy/" + q}, // last: it plants cookies on the API's origin
	})
	res := map[string]hostileResults{}
	for name, m := range raw {
		var r hostileResults
		if err := json.Unmarshal(m, &r); err != nil {
			t.Fatalf("%s: %v: %s", name, err, m)
		}
		res[name] = r
		t.Logf("%s: %+v", name, r)
	}

	// Control: on the API's origin the page obtains each of them.
	c := res["control"]
	planted := func(names []string) []string {
		var p []string
		for _, n := range names {
			if strings.HasPrefix(n, "planted") {
				p = append(p, n)
			}
		}
		return p
	}
	if !strings.Contains(c.Cookie, "secret-api-cookie") || c.Sandboxes.Status != http.StatusOK || c.Account.Status != http.StatusOK ||
		!strings.Contains(c.Account.Body, `"id"`) || c.Opener.Read == "" || c.Popup.Read == "" || !strings.Contains(c.Iframe.Read, "openapi") ||
		len(planted(c.APICookies)) < 3 {
		t.Fatalf("control: the page on the API's origin did not obtain everything, so the test proves nothing: %+v", c)
	}
	mu.Lock()
	controlSaw := len(seen[false]) > 0 && strings.Contains(strings.Join(seen[false][0].Values("Cookie"), ";"), "sheepfold_ui=")
	mu.Unlock()
	if !controlSaw {
		t.Fatalf("control: the app behind a plain proxy did not receive the viewer's session cookie: %v", seen[false])
	}

	// A preview, by either form: nothing.
	for _, name := range []string{"host", "path"} {
		r := res[name]
		if !strings.HasPrefix(r.Final, hostForm) {
			t.Errorf("%s: the page ran at %s, not on the preview's origin %s", name, r.Final, hostForm)
		}
		if strings.Contains(r.Cookie, "secret-api-cookie") {
			t.Errorf("%s: read the API's cookie: %q", name, r.Cookie)
		}
		for what, a := range map[string]attempt{"/v1/sandboxes": r.Sandboxes, "/v1/account": r.Account} {
			if a.Error == "" || a.Status != 0 || a.Body != "" {
				t.Errorf("%s: fetch %s as the viewer: %+v", name, what, a)
			}
		}
		for what, a := range map[string]attempt{"opener": r.Opener, "popup": r.Popup, "iframe": r.Iframe} {
			if a.Error == "" || a.Read != "" {
				t.Errorf("%s: scripted the dashboard through its %s: %+v", name, what, a)
			}
		}
		if p := planted(r.APICookies); len(p) > 0 {
			t.Errorf("%s: set cookies on the API's origin: %v", name, p)
		}
	}
	// The app never received the viewer's credentials.
	mu.Lock()
	defer mu.Unlock()
	if len(seen[true]) < 2 {
		t.Fatalf("the app saw %d requests through the preview, want both runs' pages", len(seen[true]))
	}
	for i, h := range seen[true] {
		for _, k := range []string{"Cookie", "Authorization", "X-Sheepfold-Ui"} {
			if v := strings.Join(h.Values(k), ";"); strings.Contains(v, "sheepfold_ui") || strings.Contains(v, "secret-api-cookie") || strings.Contains(v, admin) || k != "Cookie" && v != "" {
				t.Errorf("request %d reached the app with %s: %q", i, k, v)
			}
		}
	}
}

// crossPage is a tenant's page that makes the viewer's browser send a
// request to another preview, $probe, with the viewer's credentials
// (no-cors: the page cannot read the answer, but the request is made).
const crossPage = `<!doctype html>
<html><head><meta charset="utf-8"></head><body><script>
(async () => {
  const probe = new URLSearchParams(location.search).get('probe')
  const r = {}
  if (probe) {
    try { await fetch(probe, { mode: 'no-cors', credentials: 'include' }); r.sent = true } catch (e) { r.error = e.name }
  }
  window.__results = r
})()
</script></body></html>
`

// TestPreviewCrossTenantSite: under the default preview domain, each
// preview is a site of its own: the viewer holds the cookie of another
// tenant's private preview (opened by its signed URL), and a tenant's
// page that makes the browser request that preview sends no such cookie:
// the server refuses the request and the victim's app never sees it.
// Control: under preview.localhost, which is not a public suffix, the
// previews share a site and the same request carries the cookie to the
// victim's app (docs/security.md, section 2, "Not promised").
func TestPreviewCrossTenantSite(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		domain string
		shared bool
	}{{"", false}, {"preview.localhost", true}} {
		t.Run("domain="+c.domain, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, server.Config{PreviewDomain: c.domain})
			domain := c.domain
			if domain == "" {
				domain = server.DefaultPreviewDomain
			}
			var mu sync.Mutex
			var probed int // requests for /probe the victim's app got; guarded by mu
			page := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path == "/probe" {
					mu.Lock()
					probed++
					mu.Unlock()
				}
				w.Header().Set("Content-Type", "text/html; charset=utf-8")
				w.Write([]byte(crossPage))
			})
			_, victimPort := serveApp(t, page)
			_, attackerPort := serveApp(t, page)
			api, lport := serveBrowsable(t, e.srv)
			victim := e.create(e.keyA, nil)
			attacker := e.create(e.keyB, nil)
			want(t, e.do("PUT", "/v1/sandboxes/"+attacker+"/ports/"+strconv.Itoa(attackerPort), e.keyB, map[string]any{"public": true}), http.StatusOK, "")
			victimHost := "http://" + strconv.Itoa(victimPort) + "-" + victim + "." + domain + ":" + lport
			var signed string
			for _, p := range e.ports(e.keyA, victim, "").Ports {
				if _, q, ok := strings.Cut(p.SignedURL, "/?"); ok && p.Port == victimPort {
					signed = victimHost + "/?" + q // as the browser's server names it
				}
			}
			if signed == "" {
				t.Fatalf("no signed URL of port %d", victimPort)
			}
			victimURL := victimHost + "/probe"
			runBrowser(t, api, adminKey(t, e), [][2]string{
				{"victim", signed},
				{"attacker", "http://" + strconv.Itoa(attackerPort) + "-" + attacker + "." + domain + ":" + lport + "/?probe=" + url.QueryEscape(victimURL)},
			})
			mu.Lock()
			defer mu.Unlock()
			if got := probed > 0; got != c.shared {
				t.Fatalf("the victim's app got %d requests from the attacker's page with the viewer's cookie; want some: %v", probed, c.shared)
			}
		})
	}
}

// adminKey makes an admin key: the dashboard's viewer.
func adminKey(t *testing.T, e *env) string {
	t.Helper()
	_, admin, err := auth.Create(context.Background(), e.store, auth.CreateOptions{Name: "viewer", Admin: true})
	if err != nil {
		t.Fatal(err)
	}
	return admin
}

// serveApp serves h on a loopback port: under the fake runtime, a port
// inside the sandbox.
func serveApp(t *testing.T, h http.Handler) (addr string, port int) {
	t.Helper()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: h}
	go hs.Serve(ln)
	t.Cleanup(func() { hs.Close() })
	return ln.Addr().String(), ln.Addr().(*net.TCPAddr).Port
}

// serveBrowsable serves h on a loopback port and returns its URL as a
// browser names it (http://localhost:PORT, the API's origin) and the port.
func serveBrowsable(t *testing.T, h http.Handler) (string, string) {
	t.Helper()
	hs := httptest.NewServer(h)
	t.Cleanup(hs.Close)
	lport := strings.Split(hs.URL, ":")[2]
	return "http://localhost:" + lport, lport
}

// runBrowser runs test/ui/preview-isolation.mjs: Chromium logs in to the
// dashboard at api with key, then opens each run's URL from it and
// returns what each page left in window.__results.
func runBrowser(t *testing.T, api, key string, runs [][2]string) map[string]json.RawMessage {
	t.Helper()
	node := nodejs.LookNode(t)
	chromium := "/usr/bin/chromium"
	if _, err := os.Stat(chromium); err != nil {
		t.Fatalf("chromium is missing (scripts/setup.sh installs it): %v", err)
	}
	uiDir, err := filepath.Abs("../../test/ui")
	if err != nil {
		t.Fatal(err)
	}
	nodejs.NpmCI(t, uiDir)
	list, err := json.Marshal(runs)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "preview-isolation.mjs")
	cmd.Dir = uiDir
	cmd.Env = append(nodejs.Environ(), "SHEEPFOLD_URL="+api, "SHEEPFOLD_API_KEY="+key, "RUNS="+string(list), "CHROMIUM="+chromium)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.Output()
	if err != nil {
		t.Fatalf("preview-isolation.mjs: %v\n%s\n%s", err, stdout, stderr.Bytes())
	}
	lines := strings.Split(strings.TrimSpace(string(stdout)), "\n")
	var res map[string]json.RawMessage
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &res); err != nil {
		t.Fatalf("preview-isolation.mjs printed %q: %v", stdout, err)
	}
	return res
}
