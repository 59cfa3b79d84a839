package integration

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/sheepfold/sheepfold/client"
)

// previewApp is a Python app run inside the sandbox: a chunked SSE stream
// at /events (event i+1 is written only after a GET /next, so a test can
// tell streaming from buffering) and a WebSocket echo at /ws (RFC 6455
// by hand: the template has no WebSocket library).
const previewApp = `
import base64, hashlib, struct, sys, threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

step = threading.Semaphore(0)

class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a): pass

    def chunk(self, b):
        self.wfile.write(b"%x\r\n%s\r\n" % (len(b), b)); self.wfile.flush()

    def do_GET(self):
        if self.path == "/next":
            step.release()
            self.send_response(204); self.send_header("Content-Length", "0"); self.end_headers(); return
        if self.path == "/events":
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for i in range(3):
                if i: step.acquire()
                self.chunk(b"data: event %d\n\n" % i)
            self.chunk(b""); return
        if self.path == "/ws" and self.headers.get("Upgrade", "").lower() == "websocket":
            key = self.headers["Sec-WebSocket-Key"]
            acc = base64.b64encode(hashlib.sha1((key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest()).decode()
            self.send_response(101)
            self.send_header("Upgrade", "websocket"); self.send_header("Connection", "Upgrade")
            self.send_header("Sec-WebSocket-Accept", acc); self.end_headers(); self.wfile.flush()
            self.echo(); self.close_connection = True; return
        self.send_error(404)

    def read(self, n):
        b = self.rfile.read(n)
        if len(b) < n: raise EOFError
        return b

    def send_frame(self, op, data):
        n = len(data)
        hdr = bytes([0x80 | op]) + (bytes([n]) if n < 126 else struct.pack(">BH", 126, n) if n < 65536 else struct.pack(">BQ", 127, n))
        self.wfile.write(hdr + data); self.wfile.flush()

    def echo(self):
        try:
            while True:
                b1, b2 = self.read(2)
                op, n = b1 & 15, b2 & 127
                if n == 126: n = struct.unpack(">H", self.read(2))[0]
                elif n == 127: n = struct.unpack(">Q", self.read(8))[0]
                mask = self.read(4) if b2 & 128 else b"\0\0\0\0"
                data = bytes(c ^ mask[i % 4] for i, c in enumerate(self.read(n)))
                if op == 8: self.send_frame(8, data[:2]); return
                if op == 9: self.send_frame(10, data); continue
                self.send_frame(op, data)
        except EOFError:
            return

ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
`

// previewEnv is one sandbox running the test apps, as seen through the
// server's preview URLs.
type previewEnv struct {
	t     *testing.T
	s     *server
	c     *client.Client
	id    string
	token string
}

// startPreviewApps starts python3 -m http.server (8000), a Node HTTP
// server (3000) and previewApp (9000) in a new sandbox, and waits until
// the sandbox lists all three as listening.
func startPreviewApps(t *testing.T) *previewEnv {
	t.Helper()
	s := start(t)
	ctx := context.Background()
	c := client.New(s.url, s.key)
	sb, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{Timeout: 10 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Kill(context.Background(), sb.ID) })
	if _, err := c.WriteFile(ctx, sb.ID, "/home/user/site/hello.txt", strings.NewReader("hello from the sandbox\n")); err != nil {
		t.Fatal(err)
	}
	if _, err := c.WriteFile(ctx, sb.ID, "/home/user/app.py", strings.NewReader(previewApp)); err != nil {
		t.Fatal(err)
	}
	for _, cmd := range []client.CommandRequest{
		{Cmd: "python3", Args: []string{"-m", "http.server", "8000", "--bind", "127.0.0.1"}, Cwd: "/home/user/site"},
		{Cmd: "node", Args: []string{"-e", `require("http").createServer((q, s) => { s.setHeader("content-type", "text/plain"); s.end("node " + q.url + " " + q.headers.host + " " + q.headers["x-forwarded-host"]) }).listen(3000)`}},
		{Cmd: "python3", Args: []string{"/home/user/app.py", "9000"}},
	} {
		if _, err := c.StartCommand(ctx, sb.ID, cmd); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		ps, err := c.Ports(ctx, sb.ID, 0)
		if err != nil {
			t.Fatal(err)
		}
		up := 0
		for _, p := range ps.Ports {
			if p.Listening && (p.Port == 8000 || p.Port == 3000 || p.Port == 9000) {
				up++
			}
		}
		if up == 3 {
			return &previewEnv{t: t, s: s, c: c, id: sb.ID, token: ps.Token}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the apps did not listen within 30 s: %+v", ps.Ports)
		}
		time.Sleep(50 * time.Millisecond) // polling the sandbox's /proc/net/tcp until the apps are up
	}
}

// hostForm is the Host of port's preview (serve --preview-domain localhost).
func (p *previewEnv) hostForm(port int) string {
	return strconv.Itoa(port) + "-" + p.id + ".localhost:" + strings.Split(p.s.url, ":")[2]
}

// get fetches path of port's preview in the path form (host "") or with
// the host form's Host, with the preview token.
func (p *previewEnv) get(port int, host, path string) (int, string) {
	p.t.Helper()
	u := p.s.url + "/v1/sandboxes/" + p.id + "/proxy/" + strconv.Itoa(port) + path
	if host != "" {
		u = p.s.url + path
	}
	req, _ := http.NewRequest("GET", u, nil)
	if host != "" {
		req.Host = host
	}
	req.Header.Set("Sheepfold-Preview-Token", p.token)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		p.t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		p.t.Fatal(err)
	}
	return res.StatusCode, string(b)
}

