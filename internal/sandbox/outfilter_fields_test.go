package sandbox_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/sheepfold/sheepfold/internal/agentproto"
	"github.com/sheepfold/sheepfold/internal/events"
	"github.com/sheepfold/sheepfold/internal/policy"
	"github.com/sheepfold/sheepfold/internal/sandbox"
)

// answer is everything an execution's caller receives, kept or
// streamed: every string of it, and its size.
type answer struct {
	text  strings.Builder
	bytes int64
}

func (a *answer) add(s string) {
	a.text.WriteString(s)
	a.text.WriteByte(0)
	a.bytes += int64(len(s))
}

func (a *answer) addJSON(v any) {
	if v == nil {
		return
	}
	b, _ := json.Marshal(v)
	a.add(string(b))
}

func (a *answer) result(r agentproto.Result) {
	for _, s := range []string{r.Text, r.HTML, r.Markdown, r.SVG, r.PNG, r.JPEG, r.PDF, r.LaTeX, r.JavaScript} {
		a.add(s)
	}
	a.addJSON(r.JSON)
	for mime, v := range r.Extra {
		a.add(mime)
		a.addJSON(v)
	}
}

func (a *answer) error(e *agentproto.ExecError) {
	if e != nil {
		a.add(e.Name)
		a.add(e.Value)
		a.add(e.Traceback)
	}
}

// flat is the answer's text without line breaks: a secret printed across
// lines shows whole in it.
func (a *answer) flat() string {
	return strings.NewReplacer("\n", "", "\r", "").Replace(a.text.String())
}

