package template

import (
	"io/fs"
	"slices"
	"strings"
	"testing"
	"testing/fstest"
)

// TestBuiltinFromSpec: the python template's definition (the packages
// debootstrap installs, the suite, the description) is what
// builtin/python.Dockerfile declares, and that is what python held before
// the spec existed (the list below), so no built template goes stale.
func TestBuiltinFromSpec(t *testing.T) {
	d, err := Lookup("python")
	if err != nil {
		t.Fatal(err)
	}
	want := Definition{Name: "python", Suite: "bookworm",
		Packages: []string{"python3", "python3-numpy", "python3-pandas", "python3-matplotlib",
			"nodejs", "bash", "coreutils", "procps", "tzdata",
			"ca-certificates", "curl", "git", "python3-pip", "python3-requests",
			"r-base-core", "default-jdk-headless"},
		Description: "Debian bookworm with Python 3.11 (numpy, pandas, matplotlib), Node.js 18, R 4.2, Java 17 (jshell) and Bash"}
	if d.Name != want.Name || d.Suite != want.Suite || d.Description != want.Description || !slices.Equal(d.Packages, want.Packages) {
		t.Fatalf("python = %+v\nwant %+v", d, want)
	}
	// The build reads the spec: a spec with another package list gives
	// another definition (and Stale would then rebuild).
	src, err := builtinSpecs.ReadFile("builtin/python.Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	changed, err := ParseSpec("python", []byte(strings.Replace(string(src), "procps tzdata", "procps tzdata jq", 1)))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(changed.Packages, "jq") || samePackages(changed.Packages, d.Packages) {
		t.Fatalf("a changed spec: %v", changed.Packages)
	}
	// Builtin (what `template build python` builds) reads the spec file.
	defer func(fsys fs.FS) { builtinFS = fsys }(builtinFS)
	builtinFS = fstest.MapFS{"builtin/python.Dockerfile": {Data: []byte(strings.Replace(string(src), "procps tzdata", "procps tzdata jq", 1))}}
	if d2, err := Lookup("python"); err != nil || !slices.Equal(d2.Packages, changed.Packages) {
		t.Fatalf("Lookup after the spec changed: %v, %v", d2.Packages, err)
	}
	old := Info{Suite: d.Suite, Packages: d.Packages, UIDShift: 7}
	if old.mismatch(d, 7) != "" || old.mismatch(changed, 7) == "" {
		t.Error("a template built from the old list is not stale against the changed spec (or stale against the same)")
	}
	// The python template built on this machine (read, never rebuilt)
	// matches the spec.
	if built, err := Get("/var/lib/sheepfold", "python"); err == nil {
		if reason := built.mismatch(d, built.UIDShift); reason != "" {
			t.Errorf("the built python template does not match the spec: %s", reason)
		}
	}
}

// TestParseSpecRefuses: a spec holds only FROM debian:SUITE, RUN apt-get
// install and LABEL sheepfold.description; anything else fails naming
// its line.
func TestParseSpecRefuses(t *testing.T) {
	for name, tc := range map[string]struct{ src, msg string }{
		"no from":     {"RUN apt-get install -y x1\n", "line 1: RUN before FROM"},
		"not debian":  {"FROM ubuntu:24.04\n", "line 1: want one FROM debian:SUITE"},
		"two froms":   {"FROM debian:bookworm\nFROM debian:trixie\n", "line 2: want one FROM"},
		"other run":   {"FROM debian:bookworm\nRUN curl x | sh\n", "line 2: want RUN apt-get install"},
		"exec form":   {"FROM debian:bookworm\nRUN [\"apt-get\", \"install\", \"x1\"]\n", "line 2: want RUN apt-get install"},
		"other flag":  {"FROM debian:bookworm\nRUN apt-get install --allow-unauthenticated x1\n", "only -y and --no-install-recommends"},
		"bad package": {"FROM debian:bookworm\nRUN apt-get install -y 'x;rm'\n", "invalid package name"},
		"other label": {"FROM debian:bookworm\nLABEL a=b\n", "only sheepfold.description"},
		"copy":        {"FROM debian:bookworm\nCOPY a /a\n", "line 2: COPY: only FROM"},
		"empty":       {"# nothing\n", "template t spec"},
		"bad suite":   {"FROM debian:Bad_Suite\n", "invalid suite"},
		"unknown":     {"FROM debian:bookworm\nBOGUS x\n", "line 2: unknown instruction"},
	} {
		_, err := ParseSpec("t", []byte(tc.src))
		if err == nil || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("%s: %v, want an error with %q", name, err, tc.msg)
		}
	}
}
