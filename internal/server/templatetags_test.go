package server_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/auth"
	"github.com/sheepfold/sheepfold/internal/server"
	"github.com/sheepfold/sheepfold/internal/template"
	"github.com/sheepfold/sheepfold/internal/testutil"
)

// TestE2BTemplateTagsAPI: E2B's template list, aliases and tags over the
// server's templates. A build of NAME:v1 tags it v1; building NAME again
// leaves v1 on the first build (its ENV), which a tag of a tag shares;
// the list shows templates, not tags, to every key; an unknown alias is
// E2B's 404 ({code, message}), a known one (a tag too) 200; assigning
// and removing tags needs an admin key (a user key's attempt changes
// nothing); an unknown tag's removal is a 404.
func TestE2BTemplateTagsAPI(t *testing.T) {
	testutil.RequireRoot(t)
	data := t.TempDir()
	base := filepath.Join(data, "templates", "python")
	testutil.WriteTree(t, filepath.Join(base, "rootfs"), map[string]string{"etc/passwd": "root:x:0:0::/root:/bin/sh\n"})
	info, _ := json.Marshal(template.Info{Name: "python", Suite: "bookworm", Version: template.FormatVersion, UIDShift: 1000})
	if err := os.WriteFile(filepath.Join(base, "template.json"), info, 0o644); err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, server.Config{DataDir: data, TemplateRunner: noRunner{}, TemplateUIDShift: 1000})
	ctx := context.Background()
	_, admin, err := auth.Create(ctx, e.store, auth.CreateOptions{Name: "a", Admin: true, E2B: true})
	if err != nil {
		t.Fatal(err)
	}
	_, user, _ := auth.Create(ctx, e.store, auth.CreateOptions{Name: "u", Owner: "u", E2B: true})
	e2b := func(method, path, key string, body any) resp {
		return e.do(method, path, "", body, "X-API-Key", key)
	}
	build := func(name, value string, tags ...string) {
		t.Helper()
		r := e2b("POST", "/v3/templates", admin, map[string]any{"name": name, "tags": tags})
		var req struct {
			TemplateID, BuildID string
			Tags                []string
		}
		if json.Unmarshal(r.body, &req); r.status != http.StatusAccepted {
			t.Fatalf("build request: %d %s", r.status, r.body)
		}
		start := map[string]any{"fromTemplate": "base", "steps": []map[string]any{{"type": "ENV", "args": []string{"VERSION", value}}}}
		if r := e2b("POST", "/v2/templates/"+req.TemplateID+"/builds/"+req.BuildID, admin, start); r.status != http.StatusAccepted {
			t.Fatalf("start: %d %s", r.status, r.body)
		}
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			var st struct{ Status string }
			r = e2b("GET", "/templates/"+req.TemplateID+"/builds/"+req.BuildID+"/status", admin, nil)
			json.Unmarshal(r.body, &st)
			if st.Status == "ready" {
				return
			}
			if st.Status == "error" || time.Now().After(deadline) {
				t.Fatalf("build %s: %s", name, r.body)
			}
		}
	}
	envOf := func(ref string) string {
		t.Helper()
		info, err := template.Get(data, ref)
		if err != nil {
			t.Fatalf("%s: %v", ref, err)
		}
		return strings.Join(info.Env, " ")
	}
	build("app:v1", "one", "first")
	build("app", "two")
	for ref, want := range map[string]string{"app": "VERSION=two", "app:v1": "VERSION=one", "app:first": "VERSION=one"} {
		if got := envOf(ref); got != want {
			t.Errorf("%s: %q, want %q", ref, got, want)
		}
	}

	// The list: every key sees the templates, no tag among them.
	for _, key := range []string{admin, user} {
		r := e2b("GET", "/templates", key, nil)
		var l []struct {
			TemplateID, BuildID, BuildStatus string
			Aliases                          []string
			CPUCount                         int
			MemoryMB                         int64
		}
		if json.Unmarshal(r.body, &l); r.status != http.StatusOK || len(l) != 2 || l[0].TemplateID != "app" || l[1].TemplateID != "python" ||
			l[0].BuildStatus != "ready" || len(l[0].BuildID) != 36 || l[0].CPUCount < 1 || l[0].MemoryMB < 1 || !slices.Equal(l[0].Aliases, []string{"app"}) {
			t.Fatalf("list: %d %s", r.status, r.body)
		}
	}
	// Aliases.
	for alias, status := range map[string]int{"app": 200, "app:v1": 200, "app:default": 200, "base": 200, "python": 200,
		"app:nope": 404, "nope": 404, "nope:v1": 404} {
		r := e2b("GET", "/templates/aliases/"+alias, user, nil)
		var body struct {
			TemplateID string
			Code       int
			Message    string
		}
		json.Unmarshal(r.body, &body)
		if r.status != status || status == 200 && body.TemplateID == "" || status == 404 && (body.Code != 404 || body.Message == "") {
			t.Errorf("alias %s: %d %s, want %d", alias, r.status, r.body, status)
		}
	}
	type tag struct {
		Tag, BuildID string
		CreatedAt    time.Time
	}
	tags := func() map[string]string {
		t.Helper()
		r := e2b("GET", "/templates/app/tags", user, nil)
		var l []tag
		if json.Unmarshal(r.body, &l); r.status != http.StatusOK || len(l) == 0 || l[0].Tag != "default" {
			t.Fatalf("tags: %d %s", r.status, r.body)
		}
		m := map[string]string{}
		for _, x := range l {
			m[x.Tag] = x.BuildID
		}
		return m
	}
	got := tags()
	if len(got) != 3 || got["v1"] != got["first"] || got["v1"] == got["default"] {
		t.Fatalf("tags: %v", got)
	}
	if r := e2b("GET", "/templates/nope/tags", user, nil); r.status != http.StatusNotFound {
		t.Errorf("tags of an unknown template: %d %s", r.status, r.body)
	}

	// Assign: a user key may not; an admin's moves stable to v1's build.
	if r := e2b("POST", "/templates/tags", user, map[string]any{"target": "app:v1", "tags": []string{"stable"}}); r.status != http.StatusForbidden {
		t.Fatalf("a user key's assign: %d %s", r.status, r.body)
	}
	if _, err := template.Get(data, "app:stable"); err == nil {
		t.Fatal("the user key's assign made a tag")
	}
	r := e2b("POST", "/templates/tags", admin, map[string]any{"target": "app:v1", "tags": []string{"stable", "prod"}})
	var assigned struct {
		BuildID string
		Tags    []string
	}
	if json.Unmarshal(r.body, &assigned); r.status != http.StatusCreated || assigned.BuildID != got["v1"] || len(assigned.Tags) != 2 {
		t.Fatalf("assign: %d %s", r.status, r.body)
	}
	if envOf("app:stable") != "VERSION=one" {
		t.Error("stable is not v1's build")
	}
	for bad, msg := range map[string]string{"Bad!": `invalid tag \"Bad!\": want [a-z0-9][a-z0-9._-]*`, "../x": "invalid tag", "default": "newest build"} {
		r := e2b("POST", "/templates/tags", admin, map[string]any{"target": "app", "tags": []string{"v9", bad}})
		if r.status != http.StatusBadRequest || !strings.Contains(string(r.body), msg) {
			t.Errorf("assign %q: %d %s, want 400 saying %s", bad, r.status, r.body, msg)
		}
	}
	if _, err := template.Get(data, "app:v9"); !errors.Is(err, template.ErrNotBuilt) {
		t.Errorf("a request with a bad tag made its good one: %v", err)
	}
	if r := e2b("POST", "/templates/tags", admin, map[string]any{"target": "app"}); r.status != http.StatusBadRequest {
		t.Errorf("assign without tags: %d %s", r.status, r.body)
	}
	if r := e2b("POST", "/templates/tags", admin, map[string]any{"target": "app:nope", "tags": []string{"x"}}); r.status != http.StatusNotFound {
		t.Errorf("assign from an unknown tag: %d %s", r.status, r.body)
	}

	// Remove.
	if r := e2b("DELETE", "/templates/tags", user, map[string]any{"name": "app", "tags": []string{"prod"}}); r.status != http.StatusForbidden {
		t.Fatalf("a user key's remove: %d %s", r.status, r.body)
	}
	if r := e2b("DELETE", "/templates/tags", admin, map[string]any{"name": "app", "tags": []string{"prod"}}); r.status != http.StatusNoContent {
		t.Fatalf("remove: %d %s", r.status, r.body)
	}
	if got := tags(); len(got) != 4 || got["prod"] != "" {
		t.Errorf("tags after the remove: %v", got)
	}
	if r := e2b("DELETE", "/templates/tags", admin, map[string]any{"name": "app", "tags": []string{"prod"}}); r.status != http.StatusNotFound {
		t.Errorf("removing it again: %d %s", r.status, r.body)
	}
}
