package server_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sheepfold/sheepfold/internal/server"
)

// hostile sends one server every kind of hostile input and checks after
// each that the server still answers.
type hostile struct {
	t      *testing.T
	e      *env
	addr   string
	client *http.Client
	sent   int
	// status counts the answers by status, per endpoint, for the log;
	// fail collects 500s (hostile input deserves a 4xx with its code).
	fail []string
}

func newHostile(t *testing.T, e *env) *hostile {
	u, err := url.Parse(e.url)
	if err != nil {
		t.Fatal(err)
	}
	return &hostile{t: t, e: e, addr: u.Host, client: &http.Client{Timeout: 60 * time.Second}}
}

// alive fails the test unless the server still answers its health
// check after what.
func (h *hostile) alive(what string) {
	h.t.Helper()
	h.sent++
	res, err := h.client.Get(h.e.url + "/healthz")
	if err != nil {
		h.t.Fatalf("after %s: the server does not answer: %v", what, err)
	}
	io.Copy(io.Discard, res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusOK {
		h.t.Fatalf("after %s: /healthz answered %d", what, res.StatusCode)
	}
}

// send sends a request whose body is body (nil: none) and returns its
// status, -1 when the connection broke (the server may cut an oversize
// body off).
func (h *hostile) send(method, target string, hdr http.Header, body io.Reader) int {
	h.t.Helper()
	req, err := http.NewRequest(method, h.e.url+target, body)
	if err != nil {
		h.t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header[k] = v
	}
	res, err := h.client.Do(req)
	status := -1
	if err == nil {
		io.Copy(io.Discard, io.LimitReader(res.Body, 1<<20))
		res.Body.Close()
		status = res.StatusCode
	}
	what := fmt.Sprintf("%s %s", method, target)
	if status == http.StatusInternalServerError {
		h.fail = append(h.fail, what)
	}
	h.alive(what)
	return status
}

// raw writes a request by hand (a body cut short, a response the client
// stops reading): it writes head, then body, then reads at most read
// bytes of the answer (0: none) and closes the connection.
func (h *hostile) raw(what, head string, body []byte, read int) {
	h.t.Helper()
	c, err := net.Dial("tcp", h.addr)
	if err != nil {
		h.t.Fatalf("%s: dial: %v", what, err)
	}
	c.SetDeadline(time.Now().Add(10 * time.Second))
	c.Write([]byte(head))
	c.Write(body)
	if read > 0 {
		io.ReadAtLeast(bufio.NewReader(c), make([]byte, read), read)
	}
	c.Close()
	h.alive(what)
}

// headLines renders the header lines of a hand-written request.
func headLines(hdr http.Header) string {
	var b strings.Builder
	for k, vs := range hdr {
		for _, v := range vs {
			fmt.Fprintf(&b, "%s: %s\r\n", k, v)
		}
	}
	return b.String()
}

// hostileBodies are request bodies of the wrong shape for every endpoint:
// not JSON, not an object, cut, trailing, nested past any sense, numbers
// out of range, invalid UTF-8, and an object whose usual fields all have
// the wrong type.
var hostileBodies = []string{
	``, `null`, `[]`, `"a string"`, `12`, `true`, `{`, `{"a":`, `{}{}`, `{"a":1} trailing`,
	strings.Repeat("[", 100000), strings.Repeat(`{"a":`, 50000),
	`{"code":1,"language":[],"timeout":"x","timeout_ms":"x","path":{},"from":5,"to":[],"cmd":{},"args":"x",` +
		`"env":[],"security_policy":"x","template":7,"url":5,"events":"x","port":"x","public":"x","mode":[],` +
		`"signal":{},"input":7,"data":5,"stream":"x","limits":"x","micros":"x","name":[],"key":5,"messages":"x",` +
		`"model":[],"templateID":5,"metadata":[],"envVars":"x","network":"x","context_id":{},"env_vars":5,"cwd":[]}`,
	`{"timeout":1e999}`, `{"timeout":-1,"timeout_ms":-1}`, `{"timeout":99999999999999999999999}`,
	"{\"code\":\"\xff\xfe\xfd\",\"path\":\"\x00\"}",
}

// fill replaces a route pattern's wildcards.
func fill(pattern string, vals map[string]string) string {
	for k, v := range vals {
		pattern = strings.ReplaceAll(pattern, "{"+k+"}", v)
	}
	return pattern
}

// endpoint is one route under attack.
type endpoint struct {
	method, target string // target: path and query
	hdr            http.Header
	limit          int64 // its body limit: one byte more is oversize
}

// attack sends e every hostile body, an oversize one, one cut mid-way
// (by length and chunked), one with the response cut by the client, and
// the same without credentials (noAuth: the header to drop).
func (h *hostile) attack(ep endpoint, noAuth string) {
	h.t.Helper()
	what := ep.method + " " + ep.target
	for _, b := range hostileBodies {
		h.send(ep.method, ep.target, ep.hdr, strings.NewReader(b))
	}
	for _, ct := range []string{"application/json", "application/connect+json", "multipart/form-data; boundary=x", "application/octet-stream"} {
		hdr := ep.hdr.Clone()
		hdr.Set("Content-Type", ct)
		h.send(ep.method, ep.target, hdr, strings.NewReader(`{"path":5}`))
	}
	h.send(ep.method, ep.target, ep.hdr, io.LimitReader(zeros{}, ep.limit+1))
	head := ep.method + " " + ep.target + " HTTP/1.1\r\nHost: x\r\n" + headLines(ep.hdr)
	h.raw(what+" (body cut by length)", head+"Content-Length: 100000\r\n\r\n", []byte(`{"code":"`+strings.Repeat("a", 1000)), 0)
	h.raw(what+" (chunked body cut)", head+"Transfer-Encoding: chunked\r\n\r\n10000\r\n", []byte(`{"path":"`+strings.Repeat("a", 1000)), 0)
	h.raw(what+" (response cut)", head+"Content-Length: 0\r\n\r\n", nil, 64)
	if noAuth != "" {
		hdr := ep.hdr.Clone()
		hdr.Del(noAuth)
		h.send(ep.method, ep.target, hdr, strings.NewReader(`{}`))
		hdr.Set(noAuth, "garbage")
		h.send(ep.method, ep.target, hdr, strings.NewReader(`{}`))
	}
}

// zeros is an endless body.
type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

// TestHostileRequests: no request stops the server. Every endpoint (the
// /v1 API, /mcp with fuzzed JSON-RPC and every tool's arguments of the
// wrong type, E2B's control plane, envd's Connect RPCs and REST, the code
// interpreter, previews) gets hostile input, and the server still answers
// after each; so does a sandbox at the end. Among them the report that
// started this: an MCP read_file of a 2 MiB file stopped `serve` (the
// in-process transport raised http.ErrAbortHandler again on its own
// goroutine). A crash fails this test by ending its process.
func TestHostileRequests(t *testing.T) {
	t.Parallel()
	const upload = 4 << 20
	e := newEnv(t, server.Config{MaxUploadBytes: upload})
	h := newHostile(t, e)
	id := e.create(e.keyA, map[string]any{"timeout": 600})
	victim := e.create(e.keyA, nil)
	big := bytes.Repeat([]byte("0123456789abcdef"), 2<<20/16)
	want(t, e.do("PUT", "/v1/sandboxes/"+id+"/files?path=big.bin", e.keyA, big), http.StatusCreated, "")
	sb := e.e2bCreate(e.keyA, map[string]any{"templateID": "base", "timeout": 600})
	e2bVictim := e.e2bCreate(e.keyA, map[string]any{"templateID": "base"})

	// The report: an MCP read_file of a 2 MiB file. The tool reads past
	// its bound and closes the in-process response.
	cs, err := e.mcpConnect(e.keyA)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	res, text, _ := call(t, cs, "read_file", map[string]any{"sandbox_id": id, "path": "big.bin"})
	if !res.IsError || !strings.Contains(text, "larger than") {
		t.Fatalf("read_file of 2 MiB: %v %q", res.IsError, text)
	}
	h.alive("an MCP read_file of 2 MiB")

	// /v1, every route.
	bearer := http.Header{"Authorization": {"Bearer " + e.keyA}}
	routes := e.srv.Routes()
	if len(routes) < 40 {
		t.Fatalf("only %d routes", len(routes))
	}
	for _, pat := range routes {
		method, path, _ := strings.Cut(pat, " ")
		vals := map[string]string{"id": id, "ctx": "ctx_nope", "pid": "1", "port": "8080", "account": "acct_nope"}
		if pat == "DELETE /v1/sandboxes/{id}" || pat == "POST /v1/sandboxes/{id}/timeout" {
			vals["id"] = victim
		}
		target := fill(path, vals)
		q := "?path=big.bin&depth=abc&limit=-1&cursor=%21%21&since=x&start=x&end=x&timeout_ms=x&stream=x"
		if pat == "DELETE /v1/sandboxes/{id}/files" {
			q = "?path=does-not-exist"
		}
		limit := int64(16 << 20)
		if strings.HasSuffix(path, "/files") && (method == "PUT" || method == "POST") {
			limit = upload + 1<<20
		}
		h.attack(endpoint{method: method, target: target + q, hdr: bearer, limit: limit}, "Authorization")
	}
	// Downloads and streams the client stops reading.
	for _, target := range []string{"/v1/sandboxes/" + id + "/files?path=big.bin", "/v1/events", "/v1/sandboxes/" + id + "/events"} {
		h.raw("GET "+target+" (response cut)", "GET "+target+" HTTP/1.1\r\nHost: x\r\n"+headLines(bearer)+"\r\n", nil, 1000)
	}
	stream := `{"code":"for i in range(200000): print(i)","stream":true}`
	h.raw("a streamed execution cut", fmt.Sprintf("POST /v1/sandboxes/%s/execute HTTP/1.1\r\nHost: x\r\n%sAccept: text/event-stream\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n",
		id, headLines(bearer), len(stream)), []byte(stream), 2000)
	// Previews (no app listens: the proxy's own errors).
	h.attack(endpoint{method: "POST", target: "/v1/sandboxes/" + id + "/proxy/8080/x", hdr: bearer, limit: 16 << 20}, "")

	// /mcp: every tool with arguments of the wrong type, then fuzzed
	// JSON-RPC.
	tl, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tool := range tl.Tools {
		props := map[string]any{}
		if s, ok := tool.InputSchema.(map[string]any); ok {
			props, _ = s["properties"].(map[string]any)
		}
		for name := range props {
			for _, v := range []any{5, -1, 1.5, 1e308, "x", []any{1}, map[string]any{"a": 1}, nil, true} {
				args := map[string]any{"sandbox_id": id, "path": "nope.txt", "code": "1", "command": "true", "content": "x"}
				args[name] = v
				if tool.Name == "kill_sandbox" || tool.Name == "create_sandbox" {
					args["sandbox_id"] = "sbx_nope"
					if name == "timeout_seconds" && v == 5 {
						continue // a valid create: not hostile
					}
				}
				if _, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: tool.Name, Arguments: args}); err != nil && !strings.Contains(err.Error(), "invalid") {
					t.Logf("%s(%s=%v): %v", tool.Name, name, v, err)
				}
			}
			h.alive("MCP " + tool.Name + " with a wrong " + name)
		}
	}
	mcpHdr := http.Header{"Authorization": {"Bearer " + e.keyA}, "Content-Type": {"application/json"},
		"Accept": {"application/json, text/event-stream"}}
	for i, m := range fuzzJSONRPC(rand.New(rand.NewPCG(29, 1)), id, 300) {
		h.send("POST", "/mcp", mcpHdr, bytes.NewReader(m))
		if t.Failed() {
			t.Fatalf("fuzzed MCP message %d: %s", i, m)
		}
	}
	h.attack(endpoint{method: "POST", target: "/mcp", hdr: mcpHdr, limit: 16 << 20}, "Authorization")

	// E2B: the control plane, envd (Connect RPCs and REST) and the code
	// interpreter, each endpoint.
	e2bRoutes := e.srv.E2BRoutes()
	if len(e2bRoutes) < 30 {
		t.Fatalf("only %d E2B routes: %v", len(e2bRoutes), e2bRoutes)
	}
	for _, r := range e2bRoutes {
		port, pat, _ := strings.Cut(r, " ")
		if _, err := strconv.Atoi(port); err != nil {
			port, pat = "", r
		}
		method, path, _ := strings.Cut(pat, " ")
		sbID := sb.ID
		if port == "" && method == "DELETE" {
			sbID = e2bVictim.ID
		}
		target := fill(path, map[string]string{"id": sbID}) + "?path=/home/user/big.bin&depth=x&limit=-1&signature=v1_AAAA&signature_expiration=x&metadata=%zz"
		hdr, noAuth, limit := http.Header{"X-Api-Key": {e.keyA}}, "X-Api-Key", int64(16<<20)
		if port != "" {
			hdr = http.Header{"E2b-Sandbox-Id": {sb.ID}, "E2b-Sandbox-Port": {port}, "X-Access-Token": {sb.Token}, "E2b-Traffic-Access-Token": {sb.Traffic}}
			noAuth, limit = "X-Access-Token", 4<<20+5
			if path == "/files" && method == "POST" {
				limit = upload + 1<<20
			}
			if port == "49999" {
				noAuth = ""
			}
		}
		h.attack(endpoint{method: method, target: target, hdr: hdr, limit: limit}, noAuth)
		if strings.HasPrefix(path, "/process.") || strings.HasPrefix(path, "/filesystem.") {
			h.connectEnvelopes(method, path, hdr)
		}
	}
	envd := http.Header{"E2b-Sandbox-Id": {sb.ID}, "E2b-Sandbox-Port": {"49983"}, "X-Access-Token": {sb.Token}}
	start := envelope(`{"process":{"cmd":"/bin/bash","args":["-c","seq 1 300000"]}}`)
	h.raw("an envd process stream cut", fmt.Sprintf("POST /process.Process/Start HTTP/1.1\r\nHost: x\r\n%sContent-Type: application/connect+json\r\nConnect-Protocol-Version: 1\r\nContent-Length: %d\r\n\r\n",
		headLines(envd), len(start)), start, 2000)
	want(t, e.envd(sb, "POST", "/files?path=big.bin", big, "Content-Type", "application/octet-stream"), http.StatusOK, "")
	h.raw("an envd download cut", "GET /files?path=big.bin HTTP/1.1\r\nHost: x\r\n"+headLines(envd)+"\r\n", nil, 1000)
	interp := http.Header{"E2b-Sandbox-Id": {sb.ID}, "E2b-Sandbox-Port": {"49999"}, "X-Access-Token": {sb.Token}}
	code := `{"code":"for i in range(200000): print(i)"}`
	h.raw("an interpreter stream cut", fmt.Sprintf("POST /execute HTTP/1.1\r\nHost: x\r\n%sContent-Type: application/json\r\nContent-Length: %d\r\n\r\n",
		headLines(interp), len(code)), []byte(code), 2000)

	// The sandboxes still work, through both surfaces.
	r := e.do("POST", "/v1/sandboxes/"+id+"/execute", e.keyA, map[string]any{"code": "1+1"})
	want(t, r, http.StatusOK, "")
	if got := r.json(t)["results"]; !strings.Contains(fmt.Sprint(got), "2") {
		t.Fatalf("1+1 after the attacks: %s", r.body)
	}
	if r := e.envd(sb, "GET", "/health", nil); r.status != http.StatusNoContent {
		t.Fatalf("E2B health after the attacks: %d %s", r.status, r.body)
	}
	t.Logf("%d requests, each followed by a health check", h.sent)
	for _, f := range h.fail {
		t.Errorf("500 for hostile input: %s", f)
	}
}

