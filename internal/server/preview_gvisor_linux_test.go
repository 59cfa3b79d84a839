package server_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"golang.org/x/sys/unix"

	"github.com/sheepfold/sheepfold/internal/runtime/oci"
	"github.com/sheepfold/sheepfold/internal/server"
	"github.com/sheepfold/sheepfold/internal/testutil"
)

// previewApp is Python for a sandbox's kernel: an HTTP server on port
// %d, in a thread of the kernel, that answers a GET with the kernel's
// release and the path, and an Upgrade: websocket with an echo of each
// text message (the standard library alone).
const previewApp = `
import base64, hashlib, http.server, os, socketserver, struct, threading
class H(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a): pass
    def do_GET(self):
        if self.headers.get("Upgrade", "").lower() != "websocket":
            body = ("%%s %%s" %% (os.uname().release, self.path)).encode()
            self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers()
            self.wfile.write(body); return
        key = self.headers["Sec-WebSocket-Key"] + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
        self.send_response(101); self.send_header("Upgrade", "websocket"); self.send_header("Connection", "Upgrade")
        self.send_header("Sec-WebSocket-Accept", base64.b64encode(hashlib.sha1(key.encode()).digest()).decode()); self.end_headers()
        r, w = self.rfile, self.wfile
        while True:
            b0, b1 = r.read(2)
            n = b1 & 127
            if n == 126: n = struct.unpack(">H", r.read(2))[0]
            elif n == 127: n = struct.unpack(">Q", r.read(8))[0]
            mask = r.read(4) if b1 & 128 else b"\0\0\0\0"
            data = bytes(c ^ mask[i %% 4] for i, c in enumerate(r.read(n)))
            if b0 & 15 == 8: w.write(b"\x88\0"); w.flush(); return
            w.write(bytes([0x81, len(data)]) + data if len(data) < 126 else bytes([0x81, 126]) + struct.pack(">H", len(data)) + data); w.flush()
class S(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
srv = S(("0.0.0.0", %d), H)
threading.Thread(target=srv.serve_forever, daemon=True).start()
`

// TestPreviewGVisor: a port inside a gVisor sandbox is a preview as under
// runc, through both forms (the path form with its token, the host form
// with its token): HTTP reaches the app, which runs on gVisor's kernel
// (its release is not the host's), and a WebSocket echoes in order
// through each. The preview goes through the agent inside (it connects
// to the port on the sandbox's loopback), so nothing of the host listens
// or connects into the Sentry; the ports list shows the port listening.
// Control: without the token the same request is refused.
func TestPreviewGVisor(t *testing.T) {
	e := runcEnvOCI(t, func(c *oci.Config) { c.RunscPath = testutil.Runsc(t) }, server.Config{PreviewDomain: "preview.localhost"})
	id := e.create(e.keyA, map[string]any{"runtime": "gvisor"})
	const port = 8000
	r := e.do("POST", "/v1/sandboxes/"+id+"/execute", e.keyA, map[string]any{"code": fmt.Sprintf(previewApp, port)})
	want(t, r, http.StatusOK, "")
	if m := r.json(t); m["error"] != nil {
		t.Fatalf("the app did not start: %s", r.body)
	}
	pl := e.ports(e.keyA, id, "")
	tok := pl.Token
	listed := false
	for _, lp := range pl.Ports {
		listed = listed || lp.Port == port && lp.Listening
	}
	if !listed {
		t.Fatalf("port %d is not listed as listening: %+v", port, pl.Ports)
	}
	p := strconv.Itoa(port)
	path := "/v1/sandboxes/" + id + "/proxy/" + p
	host := p + "-" + id + ".preview.localhost"
	release := hostRelease(t)

	for name, req := range map[string][]string{
		"path form": {"", path + "/x?y=1"},
		"host form": {host, "/x?y=1"},
	} {
		r := e.get("GET", req[0], req[1], "Sheepfold-Preview-Token", tok)
		kernel, got, _ := strings.Cut(string(r.body), " ")
		if r.status != http.StatusOK || got != "/x?y=1" || kernel == "" || kernel == release {
			t.Fatalf("%s: %d %q (host kernel %s)", name, r.status, r.body, release)
		}
		// Control: the same request without the token.
		if r := e.get("GET", req[0], req[1]); r.status == http.StatusOK {
			t.Fatalf("%s without the token: %d %s", name, r.status, r.body)
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	addr := strings.TrimPrefix(e.url, "http://")
	for name, u := range map[string]string{
		"path form": "ws://" + addr + path + "/ws",
		"host form": "ws://" + host + ":" + strings.Split(addr, ":")[1] + "/ws",
	} {
		var d net.Dialer
		c, _, err := websocket.Dial(ctx, u, &websocket.DialOptions{
			HTTPHeader: http.Header{"Sheepfold-Preview-Token": {tok}},
			HTTPClient: &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				return d.DialContext(ctx, "tcp", addr)
			}}},
		})
		if err != nil {
			t.Fatalf("%s: websocket: %v", name, err)
		}
		for i := range 50 {
			msg := name + " message " + strconv.Itoa(i)
			if err := c.Write(ctx, websocket.MessageText, []byte(msg)); err != nil {
				t.Fatal(err)
			}
			if _, got, err := c.Read(ctx); err != nil || string(got) != msg {
				t.Fatalf("%s: echo %d: %q, %v", name, i, got, err)
			}
		}
		c.Close(websocket.StatusNormalClosure, "")
	}
}

func hostRelease(t *testing.T) string {
	t.Helper()
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		t.Fatal(err)
	}
	return unix.ByteSliceToString(u.Release[:])
}
