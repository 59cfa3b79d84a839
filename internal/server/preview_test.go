package server_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/sheepfold/sheepfold/internal/server"
)

// Under the fake runtime the agent runs on the host, so a port "inside"
// the sandbox is a port of the host's loopback: these tests serve apps
// there. test/integration/preview_test.go does the same inside real
// sandboxes.

// appServer serves an echo app on the loopback: it answers with what it
// saw, streams SSE at /events (one event each time next receives), and
// echoes WebSocket messages at /ws.
type appServer struct {
	port int
	next chan struct{}
}

func startApp(t testing.TB) *appServer {
	t.Helper()
	a := &appServer{next: make(chan struct{})}
	mux := http.NewServeMux()
	mux.HandleFunc("/events", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		for i := range 3 {
			select {
			case <-a.next:
			case <-r.Context().Done():
				return
			}
			fmt.Fprintf(w, "data: event %d\n\n", i)
			w.(http.Flusher).Flush()
		}
	})
	mux.HandleFunc("/ws", func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer c.CloseNow()
		for {
			typ, p, err := c.Read(r.Context())
			if err != nil {
				return
			}
			if err := c.Write(r.Context(), typ, p); err != nil {
				return
			}
		}
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		json.NewEncoder(w).Encode(map[string]any{
			"uri": r.RequestURI, "host": r.Host, "method": r.Method, "body": string(body),
			"xff": r.Header.Get("X-Forwarded-For"), "xfh": r.Header.Get("X-Forwarded-Host"),
			"xfp": r.Header.Get("X-Forwarded-Proto"), "prefix": r.Header.Get("X-Forwarded-Prefix"),
			"cookie": r.Header.Get("Cookie"), "token": r.Header.Get("Sheepfold-Preview-Token"),
			"authorization": r.Header.Get("Authorization"), "headers": r.Header,
		})
	})
	// /set-cookie answers with what acts on an origin: cookies (one
	// widened to a parent domain) and Clear-Site-Data.
	mux.HandleFunc("/set-cookie", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Add("Set-Cookie", "app=1; Path=/; HttpOnly")
		w.Header().Add("Set-Cookie", "wide=1; Domain="+r.URL.Query().Get("domain")+"; Path=/; SameSite=Lax")
		w.Header().Set("Clear-Site-Data", `"cookies"`)
		w.Header().Set("Alt-Svc", `h2="elsewhere.example:443"`)
		w.WriteHeader(http.StatusNoContent)
	})
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: mux}
	go hs.Serve(ln)
	t.Cleanup(func() { hs.Close() })
	a.port = ln.Addr().(*net.TCPAddr).Port
	return a
}

// closedPort returns a loopback port nothing listens on.
func closedPort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	return port
}

// noRedirect is a client that shows redirects rather than following them.
var noRedirect = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

// get sends a request to the server at path, with Host host ("": the
// server's), and header pairs.
func (e *env) get(method, host, path string, hdr ...string) resp {
	e.t.Helper()
	return e.send(method, host, path, "", hdr...)
}

// send is get with a body.
func (e *env) send(method, host, path, body string, hdr ...string) resp {
	e.t.Helper()
	req, err := http.NewRequest(method, e.url+path, strings.NewReader(body))
	if err != nil {
		e.t.Fatal(err)
	}
	if host != "" {
		req.Host = host
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Add(hdr[i], hdr[i+1])
	}
	res, err := noRedirect.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return resp{status: res.StatusCode, header: res.Header, body: b}
}

type portsList struct {
	Ports []struct {
		Port      int       `json:"port"`
		Listening bool      `json:"listening"`
		Addresses []string  `json:"addresses"`
		Public    bool      `json:"public"`
		URL       string    `json:"url"`
		ProxyURL  string    `json:"proxy_url"`
		SignedURL string    `json:"signed_url"`
		ExpiresAt time.Time `json:"signed_url_expires_at"`
	} `json:"ports"`
	Token       string `json:"token"`
	TokenHeader string `json:"token_header"`
}

