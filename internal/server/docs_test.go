package server_test

import (
	"encoding/json"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestPackageDocsNameImports keeps the package docs true: where a
// package's doc says what it imports, every package of this module it
// imports is named there (as internal/x, or x); a package whose doc says
// nothing of its imports imports nothing of this module.
func TestPackageDocsNameImports(t *testing.T) {
	t.Parallel()
	const mod = "github.com/sheepfold/sheepfold/"
	out, err := exec.Command("go", "list", "-json", "../../api/...", "../../internal/...", "../../client/...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	dec := json.NewDecoder(strings.NewReader(string(out)))
	n := 0
	for dec.More() {
		var p struct {
			ImportPath, Dir         string
			Imports                 []string
			GoFiles, IgnoredGoFiles []string // every non-test file, whatever its build tags
		}
		if err := dec.Decode(&p); err != nil {
			t.Fatal(err)
		}
		if strings.Contains(p.ImportPath, "/envdpb/") {
			continue // generated
		}
		n++
		var doc string
		fset := token.NewFileSet()
		for _, name := range append(p.GoFiles, p.IgnoredGoFiles...) {
			f, err := parser.ParseFile(fset, filepath.Join(p.Dir, name), nil, parser.PackageClauseOnly|parser.ParseComments)
			if err != nil {
				t.Fatal(err)
			}
			if f.Doc != nil {
				doc += f.Doc.Text()
			}
		}
		if doc == "" {
			t.Errorf("%s has no package doc", p.ImportPath)
			continue
		}
		// The part of the doc that speaks of imports: from the first
		// "import" on.
		i := strings.Index(strings.ToLower(doc), "import")
		said := ""
		if i >= 0 {
			said = strings.Join(strings.Fields(doc[i:]), " ")
		}
		for _, imp := range p.Imports {
			rel, ok := strings.CutPrefix(imp, mod)
			if !ok {
				continue
			}
			if said == "" {
				t.Errorf("%s imports %s, and its doc says nothing of its imports", p.ImportPath, rel)
				continue
			}
			if !named(said, rel) {
				t.Errorf("%s imports %s, which its doc does not name: %q", p.ImportPath, rel, said)
			}
		}
	}
	if n < 20 {
		t.Fatalf("only %d packages listed", n)
	}
}

// named reports whether text names the package rel (internal/e2b/envdpb/x
// is named by internal/e2b/envdpb/x, x, or envdpb: the generated tree).
func named(text, rel string) bool {
	if mentions(text, rel) {
		return true
	}
	for _, el := range strings.Split(strings.TrimPrefix(rel, "internal/"), "/") {
		if mentions(text, el) {
			return true
		}
	}
	return false
}

// mentions reports whether text names pkg as a word.
func mentions(text, pkg string) bool {
	for i := 0; ; {
		j := strings.Index(text[i:], pkg)
		if j < 0 {
			return false
		}
		j += i
		before := j == 0 || !word(text[j-1])
		after := j+len(pkg) == len(text) || !word(text[j+len(pkg)])
		if before && after {
			return true
		}
		i = j + 1
	}
}

func word(c byte) bool {
	return c == '_' || c == '/' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9'
}

// TestPackageDocsNameFiles keeps the package docs' file names true: a
// file a package doc names (x.go, x_linux.go, x.py, x.sql) is the
// package's own, a path from the module's root, or a file of a package
// the doc names; a file renamed or removed leaves its doc stale.
func TestPackageDocsNameFiles(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", "list", "-json", "../../...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	type pkg struct {
		ImportPath, Dir, Root   string
		GoFiles, IgnoredGoFiles []string
	}
	var pkgs []pkg
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for dec.More() {
		var p pkg
		if err := dec.Decode(&p); err != nil {
			t.Fatal(err)
		}
		pkgs = append(pkgs, p)
	}
	const mod = "github.com/sheepfold/sheepfold/"
	n := 0
	for _, p := range pkgs {
		doc := packageDoc(t, p.Dir, append(p.GoFiles, p.IgnoredGoFiles...))
		for _, name := range fileNames(doc) {
			n++
			if exists(filepath.Join(p.Dir, name)) || exists(filepath.Join(p.Root, name)) {
				continue
			}
			found := false
			for _, q := range pkgs {
				rel := strings.TrimPrefix(q.ImportPath, mod)
				if named(doc, rel) && exists(filepath.Join(q.Dir, filepath.Base(name))) {
					found = true
					break
				}
			}
			if !found {
				t.Errorf("%s's doc names %s, which is neither its file nor one of a package it names", p.ImportPath, name)
			}
		}
	}
	if n < 50 {
		t.Fatalf("only %d file names found in the package docs", n)
	}
}

// packageDoc returns the package doc comments of a package's files.
func packageDoc(t *testing.T, dir string, files []string) string {
	t.Helper()
	var doc strings.Builder
	fset := token.NewFileSet()
	for _, name := range files {
		f, err := parser.ParseFile(fset, filepath.Join(dir, name), nil, parser.PackageClauseOnly|parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		if f.Doc != nil {
			doc.WriteString(f.Doc.Text())
		}
	}
	return doc.String()
}

// fileNames returns the source file names text mentions (a.go,
// internal/x/b_linux.go, c.py, d.sql), once each.
func fileNames(text string) []string {
	var names []string
	for _, m := range fileName.FindAllString(text, -1) {
		m = strings.TrimPrefix(m, "./")
		if strings.Contains(m, "NNNN") || m == "Node.js" {
			continue // a pattern of names; the runtime's name
		}
		if !slices.Contains(names, m) {
			names = append(names, m)
		}
	}
	return names
}

var fileName = regexp.MustCompile(`[A-Za-z0-9_./-]*[A-Za-z0-9_]\.(go|py|sql|sh|js|ts)\b`)

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}
