package template

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestTags: a tag is a frozen copy of the build it was given: building
// (here: installing a new tree of) the name again leaves the tag on the
// old files; a tag moved to another tag's build takes that build; Untag
// removes it; a tag in use (Hold) is moved and removed all the same, its
// copy kept whole for its holder and removed at the release; Sweep
// removes what nothing names or holds; bad tags and refs are refused;
// List does not show tags.
func TestTags(t *testing.T) {
	t.Parallel()
	data := t.TempDir()
	install := func(content, hash string) {
		t.Helper()
		dir := filepath.Join(templatesDir(data), "app")
		os.RemoveAll(dir) // a build installs a new tree, never changes one
		writeTree(t, dir, map[string]string{"rootfs/etc/version": content})
		if err := writeInfo(dir, Info{Name: "app", Version: FormatVersion, Hash: hash, User: "guest", WorkDir: "/srv"}); err != nil {
			t.Fatal(err)
		}
	}
	version := func(ref string) string {
		t.Helper()
		info, err := Get(data, ref)
		if err != nil {
			t.Fatalf("Get(%s): %v", ref, err)
		}
		b, err := os.ReadFile(filepath.Join(info.Path, "etc/version"))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	ctx := context.Background()
	install("one", "sha256:1")
	if _, err := Tag(ctx, data, "app", []string{"v1", "stable"}); err != nil {
		t.Fatal(err)
	}
	install("two", "sha256:2")
	for ref, want := range map[string]string{"app": "two", "app:default": "two", "app:v1": "one", "app:stable": "one"} {
		if got := version(ref); got != want {
			t.Errorf("%s: %q, want %q", ref, got, want)
		}
	}
	if info, _ := Get(data, "app:v1"); info.Hash != "sha256:1" || info.User != "guest" || info.Tagged.IsZero() || TagOf(info) != "v1" {
		t.Errorf("app:v1's info: %+v", info)
	}
	// stable moves to the newest build; v1 stays.
	if _, err := Tag(ctx, data, "app:default", []string{"stable"}); err != nil {
		t.Fatal(err)
	}
	if version("app:stable") != "two" || version("app:v1") != "one" {
		t.Error("stable did not move, or v1 moved with it")
	}
	// A tag of a tag: prod is v1's build.
	if _, err := Tag(ctx, data, "app:v1", []string{"prod"}); err != nil {
		t.Fatal(err)
	}
	if version("app:prod") != "one" {
		t.Error("prod is not v1's build")
	}
	tags, err := Tags(data, "app")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, i := range tags {
		names = append(names, i.Name)
	}
	if strings.Join(names, " ") != "app:prod app:stable app:v1" {
		t.Errorf("Tags = %v", names)
	}
	if l, _ := List(data); len(l) != 1 || l[0].Name != "app" {
		t.Errorf("List shows %+v", l)
	}

	// In use: moved and removed all the same; the copy held stays,
	// whole, until its hold is released, then goes.
	held, release, err := Hold(data, "app:prod")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Tag(ctx, data, "app", []string{"prod"}); err != nil {
		t.Fatalf("moving a tag in use: %v", err)
	}
	if version("app:prod") != "two" {
		t.Error("prod did not move")
	}
	if b, err := os.ReadFile(filepath.Join(held.Path, "etc/version")); err != nil || string(b) != "one" {
		t.Errorf("the held copy after the move: %q, %v", b, err)
	}
	if err := Untag(data, "app", "prod"); err != nil {
		t.Fatal(err)
	}
	if err := Untag(data, "app", "v1"); err != nil { // v1 is on the held generation too
		t.Fatal(err)
	}
	// What a crash leaves (an old tree of the name, a generation no
	// link names) goes at a Sweep; the held copy stays.
	for _, d := range []string{".app.old-crash/rootfs", ".tags/app/.gen-crash/rootfs", ".tags/app/.staging-crash"} {
		if err := os.MkdirAll(filepath.Join(templatesDir(data), d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := Sweep(data); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{".app.old-crash", ".tags/app/.gen-crash", ".tags/app/.staging-crash"} {
		if _, err := os.Stat(filepath.Join(templatesDir(data), d)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s after Sweep: %v", d, err)
		}
	}
	if _, err := os.Stat(held.Path); err != nil {
		t.Errorf("the held copy went while held: %v", err)
	}
	// Released without collecting (an engine closing with a paused
	// sandbox on it): it stays, for the next engine's sweep.
	release(false)
	if _, err := os.Stat(held.Path); err != nil {
		t.Errorf("the copy released without collecting: %v", err)
	}
	if err := Sweep(data); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(held.Path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the released copy after a Sweep: %v", err)
	}
	// Released with collecting (its sandbox gone): it goes at once.
	held, release, err = Hold(data, "app:stable")
	if err != nil {
		t.Fatal(err)
	}
	if err := Untag(data, "app", "stable"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(held.Path); err != nil {
		t.Errorf("the held copy went while held: %v", err)
	}
	release(true)
	if _, err := os.Stat(held.Path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the held copy after its release: %v", err)
	}
	if _, err := Tag(ctx, data, "app", []string{"stable"}); err != nil {
		t.Fatal(err)
	}
	if _, err := Get(data, "app:prod"); !errors.Is(err, ErrNotBuilt) {
		t.Errorf("Get of a removed tag: %v", err)
	}
	if err := Untag(data, "app", "prod"); !errors.Is(err, ErrNotBuilt) {
		t.Errorf("removing it again: %v", err)
	}
	for _, bad := range []struct{ src, tag string }{{"app", "../x"}, {"app", "Bad"}, {"app", DefaultTag}, {"app", ""}, {"nope", "v1"}, {"app:nope", "v2"}, {"../app", "v1"}} {
		if _, err := Tag(ctx, data, bad.src, []string{bad.tag}); err == nil {
			t.Errorf("Tag(%s, %q) succeeded", bad.src, bad.tag)
		}
	}
	for _, ref := range []string{"app:../v1", "app:V1", "app:", ":v1"} {
		if _, err := Get(data, ref); err == nil {
			t.Errorf("Get(%q) succeeded", ref)
		}
	}
	// Nothing half-made is left: only the tags and no staging.
	ents, _ := os.ReadDir(filepath.Join(templatesDir(data), ".tags", "app"))
	var left []string
	for _, e := range ents {
		left = append(left, e.Name())
	}
	if len(left) != 2 || left[1] != "stable" || !strings.HasPrefix(left[0], genPrefix) {
		t.Errorf("left in .tags/app: %v", left)
	}
}
