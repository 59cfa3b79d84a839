package server_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/sandbox"
	"github.com/sheepfold/sheepfold/internal/server"
	"github.com/sheepfold/sheepfold/internal/template"
	"github.com/sheepfold/sheepfold/internal/testutil"
	"github.com/sheepfold/sheepfold/internal/testutil/nodejs"
)

// dataTemplates are the data dir's built templates with their start
// commands (internal/engine's wiring).
type dataTemplates struct{ dir string }

func (d dataTemplates) RootFS(name string) (string, error) {
	i, err := template.Get(d.dir, name)
	return i.Path, err
}

func (d dataTemplates) StartOf(name string) (sandbox.TemplateStart, error) {
	i, err := template.Get(d.dir, name)
	return sandbox.TemplateStart{Command: i.Start, Ready: i.Ready, User: i.User, WorkDir: i.WorkDir, Env: i.Env,
		Root: i.Labels[template.LabelRoot]}, err
}

const reactV1 = `export default function App() {
  return <h1>first version of the app</h1>
}
`

const reactV2 = `export default function App() {
  return <h1>second version, hot</h1>
}
`

// TestReactTSPreview: a sandbox of the react-ts template (make template
// builds it) is ready when its create returns; seed 000's write of
// "/src/App.tsx" lands in the project, and Chromium sees the component
// through the host-form preview; a second version written through the
// file API replaces it without a reload (Vite's hot reload, its
// WebSocket through the preview). A program reading the path form gets
// the page and its modules there.
func TestReactTSPreview(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.TemplateRootFS(t, "react-ts")
	e := runcEnvWith(t, server.Config{}, func(c *sandbox.Config) {
		c.Templates = dataTemplates{testutil.DataDir()}
		c.PoolSize = 0
	})
	api, lport := serveBrowsable(t, e.srv)

	began := time.Now()
	id := e.create(e.keyA, map[string]any{"template": "react-ts"})
	t.Logf("create (pool miss) took %s", time.Since(began))
	want(t, e.do("PUT", "/v1/sandboxes/"+id+"/files?path=/src/App.tsx", e.keyA, reactV1), http.StatusCreated, "")
	r := e.do("GET", "/v1/sandboxes/"+id+"/files?path=/home/user/app/src/App.tsx", e.keyA, nil)
	want(t, r, http.StatusOK, "")
	if string(r.body) != reactV1 {
		t.Fatalf("/src/App.tsx did not land in the project: %q", r.body)
	}
	want(t, e.do("PUT", "/v1/sandboxes/"+id+"/ports/5173", e.keyA, map[string]any{"public": true}), http.StatusOK, "")

	// The path form, as a program sees it: the page's module URLs carry
	// the prefix and are served there.
	prefix := "/v1/sandboxes/" + id + "/proxy/5173/"
	get := func(p string) (int, string) {
		t.Helper()
		res, err := http.Get(api + p)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(b)
	}
	code, page := get(prefix)
	src := regexp.MustCompile(`<script type="module" src="([^"]+main\.tsx)"`).FindStringSubmatch(page)
	if code != http.StatusOK || src == nil || !strings.HasPrefix(src[1], prefix) {
		t.Fatalf("path form: %d %s", code, page)
	}
	if code, js := get(src[1]); code != http.StatusOK || !strings.Contains(js, "createRoot") {
		t.Fatalf("path form module %s: %d %.300s", src[1], code, js)
	}

	node := nodejs.LookNode(t)
	uiDir, err := filepath.Abs("../../test/ui")
	if err != nil {
		t.Fatal(err)
	}
	nodejs.NpmCI(t, uiDir)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "react-hmr.mjs")
	cmd.Dir = uiDir
	cmd.Env = append(nodejs.Environ(), "SHEEPFOLD_URL="+api, "SHEEPFOLD_API_KEY="+e.keyA, "ID="+id,
		"PAGE=http://5173-"+id+".localhost:"+lport+"/", "FILE=/src/App.tsx", "V2="+reactV2,
		"WANT1=first version of the app", "WANT2=second version, hot", "CHROMIUM=/usr/bin/chromium")
	out, err := cmd.Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("react-hmr.mjs: %v\n%s\n%s", err, out, stderr)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	var res struct {
		Saw1, Saw2       bool
		Mark, Error, URL string
		Reloads          int
		WriteStatus      int   `json:"write_status"`
		FirstMS          int64 `json:"first_ms"`
		HMRMS            int64 `json:"hmr_ms"`
	}
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &res); err != nil {
		t.Fatalf("react-hmr.mjs printed %q: %v", out, err)
	}
	t.Logf("browser: %+v", res)
	if res.Error != "" || !res.Saw1 || !res.Saw2 || res.WriteStatus != http.StatusCreated {
		t.Fatalf("the page did not show both versions: %+v", res)
	}
	if res.Mark != "kept" || res.Reloads != 0 {
		t.Errorf("the second version came by a reload, not hot: %+v", res)
	}
}
