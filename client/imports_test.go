package client

import (
	"go/parser"
	"go/token"
	"os"
	"strconv"
	"strings"
	"testing"
)

// TestImportsStdlibOnly keeps the SDK free of Sheepfold internals and of
// third-party modules: it imports the standard library and the API's
// types (api, itself of the standard library only: its own test).
func TestImportsStdlibOnly(t *testing.T) {
	entries, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".go") || strings.HasSuffix(e.Name(), "_test.go") {
			continue
		}
		f, err := parser.ParseFile(token.NewFileSet(), e.Name(), nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range f.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			n++
			if p == "github.com/sheepfold/sheepfold/api" {
				continue
			}
			if first, _, _ := strings.Cut(p, "/"); strings.Contains(first, ".") {
				t.Errorf("%s imports %s: the SDK may import only the standard library and api", e.Name(), p)
			}
		}
	}
	if n == 0 {
		t.Fatal("no imports found: the test is not looking at the package")
	}
}
