package batch

import (
	"encoding/json"
	"errors"
	"os/exec"
	"strings"
	"testing"

	"github.com/sheepfold/sheepfold/internal/account"
	"github.com/sheepfold/sheepfold/internal/apierr"
	"github.com/sheepfold/sheepfold/internal/sandbox"
)

func TestMarked(t *testing.T) {
	const mark = "\x1eM:"
	for _, c := range []struct {
		name, stdout, want string
		ok                 bool
	}{
		{"alone", mark + "3\n", "3", true},
		{"after prints", "hello\n" + mark + `{"a": [1, 2]}` + "\n", `{"a":[1,2]}`, true},
		{"last wins", mark + "1\n" + mark + "2\n", "2", true},
		{"none", "3\n", "", false},
		{"not json", mark + "{\n", "", false},
		{"other mark", "\x1eX:3\n", "", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, ok := Marked(c.stdout, mark)
			if ok != c.ok || string(got) != c.want {
				t.Fatalf("Marked = %s, %v; want %s, %v", got, ok, c.want, c.ok)
			}
		})
	}
}

// TestScriptRunsInPython: the script an item runs carries any input,
// quotes and newlines and non-ASCII included, to the handler intact (run
// by the host's python3, as a kernel would).
func TestScriptRunsInPython(t *testing.T) {
	py, err := exec.LookPath("/usr/bin/python3")
	if err != nil {
		t.Skip("no /usr/bin/python3")
	}
	const mark = "\x1eM:"
	input := json.RawMessage(`{"s":"a\"b'c\\n\n\u2028é\"\"\"","n":[1,2.5,null,true]}`)
	out, err := exec.Command(py, "-c", Script("def handler(item):\n    return item\n", input, mark)).CombinedOutput()
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	got, ok := Marked(string(out), mark)
	if !ok {
		t.Fatalf("no result in %q", out)
	}
	var a, b any
	json.Unmarshal(input, &a)
	json.Unmarshal(got, &b)
	if ja, _ := json.Marshal(a); string(ja) != func() string { jb, _ := json.Marshal(b); return string(jb) }() {
		t.Fatalf("the handler got %s, sent %s", got, input)
	}
	for _, c := range []struct{ code, want string }{
		{"def handler(x):\n    return 1\n", `{"ok": true}`},
		{"handler = len\n", `{"ok": true}`},
		{"from os.path import basename as handler\n", `{"ok": true}`},
		{"def other(x): pass\n", `"NameError"`},
		{"def handler(x)\n  pass\n", `"SyntaxError"`},
		{"import sys; sys.exit(3)\n", `"NameError"`}, // parsed, never run
	} {
		out, err := exec.Command(py, "-c", CheckScript(c.code, mark)).CombinedOutput()
		if err != nil {
			t.Fatalf("%q: %v\n%s", c.code, err, out)
		}
		if got, ok := Marked(string(out), mark); !ok || !strings.Contains(string(got), strings.ReplaceAll(c.want, " ", "")) {
			t.Errorf("check of %q: %s", c.code, out)
		}
	}
}

func TestClassify(t *testing.T) {
	capErr := apierr.Wrap(account.ErrConcurrentCap, apierr.SessionQuotaExceeded, "concurrent sandbox limit of 2 reached")
	credits := apierr.New(apierr.SessionQuotaExceeded, "credits exhausted")
	for _, c := range []struct {
		name string
		err  error
		wait bool
	}{
		{"account cap", capErr, true},
		{"server full", &apierr.Error{Code: apierr.Capacity}, true},
		{"shutting down", apierr.New(apierr.ShuttingDown, "x"), true},
		{"every GPU held", apierr.New(apierr.DeviceInUse, "x"), true},
		{"the account's devices held", &apierr.Error{Code: apierr.SessionQuotaExceeded, Err: sandbox.ErrDeviceCap}, true},
		{"more devices than the account's max_devices", apierr.New(apierr.BadRequest, "x"), false},
		{"no such GPU", apierr.New(apierr.DeviceNotFound, "x"), false},
		{"credits", credits, false},
		{"template", apierr.New(apierr.TemplateNotFound, "x"), false},
		{"uncoded", errors.New("x"), false},
	} {
		if o := Classify(c.err); (o.Wait > 0) != c.wait || o.Refused == nil {
			t.Errorf("%s: %+v, want wait %v", c.name, o, c.wait)
		}
	}
}
