package batch

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
)

// pyString is s as a Python string literal: a JSON string is one (its
// escapes are Python's, and Go escapes U+2028 and U+2029).
func pyString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// Script is the Python an item runs in a fresh sandbox: the batch's
// code, then Call.
func Script(code string, input json.RawMessage, mark string) string {
	return code + "\n\n" + Call(input, mark)
}

// WorkerScript is the Python an item runs in its worker's sandbox, whose
// kernel ran earlier items: the batch's code, only when this kernel has
// not run it yet (its first item, or a kernel that restarted), then
// Call. The code runs as the module's own (exec in the kernel's
// globals), so its imports and globals serve the items after it.
func WorkerScript(code string, input json.RawMessage, mark string) string {
	return fmt.Sprintf("if not globals().get(\"_sf_ready\"):\n"+
		"    exec(compile(%s, \"<batch>\", \"exec\"), globals())\n"+
		"    _sf_ready = True\n", pyString(code)) + Call(input, mark)
}

// Call is the Python that calls the handler (defined by a batch's code
// run before, in this kernel or the same script) over an item, the
// return value printed as JSON on one line that begins with mark (a
// nonce of the run, so that the handler's own output is not taken for
// it). Its own names begin with _sf_, so that a worker's kernel keeps
// only what the code and the handler made.
func Call(input json.RawMessage, mark string) string {
	var b strings.Builder
	b.WriteString("import json as _sf_json\n")
	fmt.Fprintf(&b, "_sf_out = _sf_json.dumps(handler(_sf_json.loads(%s)))\n", pyString(string(input)))
	fmt.Fprintf(&b, "print(%s + _sf_out, flush=True)\n", pyString(mark))
	return b.String()
}

// CheckScript is the Python that checks a batch's code without running
// it: it parses the code (ast.parse runs nothing) and looks for a
// handler bound at its top level (a def, an assignment or an import).
// It prints mark and a JSON object: {"ok": true} or the reason.
func CheckScript(code, mark string) string {
	return fmt.Sprintf(`import ast as _sf_ast, json as _sf_json
def _sf_check(src):
    try:
        tree = _sf_ast.parse(src, "<batch>", "exec")
    except SyntaxError as e:
        return {"ok": False, "name": type(e).__name__, "value": str(e.msg), "line": e.lineno or 0}
    for n in tree.body:
        if isinstance(n, (_sf_ast.FunctionDef, _sf_ast.AsyncFunctionDef, _sf_ast.ClassDef)) and n.name == "handler":
            return {"ok": True}
        if isinstance(n, (_sf_ast.Assign, _sf_ast.AnnAssign)):
            targets = n.targets if isinstance(n, _sf_ast.Assign) else [n.target]
            if any(isinstance(t, _sf_ast.Name) and t.id == "handler" for t in targets):
                return {"ok": True}
        if isinstance(n, (_sf_ast.Import, _sf_ast.ImportFrom)):
            if any((a.asname or a.name.split(".")[0]) == "handler" for a in n.names):
                return {"ok": True}
    return {"ok": False, "name": "NameError", "value": "the code defines no handler(item) at its top level", "line": 0}
print(%s + _sf_json.dumps(_sf_check(%s)), flush=True)
`, pyString(mark), pyString(code))
}

// CheckResult is what CheckScript printed.
type CheckResult struct {
	OK    bool   `json:"ok"`
	Name  string `json:"name"`
	Value string `json:"value"`
	Line  int    `json:"line"`
}

// Marked returns the JSON of the last line of stdout that begins with
// mark, without the mark; false when there is none.
func Marked(stdout, mark string) (json.RawMessage, bool) {
	lines := strings.Split(stdout, "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if rest, ok := strings.CutPrefix(lines[i], mark); ok {
			rest = strings.TrimSuffix(rest, "\r")
			if !json.Valid([]byte(rest)) {
				return nil, false
			}
			var c bytes.Buffer
			if json.Compact(&c, []byte(rest)) != nil {
				return nil, false
			}
			return c.Bytes(), true
		}
	}
	return nil, false
}
