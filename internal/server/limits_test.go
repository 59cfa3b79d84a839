package server_test

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"mime/multipart"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/sheepfold/sheepfold/internal/e2b/envdpb/filesystempb"
	"github.com/sheepfold/sheepfold/internal/server"
)

// TestStalledBodyIsCut: a client that declares a body and stops sending
// it does not hold its connection forever, even on an unauthenticated
// route that never reads the body.
func TestStalledBodyIsCut(t *testing.T) {
	t.Parallel()
	e := newEnv(t, server.Config{BodyReadTimeout: 300 * time.Millisecond})
	for _, path := range []string{"/healthz", "/v1/sandboxes"} {
		conn, err := net.Dial("tcp", strings.TrimPrefix(e.url, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n{", path, e.keyA)
		conn.SetDeadline(time.Now().Add(10 * time.Second))
		br := bufio.NewReader(conn)
		// Whatever the server answers, it must then close the connection.
		if res, err := http.ReadResponse(br, nil); err == nil {
			io.Copy(io.Discard, res.Body)
			res.Body.Close()
		}
		start := time.Now()
		if _, err := io.Copy(io.Discard, br); err != nil {
			t.Fatalf("%s: the connection was not closed: %v", path, err)
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Fatalf("%s: closed only after %v", path, d)
		}
	}
}

// TestSlowBodyPasses: a body that keeps arriving, however slowly in all,
// is not cut by the stall timeout.
func TestSlowBodyPasses(t *testing.T) {
	t.Parallel()
	e := newEnv(t, server.Config{BodyReadTimeout: 400 * time.Millisecond})
	pr, pw := io.Pipe()
	go func() {
		body := `{"template":"python","metadata":{"slow":"yes"}}`
		for i := 0; i < len(body); i += 8 {
			pw.Write([]byte(body[i:min(i+8, len(body))]))
			time.Sleep(100 * time.Millisecond) // a slow client, not synchronisation
		}
		pw.Close()
	}()
	req, _ := http.NewRequest("POST", e.url+"/v1/sandboxes", pr)
	req.Header.Set("Authorization", "Bearer "+e.keyA)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusCreated {
		t.Fatalf("status %d: %s", res.StatusCode, b)
	}
}

// TestBodyLimits: multipart uploads are bounded in total, not only per
// part (on /v1 and on E2B's /files, gzip included); Connect messages are
// bounded compressed and decompressed; metadata and env are bounded.
func TestBodyLimits(t *testing.T) {
	t.Parallel()
	e := newEnv(t, server.Config{MaxUploadBytes: 1 << 20})
	id := e.create(e.keyA, nil)
	part := bytes.Repeat([]byte("x"), 900<<10) // under the per-file limit

	multi := func(n int) (string, []byte) {
		var buf bytes.Buffer
		mw := multipart.NewWriter(&buf)
		for i := range n {
			fw, _ := mw.CreateFormFile("file", fmt.Sprintf("f%d.txt", i))
			fw.Write(part)
		}
		mw.Close()
		return mw.FormDataContentType(), buf.Bytes()
	}
	ct, body := multi(1)
	want(t, e.do("POST", "/v1/sandboxes/"+id+"/files?path=/tmp", e.keyA, body, "Content-Type", ct), http.StatusCreated, "")
	ct, body = multi(3)
	want(t, e.do("POST", "/v1/sandboxes/"+id+"/files?path=/tmp", e.keyA, body, "Content-Type", ct), http.StatusRequestEntityTooLarge, "ERR_FILE_TOO_LARGE")

	sb := e.e2bCreate(e.keyA, nil)
	r := e.envd(sb, "POST", "/files", body, "Content-Type", ct)
	if r.status != http.StatusRequestEntityTooLarge {
		t.Fatalf("E2B multipart of 3 x 900 KiB: %d %s", r.status, r.body)
	}
	// Gzipped, the same form is a few KiB: the decompressed size counts.
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write(body)
	zw.Close()
	r = e.envd(sb, "POST", "/files", gz.Bytes(), "Content-Type", ct, "Content-Encoding", "gzip")
	if r.status != http.StatusRequestEntityTooLarge || !strings.Contains(string(r.body), "in all") {
		t.Fatalf("E2B gzipped multipart of 3 x 900 KiB: %d %s", r.status, r.body)
	}

	// Connect: a 10 MB path is refused before it reaches the engine.
	_, fs := e.rpcClients(sb, "")
	_, err := fs.Stat(context.Background(), connect.NewRequest(&filesystempb.StatRequest{Path: strings.Repeat("a", 10<<20)}))
	if c := connect.CodeOf(err); c != connect.CodeResourceExhausted {
		t.Fatalf("Stat of a 10 MB path: %v (code %v)", err, c)
	}

	// Metadata and env.
	big := map[string]string{}
	for i := range 101 {
		big[fmt.Sprint("k", i)] = "v"
	}
	want(t, e.do("POST", "/v1/sandboxes", e.keyA, map[string]any{"metadata": big}), http.StatusBadRequest, "ERR_BAD_REQUEST")
	want(t, e.do("POST", "/v1/sandboxes", e.keyA, map[string]any{"metadata": map[string]string{"k": strings.Repeat("v", 12<<20)}}), http.StatusBadRequest, "ERR_BAD_REQUEST")
	want(t, e.do("POST", "/v1/sandboxes", e.keyA, map[string]any{"env": map[string]string{"A=B": "c"}}), http.StatusBadRequest, "ERR_BAD_REQUEST")
	if r := e.e2bDo("POST", "/v2/sandboxes", e.keyA, map[string]any{"metadata": big}); r.status != http.StatusBadRequest {
		t.Fatalf("E2B create with 101 metadata keys: %d %s", r.status, r.body)
	}
}