func (e *env) ports(key, id, query string) portsList {
	e.t.Helper()
	r := e.do("GET", "/v1/sandboxes/"+id+"/ports"+query, key, nil)
	want(e.t, r, http.StatusOK, "")
	var pl portsList
	if err := json.Unmarshal(r.body, &pl); err != nil {
		e.t.Fatal(err)
	}
	return pl
}

func TestPreviewAccessAndForms(t *testing.T) {
	t.Parallel()
	e := newEnv(t, server.Config{PreviewDomain: "preview.localhost"})
	app := startApp(t)
	id := e.create(e.keyA, nil)
	idB := e.create(e.keyB, nil)
	port := strconv.Itoa(app.port)
	prefix := "/v1/sandboxes/" + id + "/proxy/" + port
	hostForm := port + "-" + id + ".preview.localhost"

	pl := e.ports(e.keyA, id, "")
	tokenB := e.ports(e.keyB, idB, "").Token
	if pl.TokenHeader != "Sheepfold-Preview-Token" || !strings.HasPrefix(pl.Token, "sfp_") || pl.Token == tokenB {
		t.Fatalf("tokens: %+v, B's %q", pl, tokenB)
	}
	found := false
	for _, p := range pl.Ports {
		if p.Port == app.port {
			found = p.Listening && !p.Public && p.ProxyURL == e.url+prefix+"/" &&
				strings.HasPrefix(p.URL, "http://"+hostForm+":") && strings.HasPrefix(p.SignedURL, p.URL+"?sf_preview=")
		}
	}
	if !found {
		t.Fatalf("port %d not listed as listening, private, with its URLs: %+v", app.port, pl)
	}

	// Private: no credential, a wrong one, another account's sandbox's
	// token, an API key (even the owner's) are all refused.
	for name, hdr := range map[string][]string{
		"none":           nil,
		"wrong token":    {"Sheepfold-Preview-Token", "sfp_0000"},
		"B's token":      {"Sheepfold-Preview-Token", tokenB},
		"owner's apikey": {"Authorization", "Bearer " + e.keyA},
	} {
		for _, form := range [][2]string{{"", prefix + "/"}, {hostForm, "/"}} {
			r := e.get("GET", form[0], form[1], hdr...)
			if r.status != http.StatusUnauthorized || !strings.Contains(string(r.body), "private") {
				t.Fatalf("%s, host %q: %d %s", name, form[0], r.status, r.body)
			}
		}
	}
	// B may neither list nor publish A's ports.
	want(t, e.do("GET", "/v1/sandboxes/"+id+"/ports", e.keyB, nil), http.StatusNotFound, "ERR_SANDBOX_NOT_FOUND")
	want(t, e.do("PUT", "/v1/sandboxes/"+id+"/ports/"+port, e.keyB, map[string]any{"public": true}), http.StatusNotFound, "ERR_SANDBOX_NOT_FOUND")

	// The token: both forms reach the app, with the path, Host and
	// X-Forwarded-* a reverse proxy sets, and without the token.
	seen := func(r resp) map[string]any {
		t.Helper()
		want(t, r, http.StatusOK, "")
		return r.json(t)
	}
	got := seen(e.get("GET", "", prefix+"/hello/w%20x?q=1", "Sheepfold-Preview-Token", pl.Token))
	srvHost := strings.TrimPrefix(e.url, "http://")
	if got["uri"] != "/hello/w%20x?q=1" || got["host"] != srvHost || got["xfh"] != srvHost || got["xfp"] != "http" ||
		got["xff"] != "127.0.0.1" || got["prefix"] != prefix || got["token"] != "" {
		t.Fatalf("path form: the app saw %v", got)
	}
	got = seen(e.get("GET", hostForm, "/a?b=c", "Sheepfold-Preview-Token", pl.Token, "Authorization", "Basic app"))
	if got["uri"] != "/a?b=c" || got["host"] != hostForm || got["xfh"] != hostForm || got["prefix"] != "" || got["authorization"] != "Basic app" {
		t.Fatalf("host form: the app saw %v", got)
	}
	// The path form without its slash redirects to it.
	if r := e.get("GET", "", prefix+"?x=1"); r.status != http.StatusPermanentRedirect || r.header.Get("Location") != prefix+"/?x=1" {
		t.Fatalf("no slash: %d %v", r.status, r.header)
	}

	// A signed URL sets a cookie and redirects to the URL without it;
	// the cookie then opens the preview, and the app never sees it.
	signed, _ := url.Parse(pl.Ports[0].SignedURL)
	for _, p := range pl.Ports {
		if p.Port == app.port {
			signed, _ = url.Parse(p.SignedURL)
		}
	}
	r := e.get("GET", signed.Host, "/?"+signed.RawQuery+"&keep=1")
	if r.status != http.StatusFound || r.header.Get("Location") != "/?keep=1" {
		t.Fatalf("signed URL: %d %v %s", r.status, r.header, r.body)
	}
	cookie := r.header.Get("Set-Cookie")
	if !strings.Contains(cookie, "sf_preview=") || !strings.Contains(cookie, "HttpOnly") || !strings.Contains(cookie, "Path=/;") {
		t.Fatalf("cookie %q", cookie)
	}
	cv := strings.Split(cookie, ";")[0]
	got = seen(e.get("GET", signed.Host, "/?keep=1", "Cookie", cv+"; app=1"))
	if got["cookie"] != "app=1" {
		t.Fatalf("the app saw the cookies %q", got["cookie"])
	}
	// That cookie is for that port of that sandbox only, and a tampered
	// or expired signature opens nothing.
	exp := strings.Split(strings.TrimPrefix(cv, "sf_preview="), ".")
	for name, v := range map[string]string{
		"expired":  strconv.FormatInt(time.Now().Add(-time.Minute).Unix(), 10) + "." + exp[1],
		"tampered": exp[0] + "." + strings.Repeat("0", len(exp[1])),
	} {
		if r := e.get("GET", hostForm, "/", "Cookie", "sf_preview="+v); r.status != http.StatusUnauthorized {
			t.Fatalf("%s cookie: %d", name, r.status)
		}
	}
	other := strconv.Itoa(closedPort(t)) + "-" + id + ".preview.localhost"
	if r := e.get("GET", other, "/", "Cookie", cv); r.status != http.StatusUnauthorized {
		t.Fatalf("cookie of port %s on another port: %d", port, r.status)
	}
	if r := e.get("GET", strconv.Itoa(app.port)+"-"+idB+".preview.localhost", "/", "Cookie", cv); r.status != http.StatusUnauthorized {
		t.Fatalf("cookie of sandbox A on sandbox B: %d", r.status)
	}
	want(t, e.do("GET", "/v1/sandboxes/"+id+"/ports?expires_in=0", e.keyA, nil), http.StatusBadRequest, "ERR_BAD_REQUEST")

	// Public: no credential needed, until it is private again.
	r = e.do("PUT", "/v1/sandboxes/"+id+"/ports/"+port, e.keyA, map[string]any{"public": true})
	want(t, r, http.StatusOK, "")
	if m := r.json(t); m["public"] != true || m["listening"] != true {
		t.Fatalf("PUT public: %s", r.body)
	}
	seen(e.get("GET", hostForm, "/"))
	seen(e.get("GET", "", prefix+"/"))
	if r := e.get("GET", strconv.Itoa(app.port)+"-"+idB+".preview.localhost", "/"); r.status != http.StatusUnauthorized {
		t.Fatalf("B's same port is not public: %d", r.status)
	}
	want(t, e.do("PUT", "/v1/sandboxes/"+id+"/ports/"+port, e.keyA, map[string]any{"public": false}), http.StatusOK, "")
	if r := e.get("GET", hostForm, "/"); r.status != http.StatusUnauthorized {
		t.Fatalf("private again: %d", r.status)
	}
	want(t, e.do("PUT", "/v1/sandboxes/"+id+"/ports/0", e.keyA, map[string]any{"public": true}), http.StatusBadRequest, "ERR_BAD_REQUEST")
	want(t, e.do("PUT", "/v1/sandboxes/"+id+"/ports/80", e.keyA, map[string]any{}), http.StatusBadRequest, "ERR_BAD_REQUEST")

	// Nothing listening: a 502 page saying so, at once.
	start := time.Now()
	r = e.get("GET", other, "/", "Sheepfold-Preview-Token", pl.Token)
	if r.status != http.StatusBadGateway || !strings.Contains(string(r.body), "Nothing listens on port") || time.Since(start) > 2*time.Second {
		t.Fatalf("closed port: %d after %v: %s", r.status, time.Since(start), r.body)
	}
	// An unknown sandbox, and a stopped one.
	if r := e.get("GET", port+"-0123456789abcdef0123.preview.localhost", "/"); r.status != http.StatusBadGateway {
		t.Fatalf("unknown sandbox: %d", r.status)
	}
	want(t, e.do("DELETE", "/v1/sandboxes/"+id, e.keyA, nil), http.StatusNoContent, "")
	if r := e.get("GET", hostForm, "/", "Sheepfold-Preview-Token", pl.Token); r.status != http.StatusBadGateway {
		t.Fatalf("stopped sandbox: %d", r.status)
	}
}

