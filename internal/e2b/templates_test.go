package e2b

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/sheepfold/sheepfold/internal/template"
)

const testHash = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

// TestTranslateBuild turns E2B builder steps (as the SDK serializes them)
// into a Dockerfile that BuildKit's parser, as the server's build,
// accepts; steps that cannot be built here are refused with a 400 naming
// them.
func TestTranslateBuild(t *testing.T) {
	templates := map[string]string{"base": "python"}
	spec := func(s string) buildSpec {
		var b buildSpec
		if err := json.Unmarshal([]byte(s), &b); err != nil {
			t.Fatal(err)
		}
		return b
	}
	df, hashes, noCache, err := translate(spec(`{"fromTemplate": "base", "force": false, "steps": [
		{"type": "ENV", "args": ["A", "x \"y\" $HOME \\ z", "B", "2"], "force": false},
		{"type": "COPY", "args": ["app", "/opt/app", "user", "0755"], "force": false, "filesHash": "`+testHash+`"},
		{"type": "RUN", "args": ["echo one &&\necho two"], "force": false},
		{"type": "RUN", "args": ["id -un > /tmp/u", "user"], "force": true},
		{"type": "WORKDIR", "args": ["/opt/app"], "force": false},
		{"type": "USER", "args": ["user"], "force": false},
		{"type": "RUN", "args": ["whoami", "root"], "force": false}],
		"startCmd": "python3 -m http.server 8000", "readyCmd": "ss -tuln | grep :8000"}`), templates)
	if err != nil {
		t.Fatal(err)
	}
	want := `FROM python
ENV A="x \"y\" \$HOME \\ z" B="2"
COPY --chown=user --chmod=0755 ["` + testHash + `/app","/opt/app"]
RUN ["/bin/sh","-c","echo one \u0026\u0026\necho two"]
USER user
RUN ["/bin/sh","-c","id -un \u003e /tmp/u"]
USER root
WORKDIR /opt/app
USER user
USER root
RUN ["/bin/sh","-c","whoami"]
USER user
LABEL sheepfold.start="python3 -m http.server 8000"
LABEL sheepfold.ready="cmd:ss -tuln | grep :8000"
`
	if df != want {
		t.Errorf("Dockerfile:\n%s\nwant:\n%s", df, want)
	}
	if len(hashes) != 1 || hashes[0] != testHash || !noCache {
		t.Errorf("hashes %v, noCache %v", hashes, noCache)
	}
	parsed, err := template.ParseDockerfile(strings.NewReader(df))
	if err != nil {
		t.Fatalf("the Dockerfile does not parse: %v", err)
	}
	// A line break in a command stays inside its RUN: as many steps as
	// written, no instruction smuggled in.
	if len(parsed.Steps) != 13 || parsed.From != "python" {
		t.Errorf("%d steps from %s", len(parsed.Steps), parsed.From)
	}
	// The E2B SDK's default image is the template base.
	if df, _, _, err := translate(spec(`{"fromImage": "e2bdev/base", "steps": []}`), templates); err != nil || df != "FROM python\n" {
		t.Errorf("e2bdev/base: %q, %v", df, err)
	}
	for name, tc := range map[string]struct{ spec, msg string }{
		"no base":         {`{"steps": []}`, "fromImage or fromTemplate"},
		"registry creds":  {`{"fromImage": "r.example/x:1", "fromImageRegistry": {"type": "registry", "username": "u", "password": "p"}, "steps": []}`, "--registry-auth"},
		"from injection":  {`{"fromImage": "x:1\nRUN evil", "steps": []}`, "line break"},
		"env injection":   {`{"fromTemplate": "base", "steps": [{"type": "ENV", "args": ["A", "1\nRUN evil"]}]}`, "line break"},
		"env name":        {`{"fromTemplate": "base", "steps": [{"type": "ENV", "args": ["A B", "1"]}]}`, "not a variable name"},
		"workdir newline": {`{"fromTemplate": "base", "steps": [{"type": "WORKDIR", "args": ["/x\nRUN evil"]}]}`, "line break"},
		"user newline":    {`{"fromTemplate": "base", "steps": [{"type": "USER", "args": ["u\nRUN evil"]}]}`, "line break"},
		"start newline":   {`{"fromTemplate": "base", "startCmd": "a\nRUN evil", "steps": []}`, "line break"},
		"copy dotdot":     {`{"fromTemplate": "base", "steps": [{"type": "COPY", "args": ["../etc", "/x"], "filesHash": "` + testHash + `"}]}`, "inside the build's files"},
		"copy abs":        {`{"fromTemplate": "base", "steps": [{"type": "COPY", "args": ["/etc", "/x"], "filesHash": "` + testHash + `"}]}`, "inside the build's files"},
		"copy no hash":    {`{"fromTemplate": "base", "steps": [{"type": "COPY", "args": ["a", "/x"], "filesHash": "../../x"}]}`, "files' hash"},
		"unknown step":    {`{"fromTemplate": "base", "steps": [{"type": "ADD", "args": ["a", "/x"]}]}`, "not a step"},
	} {
		_, _, _, err := translate(spec(tc.spec), templates)
		var se *statusError
		if !errors.As(err, &se) || se.status != 400 || !strings.Contains(se.message, tc.msg) {
			t.Errorf("%s: %v, want 400 with %q", name, err, tc.msg)
		}
	}
	// Control: without the check, a line break in WORKDIR does smuggle a
	// RUN into the Dockerfile.
	smuggled, err := template.ParseDockerfile(strings.NewReader("FROM python\nWORKDIR /x\nRUN evil\n"))
	if err != nil || len(smuggled.Steps) != 2 {
		t.Fatalf("control: %v", err)
	}
}