// answers runs code kept and streamed and returns both answers. The
// streamed one counts each event once (its end repeats the error).
func answers(t *testing.T, sb *sandbox.Sandbox, code string) (kept, streamed *answer, ex *sandbox.Execution) {
	t.Helper()
	ex, err := sb.Execute(context.Background(), sandbox.ExecuteRequest{Code: code}, nil)
	if err != nil {
		t.Fatal(err)
	}
	kept = &answer{}
	kept.add(ex.Stdout)
	kept.add(ex.Stderr)
	for _, r := range ex.Results {
		kept.result(r)
	}
	kept.error(ex.Error)
	if ex.Dropped != nil {
		kept.add(ex.Dropped.Reason)
	}
	streamed = &answer{}
	var sentErr bool
	sex, err := sb.Execute(context.Background(), sandbox.ExecuteRequest{Code: code}, func(ev agentproto.Event) error {
		switch ev.Type {
		case agentproto.EventStdout, agentproto.EventStderr:
			streamed.add(string(ev.Data))
		case agentproto.EventResult:
			if ev.Result != nil {
				streamed.result(*ev.Result)
			}
		case agentproto.EventError:
			streamed.error(ev.Error)
			sentErr = ev.Error != nil
		case agentproto.EventDropped:
			if ev.Dropped != nil {
				streamed.add(ev.Dropped.Type)
				streamed.add(ev.Dropped.Reason)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if !sentErr {
		streamed.error(sex.Error) // an engine verdict, only in the end
	}
	return kept, streamed, ex
}

// fakePandas makes a module "pandas" with a DataFrame whose to_dict is
// data (a Python expression), so that the driver renders it as E2B's
// data (the host has no pandas; the template's is the same to the driver).
func fakePandas(data string) string {
	return `import sys, types
_pd = types.ModuleType("pandas")
class _Frame:
    def to_dict(self, orient="list"): return ` + data + `
    def __repr__(self): return "<frame>"
_pd.DataFrame = _Frame
_pd.Timestamp = type("Timestamp", (), {})
sys.modules["pandas"] = _pd
`
}

// TestOutputFilterEveryField: strip_sensitive_data applies to every
// field of an answer and to the sandbox's events. Each hostile cell
// leaks the sandbox's secret env value through one field; unfiltered
// (the control) the answer or the events hold it, filtered neither the
// kept nor the streamed answer nor any event does, not even across line
// breaks.
func TestOutputFilterEveryField(t *testing.T) {
	t.Parallel()
	sink := &collector{}
	m, _ := fakeEngine(t, sandbox.Config{Events: sink})
	env := map[string]string{"DB_PASSWORD": filterSecret}
	// The import rules make an import of another name a reported
	// violation naming it.
	imports := &policy.AccessControl{AllowedImports: []string{"os", "sys", "time", "types"}}
	filtered, err := m.Create(context.Background(), sandbox.CreateOptions{Env: env,
		Policy: &policy.Policy{AccessControl: imports, OutputFiltering: &policy.OutputFiltering{StripSensitiveData: ptr(true)}}})
	if err != nil {
		t.Fatal(err)
	}
	plain, err := m.Create(context.Background(), sandbox.CreateOptions{Env: env, Policy: &policy.Policy{AccessControl: imports}})
	if err != nil {
		t.Fatal(err)
	}
	const k = `import os, sys, time
k = os.environ["DB_PASSWORD"]
`
	cells := []struct{ name, code string }{
		{"stdout across two lines", k + `print(k[:10]); print(k[10:])`},
		{"stdout with a line break inside one write", k + `sys.stdout.write(k[:4] + "\n" + k[4:] + "\n")`},
		{"stderr across writes, CRLF and a pause", k + `sys.stderr.write(k[:6] + "\r\n"); sys.stderr.flush(); time.sleep(0.1); sys.stderr.write(k[6:] + "\n")`},
		{"stdout a character a line", k + `for c in k: print(c)`},
		{"error name", k + `raise type(k, (Exception,), {})("nothing to see")`},
		{"error value", k + `raise ValueError(k)`},
		{"traceback only", k + `try:
    raise KeyError(k)
except KeyError:
    raise ValueError("wrapped")`},
		{"png that is text", k + `class R:
    def _repr_png_(self): return k
R()`},
		{"jpeg that is text", k + `class R:
    def _repr_jpeg_(self): return "/9j/" + k
R()`},
		{"every text rendering", k + `class R:
    def _repr_html_(self): return k
    def _repr_markdown_(self): return k
    def _repr_latex_(self): return k
    def _repr_svg_(self): return k
    def _repr_javascript_(self): return k
    def __repr__(self): return "r"
R()`},
		{"json", k + `class R:
    def _repr_json_(self): return {"deep": [{"v": k}], k: 1}
R()`},
		{"data frame data", k + fakePandas(`{"col": ["ok", k]}`) + `_pd.DataFrame()`},
		{"a forged binary MIME type", k + `sys.modules["__main__"]._send({"type": "result", "result": {"text": "x",
    "extra": {"application/octet-stream": k, "e2b/chart": {"title": k}}}})`},
		{"a forged notice of a dropped result", k + `sys.modules["__main__"]._send({"type": "dropped", "what": k, "bytes": 1})`},
		{"module_blocked target", k + `try:
    __import__(k)
except ImportError:
    pass`},
		{"forged violation target", k + `sys.modules["__main__"]._violation("module_blocked", "mod " + k)`},
	}
	for _, c := range cells {
		t.Run(c.name, func(t *testing.T) {
			seen := func(sb *sandbox.Sandbox) (where string) {
				before := len(sink.of(events.SecurityViolation)) + len(sink.of(events.ResourceExceeded))
				kept, streamed, _ := answers(t, sb, c.code)
				switch {
				case strings.Contains(kept.flat(), filterSecret):
					return "the kept answer: " + kept.text.String()
				case strings.Contains(streamed.flat(), filterSecret):
					return "the streamed answer: " + streamed.text.String()
				}
				evs := append(sink.of(events.SecurityViolation), sink.of(events.ResourceExceeded)...)
				for _, e := range evs[before:] {
					if e.SandboxID == sb.ID && strings.Contains(fmt.Sprint(e.Details), filterSecret) {
						return fmt.Sprintf("an event: %+v", e)
					}
				}
				return ""
			}
			if seen(plain) == "" {
				t.Fatal("control: unfiltered, the cell does not leak the secret")
			}
			if where := seen(filtered); where != "" {
				t.Fatalf("the secret leaked through %s", where)
			}
		})
	}
}

// TestOutputFilterCapsTheWholeAnswer: max_output_length is the size of
// the whole answer, whatever fields and however many results carry it.
// Each hostile cell answers more than 1.5 MB (the control, unfiltered);
// under a 1,000-byte cap neither the kept nor the streamed answer is
// larger than the cap plus its two markers and the error's name
// (before, each field and each result had its own 1,000 bytes, and
// images, data-frame data and error names none).
func TestOutputFilterCapsTheWholeAnswer(t *testing.T) {
	t.Parallel()
	m, _ := fakeEngine(t, sandbox.Config{})
	const limit = 1000
	capped, err := m.Create(context.Background(), sandbox.CreateOptions{
		Policy: &policy.Policy{OutputFiltering: &policy.OutputFiltering{MaxOutputLength: ptr(int64(limit))}}})
	if err != nil {
		t.Fatal(err)
	}
	plain, err := m.Create(context.Background(), sandbox.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	marker := len("\n[truncated: 1000000000 more bytes dropped by max_output_length]\n")
	bound := int64(limit + 2*marker + sandbox.MaxErrorName)
	cells := []struct{ name, code string }{
		{"a thousand results", `for i in range(1000): display("x" * 1600)`},
		{"one JSON of many strings", `class R:
    def _repr_json_(self): return {str(i): "y" * 900 for i in range(2000)}
R()`},
		{"data frame data", fakePandas(`{"c": ["z" * 1000] * 1600}`) + `_pd.DataFrame()`},
		{"a png that is text", `class R:
    def _repr_png_(self): return "A" * 1600000
R()`},
		{"every text rendering of one result", `class R:
    def _repr_html_(self): return "h" * 400000
    def _repr_markdown_(self): return "m" * 400000
    def _repr_latex_(self): return "l" * 400000
    def _repr_svg_(self): return "s" * 400000
    def _repr_javascript_(self): return "j" * 400000
R()`},
		{"error name", `raise type("E" * 1600000, (Exception,), {})("x")`},
		{"stdout, stderr, results and an error", `import sys
print("o" * 500000); sys.stderr.write("e" * 500000 + "\n")
display("r" * 500000)
raise ValueError("v" * 60000)`},
	}
	for _, c := range cells {
		t.Run(c.name, func(t *testing.T) {
			kept, streamed, _ := answers(t, plain, c.code)
			if kept.bytes < 1500000 || streamed.bytes < 1500000 {
				t.Fatalf("control: unfiltered, the answer is %d bytes kept, %d streamed", kept.bytes, streamed.bytes)
			}
			kept, streamed, ex := answers(t, capped, c.code)
			if kept.bytes > bound || streamed.bytes > bound {
				t.Fatalf("capped at %d, the answer is %d bytes kept, %d streamed (at most %d)", limit, kept.bytes, streamed.bytes, bound)
			}
			if !ex.Truncated || !strings.Contains(kept.text.String(), "dropped by max_output_length") {
				t.Fatalf("the cut is not said: truncated %v", ex.Truncated)
			}
		})
	}
}
