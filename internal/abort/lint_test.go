package abort_test

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

const module = "github.com/sheepfold/sheepfold/"

// allowedAbortPanic is the one place of the server's own code where
// panic(http.ErrAbortHandler) may be raised: abort.Handler, on a net/http
// server's goroutine.
const allowedAbortPanic = module + "internal/abort.Handler"

// scriptedServers are packages that are servers of their own for tests
// and the bench (an httptest.Server each, whose goroutines net/http
// recovers), breaking their connections on purpose: outside the server.
var scriptedServers = map[string]bool{module + "internal/llm/llmtest": true}

// TestNoRepanic walks the source of every package of the module the two
// binaries are built from and refuses what can stop the server from a
// goroutine no net/http server recovers: raising again a value recover()
// returned (or anything made of it), and panic(http.ErrAbortHandler)
// anywhere but abort.Handler. Handlers cut responses with abort.Response.
func TestNoRepanic(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-f",
		`{{if not .Standard}}{{.ImportPath}}|{{.Dir}}|{{join .GoFiles ","}},{{join .IgnoredGoFiles ","}}{{end}}`,
		module+"cmd/sheepfold", module+"cmd/sheepfold-agent").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	pkgs, files := 0, 0
	for line := range strings.Lines(string(out)) {
		path, rest, _ := strings.Cut(strings.TrimSpace(line), "|")
		if !strings.HasPrefix(path, module) {
			continue
		}
		dir, names, _ := strings.Cut(rest, "|")
		pkgs++
		for name := range strings.SplitSeq(names, ",") {
			if name == "" {
				continue
			}
			files++
			for _, p := range checkFile(t, path, filepath.Join(dir, name), nil) {
				t.Error(p)
			}
		}
	}
	if pkgs < 20 || files < 100 {
		t.Fatalf("walked %d packages, %d files: the listing is not the module's", pkgs, files)
	}
}

// TestNoRepanicCatches is the checker's control: each of these is
// reported, and the allowed place is not.
func TestNoRepanicCatches(t *testing.T) {
	t.Parallel()
	src := `package x

import (
	"fmt"
	nh "net/http"
)

func a() {
	defer func() {
		if p := recover(); p != nil {
			panic(p) // 1
		}
	}()
}

func b() {
	defer func() {
		v := recover()
		if v == nil {
			return
		}
		panic(fmt.Sprint("again: ", v)) // 2
	}()
}

func c() { defer func() { panic(recover()) }() } // 3

func d() { panic(nh.ErrAbortHandler) } // 4

func e() {
	defer func() {
		switch v := recover().(type) {
		case error:
			panic(v) // 5
		}
	}()
}

func fine() {
	defer func() {
		if p := recover(); p != nil {
			fmt.Println(p)
		}
	}()
	p := "not recovered"
	panic(p)
}
`
	got := checkFile(t, "example.com/x", "x.go", []byte(src))
	if len(got) != 5 {
		t.Fatalf("found %d, want 5:\n%s", len(got), strings.Join(got, "\n"))
	}
	for i, p := range got {
		if !strings.HasPrefix(p, fmt.Sprintf("x.go:%d:", lineOf(src, "// "+strconv.Itoa(i+1)))) {
			t.Errorf("finding %d is not where it should be: %s", i+1, p)
		}
	}
	allowed := `package abort

import "net/http"

func Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { panic(http.ErrAbortHandler) })
}
`
	if got := checkFile(t, module+"internal/abort", "abort.go", []byte(allowed)); len(got) != 0 {
		t.Fatalf("the allowed place was reported: %v", got)
	}
}

func lineOf(src, marker string) int {
	i := strings.Index(src, marker)
	return strings.Count(src[:i], "\n") + 1
}

// checkFile returns the findings in one file of package pkg (src nil:
// read it from path).
func checkFile(t *testing.T, pkg, path string, src []byte) []string {
	t.Helper()
	fset := token.NewFileSet()
	var s any
	if src != nil {
		s = src
	}
	f, err := parser.ParseFile(fset, path, s, parser.SkipObjectResolution)
	if err != nil {
		t.Fatal(err)
	}
	httpName := ""
	for _, im := range f.Imports {
		if p, _ := strconv.Unquote(im.Path.Value); p == "net/http" {
			httpName = "http"
			if im.Name != nil {
				httpName = im.Name.Name
			}
		}
	}
	var found []string
	report := func(n ast.Node, what string) {
		found = append(found, fmt.Sprintf("%s: %s", fset.Position(n.Pos()), what))
	}
	for _, d := range f.Decls {
		fd, ok := d.(*ast.FuncDecl)
		if !ok || fd.Body == nil {
			continue
		}
		name := pkg + "." + fd.Name.Name
		// Names bound to recover()'s value, per enclosing function
		// literal or declaration (a name is only looked for within the
		// function that bound it, and the functions it encloses).
		var recovered []map[string]bool
		var walk func(n ast.Node) bool
		walk = func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.FuncLit:
				recovered = append(recovered, map[string]bool{})
				ast.Inspect(n.Body, walk)
				recovered = recovered[:len(recovered)-1]
				return false
			case *ast.AssignStmt:
				for i, rhs := range n.Rhs {
					if i < len(n.Lhs) && isRecover(rhs) {
						if id, ok := n.Lhs[i].(*ast.Ident); ok {
							recovered[len(recovered)-1][id.Name] = true
						}
					}
				}
			case *ast.TypeSwitchStmt:
				if as, ok := n.Assign.(*ast.AssignStmt); ok && len(as.Lhs) == 1 && len(as.Rhs) == 1 {
					if ta, ok := as.Rhs[0].(*ast.TypeAssertExpr); ok && isRecover(ta.X) {
						recovered[len(recovered)-1][as.Lhs[0].(*ast.Ident).Name] = true
					}
				}
			case *ast.CallExpr:
				if id, ok := n.Fun.(*ast.Ident); !ok || id.Name != "panic" || len(n.Args) != 1 {
					return true
				}
				arg := n.Args[0]
				if sel, ok := arg.(*ast.SelectorExpr); ok && httpName != "" && sel.Sel.Name == "ErrAbortHandler" {
					if x, ok := sel.X.(*ast.Ident); ok && x.Name == httpName && name != allowedAbortPanic && !scriptedServers[pkg] {
						report(n, "panic(http.ErrAbortHandler) outside abort.Handler: cut the response with abort.Response")
					}
				}
				if usesRecovered(arg, recovered) {
					report(n, "a recovered value is raised again: handle it where it was recovered")
				}
			}
			return true
		}
		recovered = append(recovered, map[string]bool{})
		ast.Inspect(fd.Body, walk)
	}
	return found
}

// isRecover reports whether e is a call of the built-in recover.
func isRecover(e ast.Expr) bool {
	c, ok := e.(*ast.CallExpr)
	if !ok {
		return false
	}
	id, ok := c.Fun.(*ast.Ident)
	return ok && id.Name == "recover" && len(c.Args) == 0
}

// usesRecovered reports whether e calls recover or names a value bound to
// it in an enclosing function.
func usesRecovered(e ast.Expr, recovered []map[string]bool) bool {
	uses := false
	ast.Inspect(e, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.CallExpr:
			if isRecover(n) {
				uses = true
			}
		case *ast.Ident:
			for _, m := range recovered {
				if m[n.Name] {
					uses = true
				}
			}
		}
		return !uses
	})
	return uses
}