func TestPreviewStreamsUpgradesAndConcurrency(t *testing.T) {
	t.Parallel()
	e := newEnv(t, server.Config{PreviewDomain: "localhost"})
	app := startApp(t)
	id := e.create(e.keyA, nil)
	tok := e.ports(e.keyA, id, "").Token
	base := e.url + "/v1/sandboxes/" + id + "/proxy/" + strconv.Itoa(app.port)

	// SSE: each event arrives before the app writes the next.
	req, _ := http.NewRequest("GET", base+"/events", nil)
	req.Header.Set("Sheepfold-Preview-Token", tok)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(res.Body)
	for i := range 3 {
		app.next <- struct{}{}
		line, err := br.ReadString('\n')
		if err != nil || line != fmt.Sprintf("data: event %d\n", i) {
			t.Fatalf("event %d: %q, %v", i, line, err)
		}
		br.ReadString('\n')
	}
	res.Body.Close()
	if ct := res.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("content type %q", ct)
	}

	// A POST body and a chunked response pass.
	req, _ = http.NewRequest("POST", base+"/post", strings.NewReader(strings.Repeat("b", 1<<20)))
	req.Header.Set("Sheepfold-Preview-Token", tok)
	res, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	json.NewDecoder(res.Body).Decode(&got)
	res.Body.Close()
	if got["method"] != "POST" || len(got["body"].(string)) != 1<<20 {
		t.Fatalf("POST: %v", got["method"])
	}

	// WebSocket, in order, through the host form.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	wsURL := "ws://" + strconv.Itoa(app.port) + "-" + id + ".localhost:" + strings.Split(e.url, ":")[2] + "/ws"
	dialer := &net.Dialer{}
	c, _, err := websocket.Dial(ctx, wsURL, &websocket.DialOptions{
		HTTPHeader: http.Header{"Sheepfold-Preview-Token": {tok}},
		HTTPClient: &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return dialer.DialContext(ctx, "tcp", strings.TrimPrefix(e.url, "http://"))
		}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	for i := range 200 {
		msg := "message " + strconv.Itoa(i)
		if err := c.Write(ctx, websocket.MessageText, []byte(msg)); err != nil {
			t.Fatal(err)
		}
		_, p, err := c.Read(ctx)
		if err != nil || string(p) != msg {
			t.Fatalf("echo %d: %q, %v", i, p, err)
		}
	}
	c.Close(websocket.StatusNormalClosure, "")

	// 20 requests at once through one preview.
	var wg sync.WaitGroup
	errs := make(chan error, 20)
	for i := range 20 {
		wg.Go(func() {
			req, _ := http.NewRequest("GET", base+"/n/"+strconv.Itoa(i), nil)
			req.Header.Set("Sheepfold-Preview-Token", tok)
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				errs <- err
				return
			}
			defer res.Body.Close()
			var got map[string]any
			if err := json.NewDecoder(res.Body).Decode(&got); err != nil || got["uri"] != "/n/"+strconv.Itoa(i) {
				errs <- fmt.Errorf("request %d: %v %v", i, got, err)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func TestPreviewE2BTrafficRules(t *testing.T) {
	t.Parallel()
	e := newEnv(t, server.Config{PreviewDomain: "e2b.localhost"})
	app := startApp(t)
	port := strconv.Itoa(app.port)

	r := e.e2bDo("POST", "/v2/sandboxes", e.keyA, map[string]any{"templateID": "base"})
	want(t, r, http.StatusCreated, "")
	m := r.json(t)
	if m["domain"] != "e2b.localhost:"+strings.Split(e.url, ":")[2] {
		t.Fatalf("domain %v: getHost(port) would not name the preview host", m["domain"])
	}
	open := e2bSandbox{ID: m["sandboxID"].(string), Token: m["envdAccessToken"].(string), Traffic: m["trafficAccessToken"].(string)}
	closed := e.e2bCreate(e.keyA, map[string]any{"templateID": "base", "network": map[string]any{"allowPublicTraffic": false}})
	other := e.e2bCreate(e.keyB, map[string]any{"templateID": "base", "network": map[string]any{"allowPublicTraffic": false}})

	// E2B's default: public traffic, by header and by getHost's host.
	r = e.get("GET", "", "/x", "E2b-Sandbox-Id", open.ID, "E2b-Sandbox-Port", port)
	want(t, r, http.StatusOK, "")
	if got := r.json(t); got["uri"] != "/x" {
		t.Fatalf("header form: %v", got)
	}
	want(t, e.get("GET", port+"-"+open.ID+".e2b.localhost", "/"), http.StatusOK, "")

	// allowPublicTraffic false: the traffic token of this sandbox only.
	for _, form := range [][]string{
		{"", "E2b-Sandbox-Id", closed.ID, "E2b-Sandbox-Port", port},
		{port + "-" + closed.ID + ".e2b.localhost"},
	} {
		host, hdr := form[0], form[1:]
		if r := e.get("GET", host, "/", hdr...); r.status != http.StatusUnauthorized {
			t.Fatalf("%v without a token: %d", form, r.status)
		}
		for _, tok := range []string{other.Traffic, open.Traffic, closed.Token} {
			if r := e.get("GET", host, "/", append(hdr, "E2B-Traffic-Access-Token", tok)...); r.status != http.StatusUnauthorized {
				t.Fatalf("%v with another sandbox's or kind of token: %d", form, r.status)
			}
		}
		r := e.get("GET", host, "/", append(hdr, "E2B-Traffic-Access-Token", closed.Traffic)...)
		want(t, r, http.StatusOK, "")
	}

	// getHost's host for envd's port is envd.
	r = e.get("GET", "49983-"+open.ID+".e2b.localhost", "/health", "X-Access-Token", open.Token)
	if r.status/100 != 2 {
		t.Fatalf("envd by host: %d %s", r.status, r.body)
	}
	// An unknown sandbox answers E2B's 502.
	r = e.get("GET", "", "/", "E2b-Sandbox-Id", "0123456789abcdef0123", "E2b-Sandbox-Port", port)
	if r.status != http.StatusBadGateway || e2bCode(t, r) != 502 {
		t.Fatalf("unknown sandbox: %d %s", r.status, r.body)
	}
}
