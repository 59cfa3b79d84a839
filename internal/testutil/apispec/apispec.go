// Package apispec checks Go types against the API's OpenAPI document
// (api/openapi.json), field for field: the document is the source of the
// wire vocabulary, and the Go types are held to it by their tests. The
// types the server and the Go SDK share live in package api and are
// checked once there (api/spec_test.go); the server's and its services'
// own wire types by internal/server/spec_internal_test.go, the Go SDK's
// own request encoders by client/spec_test.go (the Python SDK's models
// by sdk/python/tests/test_spec.py); CheckNotShared keeps those two from
// checking again a schema that api holds (Shared) without saying why. Package api's doc says why the
// document is the source rather than generated from Go types.
//
// Imports: api (the document and the types of Shared) and the standard
// library.
package apispec

import (
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/sheepfold/sheepfold/api"
)

// Entry is how one Go type reads its schema: its fields renamed on the
// wire (a Go field name or a JSON name, to the schema's name), its
// fields not on the wire and the schema's fields it leaves out, each
// with why.
type Entry struct {
	V any
	// Schema is "Name", or "Name.property[.property]" for an inline
	// object; "property[]" is the items of an array property.
	Schema     string
	Renamed    map[string]string
	Own        map[string]string
	Unmodelled map[string]string
}

// Check checks every entry's type against its schema: every wire field
// of the type is in the schema, and every field of the schema in the
// type, but for what the entry says.
func Check(t *testing.T, entries []Entry) {
	t.Helper()
	var spec struct {
		Components struct {
			Schemas map[string]any `json:"schemas"`
		} `json:"components"`
	}
	if err := json.Unmarshal(api.OpenAPI, &spec); err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		typ := reflect.TypeOf(e.V)
		t.Run(typ.Name(), func(t *testing.T) {
			path := strings.Split(e.Schema, ".")
			s, _ := spec.Components.Schemas[path[0]].(map[string]any)
			for _, p := range path[1:] {
				props, _ := s["properties"].(map[string]any)
				name, items := strings.CutSuffix(p, "[]")
				s, _ = props[name].(map[string]any)
				if items {
					s, _ = s["items"].(map[string]any)
				}
			}
			pm, ok := s["properties"].(map[string]any)
			if !ok {
				t.Fatalf("no object schema %s", e.Schema)
			}
			wire, untagged := jsonFields(typ)
			for _, f := range untagged {
				if w, ok := e.Renamed[f]; ok { // filled from the wire by hand
					wire[w] = true
					continue
				}
				if _, ok := e.Own[f]; !ok {
					t.Errorf("field %s is not on the wire and the entry does not say why", f)
				}
			}
			got := map[string]bool{}
			for name := range wire {
				if w, ok := e.Renamed[name]; ok {
					name = w
				}
				got[name] = true
				if _, ok := pm[name]; !ok {
					t.Errorf("field %q of %s is not in %s", name, typ.Name(), e.Schema)
				}
			}
			for p := range pm {
				if _, ok := e.Unmodelled[p]; !ok && !got[p] {
					t.Errorf("%s's field %q is not in %s", e.Schema, p, typ.Name())
				}
			}
			for p := range e.Unmodelled {
				if _, ok := pm[p]; !ok {
					t.Errorf("stale entry: %s has no field %q", e.Schema, p)
				}
			}
		})
	}
}

// jsonFields returns the wire names of t's fields (embedded structs
// flattened), and the Go names of its fields without one. A field
// untagged but for the JSON encoder's default is reported untagged: the
// wire's names are snake case.
func jsonFields(t reflect.Type) (wire map[string]bool, untagged []string) {
	wire = map[string]bool{}
	for f := range t.Fields() {
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		ft := f.Type
		if ft.Kind() == reflect.Pointer {
			ft = ft.Elem()
		}
		// An embedded struct's fields are promoted, exported or not.
		if f.Anonymous && name == "" && ft.Kind() == reflect.Struct {
			w, u := jsonFields(ft)
			for k := range w {
				wire[k] = true
			}
			untagged = append(untagged, u...)
			continue
		}
		if !f.IsExported() {
			continue
		}
		if name == "" || name == "-" {
			untagged = append(untagged, f.Name)
			continue
		}
		wire[name] = true
	}
	return wire, untagged
}

