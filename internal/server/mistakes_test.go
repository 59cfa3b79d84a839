package server_test

import (
	"bytes"
	"compress/gzip"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sheepfold/sheepfold/internal/server"
)

// TestUserMistakesAre4xx: mistakes seen answering 500 (or worse) answer
// with a 4xx and a stable code.
func TestUserMistakesAre4xx(t *testing.T) {
	t.Parallel()
	e := newEnv(t, server.Config{})
	id := e.create(e.keyA, nil)
	base := "/v1/sandboxes/" + id

	t.Run("code over the agent's frame", func(t *testing.T) {
		code := "x = '" + strings.Repeat("a", 4<<20+100) + "'"
		want(t, e.do("POST", base+"/execute", e.keyA, map[string]any{"code": code}), http.StatusBadRequest, "ERR_BAD_REQUEST")
	})
	t.Run("4 MiB command argument", func(t *testing.T) {
		want(t, e.do("POST", base+"/commands", e.keyA, map[string]any{"cmd": "echo", "args": []string{strings.Repeat("a", 4<<20)}}),
			http.StatusBadRequest, "ERR_BAD_REQUEST")
	})
	t.Run("context cwd missing", func(t *testing.T) {
		r := e.do("POST", base+"/contexts", e.keyA, map[string]any{"language": "python", "cwd": "/no/such/dir"})
		want(t, r, http.StatusBadRequest, "ERR_BAD_REQUEST")
		if !strings.Contains(string(r.body), "/no/such/dir does not exist") {
			t.Fatalf("message: %s", r.body)
		}
	})
	t.Run("command cwd missing", func(t *testing.T) {
		want(t, e.do("POST", base+"/commands", e.keyA, map[string]any{"cmd": "true", "cwd": "/no/such/dir"}), http.StatusBadRequest, "ERR_BAD_REQUEST")
	})
	t.Run("memory_mb overflow", func(t *testing.T) {
		want(t, e.do("POST", "/v1/sandboxes", e.keyA, map[string]any{"resources": map[string]any{"memory_mb": 17592186044928}}),
			http.StatusBadRequest, "ERR_BAD_REQUEST")
		// sandbox_config is the security policy's shorthand: its bad values are policy errors.
		want(t, e.do("POST", "/v1/sandboxes", e.keyA, map[string]any{"sandbox_config": map[string]any{"max_memory_mb": 17592186044928}}),
			http.StatusBadRequest, "ERR_INVALID_POLICY")
	})
	t.Run("timeout_ms overflow", func(t *testing.T) {
		want(t, e.do("POST", base+"/commands", e.keyA, map[string]any{"cmd": "true", "timeout_ms": 9223372036855}),
			http.StatusBadRequest, "ERR_BAD_REQUEST")
	})
	t.Run("wrong method", func(t *testing.T) {
		for _, c := range []struct{ method, path, allow string }{
			{"PATCH", "/v1/sandboxes", "GET, POST"},
			{"PUT", base + "/timeout", "POST"},
			{"DELETE", base + "/files/list", "GET"},
		} {
			r := e.do(c.method, c.path, e.keyA, nil)
			want(t, r, http.StatusMethodNotAllowed, "ERR_METHOD_NOT_ALLOWED")
			if got := r.header.Get("Allow"); got != c.allow {
				t.Errorf("%s %s: Allow %q, want %q", c.method, c.path, got, c.allow)
			}
		}
		if r := e.e2bDo("PUT", "/v2/sandboxes", e.keyA, nil); r.status != http.StatusMethodNotAllowed || e2bCode(t, r) != 405 {
			t.Errorf("E2B PUT /v2/sandboxes: %d %s", r.status, r.body)
		}
		want(t, e.do("GET", "/v1/no/such/route", e.keyA, nil), http.StatusNotFound, "ERR_NOT_FOUND")
	})
	t.Run("E2B download of an unreadable file with gzip", func(t *testing.T) {
		sb := e.e2bCreate(e.keyA, nil)
		// A socket: Stat finds it, reading it fails (ENXIO; under runc a
		// root-only file fails the same way with EACCES, 403). Either way
		// the answer is an error status, not a dropped connection.
		ln, err := net.Listen("unix", filepath.Join(e.home(sb.ID), "sock"))
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		for _, enc := range []string{"gzip", "identity"} {
			r := e.envd(sb, "GET", "/files?path=sock", nil, "Accept-Encoding", enc)
			if r.status < 400 || e2bCode(t, r) != float64(r.status) {
				t.Fatalf("Accept-Encoding %s: %d %s", enc, r.status, r.body)
			}
		}
		// A readable file still downloads, gzipped.
		want(t, e.do("PUT", "/v1/sandboxes/"+sb.ID+"/files?path=hello.txt", e.keyA, "hello"), http.StatusCreated, "")
		req, _ := http.NewRequest("GET", e.url+"/files?path=hello.txt", nil)
		req.Header.Set("E2b-Sandbox-Id", sb.ID)
		req.Header.Set("E2b-Sandbox-Port", "49983")
		req.Header.Set("X-Access-Token", sb.Token)
		req.Header.Set("Accept-Encoding", "gzip")
		res, err := http.DefaultTransport.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		zr, err := gzip.NewReader(res.Body)
		if err != nil {
			t.Fatalf("status %d, encoding %q: %v", res.StatusCode, res.Header.Get("Content-Encoding"), err)
		}
		if b, _ := io.ReadAll(zr); string(b) != "hello" {
			t.Fatalf("gzipped download %q", b)
		}
	})
}