// envelope frames a Connect streaming message.
func envelope(msg string) []byte {
	b := make([]byte, 5, 5+len(msg))
	binary.BigEndian.PutUint32(b[1:], uint32(len(msg)))
	return append(b, msg...)
}

// connectEnvelopes sends a Connect procedure broken stream envelopes: a
// length past the body, a length past any bound, an unknown flag, a
// compressed flag without compression, and wrong JSON in a good one.
func (h *hostile) connectEnvelopes(method, path string, hdr http.Header) {
	h.t.Helper()
	hdr = hdr.Clone()
	hdr.Set("Content-Type", "application/connect+json")
	hdr.Set("Connect-Protocol-Version", "1")
	long := envelope(`{}`)
	binary.BigEndian.PutUint32(long[1:], 1000)
	huge := envelope(`{}`)
	binary.BigEndian.PutUint32(huge[1:], 0xffffffff)
	flag := envelope(`{}`)
	flag[0] = 0xff
	comp := envelope(`{}`)
	comp[0] = 1
	for _, b := range [][]byte{long, huge, flag, comp, envelope(`{"path":5,"process":"x","depth":"deep"}`), envelope(`[]`), {0, 0}} {
		h.send(method, path, hdr, bytes.NewReader(b))
	}
}

// fuzzJSONRPC returns n JSON-RPC messages for /mcp: valid ones (initialize,
// tools/list, tools/call of each tool) mutated at the JSON level (a value
// swapped for one of another type, a key dropped, nesting, a batch) and at
// the byte level (flips, cuts, repeats).
func fuzzJSONRPC(rng *rand.Rand, id string, n int) [][]byte {
	seeds := []string{
		`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"x","version":"1"}}}`,
		`{"jsonrpc":"2.0","id":2,"method":"tools/list","params":{}}`,
		`{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"read_file","arguments":{"sandbox_id":"` + id + `","path":"big.bin"}}}`,
		`{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"list_files","arguments":{"sandbox_id":"` + id + `","depth":2}}}`,
		`{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"write_file","arguments":{"sandbox_id":"` + id + `","path":"f.txt","content":"eA==","encoding":"base64"}}}`,
		`{"jsonrpc":"2.0","id":6,"method":"tools/call","params":{"name":"run_code","arguments":{"sandbox_id":"` + id + `","code":"1"}}}`,
		`{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"kill_sandbox","arguments":{"sandbox_id":"sbx_nope"}}}`,
		`{"jsonrpc":"2.0","method":"notifications/initialized"}`,
		`{"jsonrpc":"2.0","id":8,"method":"ping"}`,
	}
	values := []any{nil, true, -1, 1e308, "", "x", strings.Repeat("a", 10000), []any{}, []any{1, "x"}, map[string]any{}, map[string]any{"a": []any{}}}
	var mutate func(v any, depth int) any
	mutate = func(v any, depth int) any {
		switch x := v.(type) {
		case map[string]any:
			for k, c := range x {
				switch rng.IntN(6) {
				case 0:
					x[k] = values[rng.IntN(len(values))]
				case 1:
					delete(x, k)
				case 2:
					x[k] = mutate(c, depth+1)
				}
			}
			if rng.IntN(4) == 0 {
				x["x"+fmt.Sprint(rng.IntN(9))] = values[rng.IntN(len(values))]
			}
			return x
		case []any:
			for i := range x {
				if rng.IntN(3) == 0 {
					x[i] = mutate(x[i], depth+1)
				}
			}
			return x
		}
		if rng.IntN(2) == 0 {
			return values[rng.IntN(len(values))]
		}
		return v
	}
	var out [][]byte
	for len(out) < n {
		seed := seeds[rng.IntN(len(seeds))]
		var v any
		json.Unmarshal([]byte(seed), &v)
		v = mutate(v, 0)
		if rng.IntN(8) == 0 {
			v = []any{v, mutate(json.RawMessage(seed), 0)}
		}
		b, _ := json.Marshal(v)
		switch rng.IntN(5) {
		case 0: // a byte flipped
			if len(b) > 0 {
				b[rng.IntN(len(b))] ^= byte(1 << rng.IntN(8))
			}
		case 1: // cut
			b = b[:rng.IntN(len(b)+1)]
		case 2: // a piece repeated
			if len(b) > 2 {
				i := rng.IntN(len(b) - 1)
				j := i + 1 + rng.IntN(len(b)-i-1)
				b = append(b[:j:j], append(bytes.Repeat(b[i:j], 1+rng.IntN(4)), b[j:]...)...)
			}
		}
		out = append(out, b)
	}
	return out
}
