package kernel

import (
	"strings"
	"testing"
)

func TestTypeScript(t *testing.T) {
	t.Parallel()
	k := start(t, "ts", nil)
	if k.Language() != "typescript" {
		t.Fatalf("language %q", k.Language())
	}
	r := run(t, k, code("interface P { x: number }\nfunction sub(a: number, b: number): number {\n  return a - b\n}\nconst p: P = { x: 3 }\nsub(p.x, 4)"))
	if r.err != nil || main(r) != "-1" {
		t.Fatalf("typed cell: %q %+v", main(r), r.err)
	}
	// State persists; top-level await works after transpiling.
	if r = run(t, k, code("const q = await Promise.resolve<number>(p.x * 2)\nq as number")); r.err != nil || main(r) != "6" {
		t.Fatalf("await cell: %q %+v", main(r), r.err)
	}
	r = run(t, k, code("let x: number = = 1"))
	if r.err == nil || r.err.Name != "SyntaxError" || !strings.Contains(r.err.Traceback, "<cell>:1:") {
		t.Fatalf("syntax error: %+v", r.err)
	}
	// A type error is not a runtime error: types are erased, as by tsc's
	// transpile-only mode.
	if r = run(t, k, code("const s: string = 5 as any\ns")); r.err != nil || main(r) != "5" {
		t.Fatalf("erased types: %q %+v", main(r), r.err)
	}
}