// CheckAllListed fails for every struct type declared in the non-test
// files of dir with a JSON tag that is neither in entries nor in
// exempt (by name, with why), so that a new wire type cannot skip
// Check.
func CheckAllListed(t *testing.T, dir string, entries []Entry, exempt map[string]string) {
	t.Helper()
	listed := map[string]bool{}
	for _, e := range entries {
		listed[reflect.TypeOf(e.V).Name()] = true
	}
	n := 0
	files := parseDir(t, dir, 0)
	for _, name := range slices.Sorted(maps.Keys(files)) {
		f := files[name]
		ast.Inspect(f, func(node ast.Node) bool {
			ts, ok := node.(*ast.TypeSpec)
			if !ok {
				return true
			}
			st, ok := ts.Type.(*ast.StructType)
			if !ok || !slices.ContainsFunc(st.Fields.List, func(fl *ast.Field) bool {
				return fl.Tag != nil && strings.Contains(fl.Tag.Value, `json:"`)
			}) {
				return true
			}
			n++
			if !listed[ts.Name.Name] && exempt[ts.Name.Name] == "" {
				t.Errorf("%s (%s) has JSON tags but is not checked against the OpenAPI document", ts.Name.Name, name)
			}
			return true
		})
	}
	if n == 0 {
		t.Fatalf("no struct with JSON tags in %s: the check is not looking at the package", dir)
	}
}

// CheckImports fails for every import of the non-test files of dir that
// is neither of the standard library nor in allowed: the wire
// vocabulary and the public Go SDK stay importable without the server
// or a third-party module.
func CheckImports(t *testing.T, dir string, allowed ...string) {
	t.Helper()
	n := 0
	files := parseDir(t, dir, parser.ImportsOnly)
	for _, name := range slices.Sorted(maps.Keys(files)) {
		for _, imp := range files[name].Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			n++
			if first, _, _ := strings.Cut(p, "/"); strings.Contains(first, ".") && !slices.Contains(allowed, p) {
				t.Errorf("%s imports %s: only the standard library and %v may be", name, p, allowed)
			}
		}
	}
	if n == 0 {
		t.Fatalf("no imports found in %s: the check is not looking at the package", dir)
	}
}

// parseDir parses the non-test Go files of dir, by name.
func parseDir(t *testing.T, dir string, mode parser.Mode) map[string]*ast.File {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]*ast.File{}
	for _, de := range entries {
		if !strings.HasSuffix(de.Name(), ".go") || strings.HasSuffix(de.Name(), "_test.go") {
			continue
		}
		f, err := parser.ParseFile(token.NewFileSet(), filepath.Join(dir, de.Name()), nil, mode)
		if err != nil {
			t.Fatal(err)
		}
		files[de.Name()] = f
	}
	return files
}

// CheckNotShared fails for every entry whose schema a type of package
// api holds (Shared) unless twice says why it is still declared here
// too, and for every schema in twice that no entry checks or api does
// not hold: a type the server or the SDK could take from api is not
// written again.
func CheckNotShared(t *testing.T, entries []Entry, twice map[string]string) {
	t.Helper()
	shared := map[string]bool{}
	for _, e := range Shared {
		shared[e.Schema] = true
	}
	checked := map[string]bool{}
	for _, e := range entries {
		checked[e.Schema] = true
		if shared[e.Schema] && twice[e.Schema] == "" {
			t.Errorf("%s is checked against %s, which api holds: use the api type", reflect.TypeOf(e.V).Name(), e.Schema)
		}
	}
	for s := range twice {
		if !shared[s] || !checked[s] {
			t.Errorf("stale entry: %s is not both api's and checked here", s)
		}
	}
}