func TestPreviewApps(t *testing.T) {
	t.Parallel()
	p := startPreviewApps(t)
	ctx := context.Background()
	for _, host := range []string{"", p.hostForm(8000)} {
		if code, body := p.get(8000, host, "/hello.txt"); code != 200 || body != "hello from the sandbox\n" {
			t.Fatalf("http.server (host %q): %d %q", host, code, body)
		}
	}
	srvHost := strings.TrimPrefix(p.s.url, "http://")
	if code, body := p.get(3000, "", "/a?b=1"); code != 200 || body != "node /a?b=1 "+srvHost+" "+srvHost {
		t.Fatalf("node, path form: %d %q", code, body)
	}
	if code, body := p.get(3000, p.hostForm(3000), "/x"); code != 200 || body != "node /x "+p.hostForm(3000)+" "+p.hostForm(3000) {
		t.Fatalf("node, host form: %d %q", code, body)
	}

	// Private by default: no token, no preview; public, no token needed.
	res, err := http.Get(p.s.url + "/v1/sandboxes/" + p.id + "/proxy/8000/hello.txt")
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusUnauthorized {
		t.Fatalf("private port without a token: %d", res.StatusCode)
	}
	if _, err := p.c.SetPortPublic(ctx, p.id, 8000, true); err != nil {
		t.Fatal(err)
	}
	res, err = http.Get(p.s.url + "/v1/sandboxes/" + p.id + "/proxy/8000/hello.txt")
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Fatalf("public port: %d", res.StatusCode)
	}

	// Nothing on 8001: a 502 page saying so, at once.
	start := time.Now()
	if code, body := p.get(8001, "", "/"); code != http.StatusBadGateway || !strings.Contains(body, "Nothing listens on port 8001") || time.Since(start) > 2*time.Second {
		t.Fatalf("closed port: %d after %v: %s", code, time.Since(start), body)
	}

	// SSE, chunked: each event arrives while the app waits to write the next.
	for _, host := range []string{"", p.hostForm(9000)} {
		u := p.s.url + "/v1/sandboxes/" + p.id + "/proxy/9000/events"
		if host != "" {
			u = p.s.url + "/events"
		}
		req, _ := http.NewRequest("GET", u, nil)
		req.Host = host
		req.Header.Set("Sheepfold-Preview-Token", p.token)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		br := bufio.NewReader(res.Body)
		for i := range 3 {
			if i > 0 {
				if code, _ := p.get(9000, "", "/next"); code != http.StatusNoContent {
					t.Fatalf("next: %d", code)
				}
			}
			line, err := br.ReadString('\n')
			if err != nil || line != fmt.Sprintf("data: event %d\n", i) {
				t.Fatalf("host %q, event %d: %q, %v", host, i, line, err)
			}
			br.ReadString('\n')
		}
		res.Body.Close()
	}

	// 20 requests at once through one preview.
	var wg sync.WaitGroup
	errs := make(chan string, 20)
	for range 20 {
		wg.Go(func() {
			req, _ := http.NewRequest("GET", p.s.url+"/v1/sandboxes/"+p.id+"/proxy/3000/c", nil)
			req.Header.Set("Sheepfold-Preview-Token", p.token)
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				errs <- err.Error()
				return
			}
			b, _ := io.ReadAll(res.Body)
			res.Body.Close()
			if res.StatusCode != 200 || !strings.HasPrefix(string(b), "node /c ") {
				errs <- fmt.Sprintf("%d %q", res.StatusCode, b)
			}
		})
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
}

// TestPreviewWebSocketIdleThenTenThousand keeps a WebSocket open through
// the preview for 60 s without traffic, then echoes 10,000 messages in
// order (written by one goroutine while another reads).
func TestPreviewWebSocketIdleThenTenThousand(t *testing.T) {
	t.Parallel()
	p := startPreviewApps(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	addr := strings.TrimPrefix(p.s.url, "http://")
	var d net.Dialer
	c, _, err := websocket.Dial(ctx, "ws://"+p.hostForm(9000)+"/ws", &websocket.DialOptions{
		HTTPHeader: http.Header{"Sheepfold-Preview-Token": {p.token}},
		HTTPClient: &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return d.DialContext(ctx, "tcp", addr)
		}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	echo := func(msg string) {
		t.Helper()
		if err := c.Write(ctx, websocket.MessageText, []byte(msg)); err != nil {
			t.Fatal(err)
		}
		if _, b, err := c.Read(ctx); err != nil || string(b) != msg {
			t.Fatalf("echo %q: %q, %v", msg, b, err)
		}
	}
	echo("before the idle minute")
	time.Sleep(60 * time.Second) // the idle minute is what is tested
	echo("after the idle minute")

	const n = 10000
	werr := make(chan error, 1)
	go func() {
		for i := range n {
			if err := c.Write(ctx, websocket.MessageText, []byte("m"+strconv.Itoa(i))); err != nil {
				werr <- err
				return
			}
		}
		werr <- nil
	}()
	for i := range n {
		_, b, err := c.Read(ctx)
		if err != nil || string(b) != "m"+strconv.Itoa(i) {
			t.Fatalf("message %d: %q, %v", i, b, err)
		}
	}
	if err := <-werr; err != nil {
		t.Fatal(err)
	}
	c.Close(websocket.StatusNormalClosure, "")
}
