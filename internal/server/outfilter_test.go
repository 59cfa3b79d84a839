package server_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sheepfold/sheepfold/internal/server"
)

const exitSecret = "s3cr3t-Value-0123456789"

// flat is a raw answer without its line breaks, real or JSON-escaped,
// the texts of its streamed stdout and stderr lines (SSE, NDJSON) joined:
// a secret printed across lines, or across events, shows whole in it.
func flat(s string) string {
	var b strings.Builder
	for _, line := range strings.Split(s, "\n") {
		if line == "" || strings.HasPrefix(line, "event:") || strings.HasPrefix(line, ":") {
			continue // SSE framing
		}
		var m map[string]any
		if json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &m) == nil {
			if text, ok := m["text"].(string); ok && (len(m) == 1 || m["type"] == "stdout" || m["type"] == "stderr") {
				b.WriteString(text) // a stdout or stderr event
				continue
			}
		}
		b.WriteString(line)
	}
	return strings.NewReplacer(`\n`, "", `\r`, "", "\n", "", "\r", "").Replace(b.String())
}

// raw sends a request and returns its whole body, however large.
func (e *env) raw(method, path string, body any, hdr ...string) string {
	e.t.Helper()
	b, _ := json.Marshal(body)
	req, _ := http.NewRequest(method, e.url+path, strings.NewReader(string(b)))
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer res.Body.Close()
	out, _ := io.ReadAll(res.Body)
	if res.StatusCode != http.StatusOK {
		e.t.Fatalf("%s %s: %d %s", method, path, res.StatusCode, out)
	}
	return string(out)
}