// TestEveryRouteBodyMistakeIs4xx sends malformed and out-of-range JSON to
// every route that takes a body: each must answer a 4xx, never a 5xx.
func TestEveryRouteBodyMistakeIs4xx(t *testing.T) {
	t.Parallel()
	e := newEnv(t, server.Config{})
	id := e.create(e.keyA, nil)
	bodies := []string{
		``, `{`, `}`, `[]`, `null`, `"text"`, `1e999`, `{"no_such_field":1}`, `{"a":1}{"b":2}`,
		strings.Repeat("[", 100000) + strings.Repeat("]", 100000),
		`{"code":1}`, `{"code":"1","language":"cobol"}`, `{"code":"1","context_id":"nope"}`, `{"code":"1","timeout_ms":-5}`,
		`{"code":"1","timeout_ms":9223372036855775807}`, `{"code":"` + strings.Repeat("a", 5<<20) + `"}`,
		`{"cmd":1}`, `{"cmd":""}`, `{"cmd":"true","timeout_ms":9223372036855}`, `{"cmd":"true","cwd":"/no/such/dir"}`,
		`{"cmd":"true","env":{"A=B":"c"}}`, `{"cmd":"true","args":["` + strings.Repeat("a", 5<<20) + `"]}`,
		`{"timeout":-1}`, `{"timeout":1e300}`, `{"timeout":"soon"}`, `{"timeout":0}`,
		`{"resources":{"memory_mb":17592186044928}}`, `{"resources":{"cpus":-1}}`, `{"resources":{"pids":1e30}}`,
		`{"sandbox_config":{"max_execution_time":-1}}`, `{"metadata":{"":"x"}}`, `{"template":"no-such-template"}`,
		`{"language":"cobol"}`, `{"language":"python","cwd":"/no/such/dir"}`,
		`{"path":""}`, `{"path":"\u0000"}`, `{"path":"` + strings.Repeat("a", 5<<20) + `"}`,
		`{"from":"/no/such","to":"/tmp/x"}`, `{"from":"","to":""}`,
		`{"data":"x","data_base64":"eA=="}`, `{"data_base64":"***"}`, `{"signal":"NOPE"}`, `{"signal":99999}`, `{"signal":1.5}`,
	}
	fill := strings.NewReplacer("{id}", id, "{ctx}", "nope", "{pid}", "999999")
	for _, route := range e.srv.Routes() {
		method, path, _ := strings.Cut(route, " ")
		if method != "POST" && method != "PUT" || path == "/v1/sandboxes/{id}/files" {
			continue // no JSON body (uploads take any bytes)
		}
		path = fill.Replace(path)
		for _, b := range bodies {
			r := e.do(method, path, e.keyA, []byte(b), "Content-Type", "application/json")
			if r.status < 400 || r.status >= 500 {
				if r.status < 300 && !strings.HasSuffix(path, "/sandboxes") {
					continue // a body that happens to be valid for this route
				}
				// 501: pausing and forking are not supported by the
				// fake runtime, whatever the body.
				if r.status >= 500 && (r.status != http.StatusNotImplemented || !strings.HasSuffix(path, "/pause") && !strings.HasSuffix(path, "/fork")) {
					t.Errorf("%s %s with %.80q: %d %.300s", method, path, b, r.status, r.body)
				}
			}
		}
		// The sandbox survived every mistake.
		want(t, e.do("GET", "/v1/sandboxes/"+id, e.keyA, nil), http.StatusOK, "")
	}
	_ = bytes.MinRead
}