// TestOutputFilterEveryExit: a sandbox's output_filtering holds on every
// way its output leaves the server: /v1 execute (JSON and SSE), the E2B
// code interpreter's NDJSON, MCP's run_code, the stored execution
// history, the events API and the webhooks. Each hostile cell leaks the
// sandbox's secret env value (across lines, in an error's name, in a
// PNG that is text, in a data frame's data, in a violation's target) or
// answers 1.6 MB under a 1,000-byte max_output_length; the same cell in a
// sandbox without output_filtering (the control) shows the secret or the
// size.
func TestOutputFilterEveryExit(t *testing.T) {
	t.Parallel()
	e := newEnv(t, server.Config{WebhookRetryBase: 10 * time.Millisecond, WebhookAllowCIDRs: []string{"127.0.0.0/8"}}) // the receiver is on loopback
	rc := newReceiver(t, 0)
	want(t, e.do("POST", "/v1/webhooks", e.keyA, map[string]any{"url": rc.URL + "/hook",
		"types": []string{"security_violation", "resource_exceeded"}}), http.StatusCreated, "")
	imports := map[string]any{"allowed_imports": []string{"os", "sys", "time", "types"}}
	filtering := map[string]any{"strip_sensitive_data": true, "max_output_length": 1000}
	env := map[string]string{"DB_PASSWORD": exitSecret}

	// A /v1 sandbox and an E2B one (its policy PUT after), filtered and not.
	type box struct {
		id, token string
		filtered  bool
	}
	var boxes []box
	for _, filtered := range []bool{true, false} {
		pol := map[string]any{"access_control": imports}
		if filtered {
			pol["output_filtering"] = filtering
		}
		boxes = append(boxes, box{id: e.create(e.keyA, map[string]any{"env": env, "security_policy": pol}), filtered: filtered})
		sb := e.e2bCreate(e.keyA, map[string]any{"templateID": "base", "envVars": env})
		want(t, e.do("PUT", "/v1/sandboxes/"+sb.ID+"/policy", e.keyA, pol), http.StatusOK, "")
		boxes = append(boxes, box{id: sb.ID, token: sb.Token, filtered: filtered})
	}
	cs, err := e.mcpConnect(e.keyA)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()

	bearer := []string{"Authorization", "Bearer " + e.keyA}
	exits := []struct {
		name string
		e2b  bool // an E2B sandbox's exit
		run  func(b box, code string) string
	}{
		{"v1 JSON", false, func(b box, code string) string {
			return e.raw("POST", "/v1/sandboxes/"+b.id+"/execute", map[string]any{"code": code}, bearer...)
		}},
		{"v1 SSE", false, func(b box, code string) string {
			return e.raw("POST", "/v1/sandboxes/"+b.id+"/execute", map[string]any{"code": code},
				append(bearer, "Accept", "text/event-stream")...)
		}},
		{"MCP run_code", false, func(b box, code string) string {
			res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "run_code",
				Arguments: map[string]any{"sandbox_id": b.id, "code": code}})
			if err != nil {
				t.Fatal(err)
			}
			out, _ := json.Marshal(res)
			return string(out)
		}},
		{"E2B interpreter", true, func(b box, code string) string {
			return e.raw("POST", "/execute", map[string]any{"code": code},
				"E2b-Sandbox-Id", b.id, "E2b-Sandbox-Port", "49999", "X-Access-Token", b.token)
		}},
	}
	const k = "import os, sys\nk = os.environ['DB_PASSWORD']\n"
	cells := []struct {
		name, code string
		answer     bool // the control's answer holds the secret (else only its events)
		big        bool // the control's answer is over 1.5 MB
	}{
		{"across lines", k + "print(k[:10]); print(k[10:])", true, false},
		{"error name", k + "raise type(k, (Exception,), {})('x')", true, false},
		{"png that is text", k + "class R:\n    def _repr_png_(self): return k\nR()", true, false},
		{"data frame data", k + pandasStub(`{"col": ["ok", k]}`) + "_pd.DataFrame()", true, false},
		{"violation target", k + "sys.modules['__main__']._violation('module_blocked', 'mod ' + k)", false, false},
		{"a thousand results", "for i in range(1000): display('x' * 1600)", false, true},
	}
	for _, c := range cells {
		for _, x := range exits {
			for _, b := range boxes {
				if x.e2b != (b.token != "") {
					continue
				}
				out := x.run(b, c.code)
				leaked := strings.Contains(flat(out), exitSecret)
				switch {
				case b.filtered && leaked:
					t.Errorf("%s through %s: the secret leaked: %.2000s", c.name, x.name, out)
				case b.filtered && c.big && len(out) > 16<<10:
					t.Errorf("%s through %s: %d bytes under a cap of 1000", c.name, x.name, len(out))
				case !b.filtered && c.answer && x.name != "MCP run_code" && !leaked:
					t.Errorf("control: %s through %s does not show the secret: %.2000s", c.name, x.name, out)
				case !b.filtered && c.big && len(out) < 1500000 && x.name != "MCP run_code":
					t.Errorf("control: %s through %s answered only %d bytes", c.name, x.name, len(out))
				}
			}
		}
	}

	// The stored history, the events and the webhooks of each sandbox.
	for _, b := range boxes {
		hist := e.raw("GET", "/v1/sandboxes/"+b.id+"/executions?limit=50", nil, bearer...)
		if leaked := strings.Contains(flat(hist), exitSecret); leaked == b.filtered {
			t.Errorf("history of a sandbox filtered %v: the secret shown %v", b.filtered, leaked)
		}
		var evs string
		for deadline := time.Now().Add(10 * time.Second); ; {
			evs = e.raw("GET", "/v1/sandboxes/"+b.id+"/events?type=security_violation", nil, bearer...)
			if strings.Contains(evs, "module_blocked") || time.Now().After(deadline) {
				break
			}
			time.Sleep(20 * time.Millisecond) // the bus stores in the background
		}
		if !strings.Contains(evs, "module_blocked") {
			t.Fatalf("no violation stored: %s", evs)
		}
		if leaked := strings.Contains(evs, exitSecret); leaked == b.filtered {
			t.Errorf("events of a sandbox filtered %v: the secret shown %v: %s", b.filtered, leaked, evs)
		}
	}
	hooked := map[string]bool{} // sandbox → its violation's delivery held the secret
	for len(hooked) < len(boxes) {
		rv := rc.next(t)
		d, _ := rv.event["details"].(map[string]any)
		if id, _ := rv.event["sandbox_id"].(string); d["kind"] == "module_blocked" {
			hooked[id] = strings.Contains(string(rv.body), exitSecret)
		}
	}
	for _, b := range boxes {
		if hooked[b.id] == b.filtered {
			t.Errorf("webhook of a sandbox filtered %v: the secret delivered %v", b.filtered, hooked[b.id])
		}
	}
}

// pandasStub makes a module "pandas" with a DataFrame whose to_dict is
// data (a Python expression), so that the driver renders it as E2B's
// data (the host has no pandas; the template's is the same to the driver).
func pandasStub(data string) string {
	return "import sys, types\n_pd = types.ModuleType('pandas')\n" +
		"class _Frame:\n    def to_dict(self, orient='list'): return " + data + "\n    def __repr__(self): return '<frame>'\n" +
		"_pd.DataFrame = _Frame\n_pd.Timestamp = type('Timestamp', (), {})\nsys.modules['pandas'] = _pd\n"
}
