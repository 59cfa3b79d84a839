package typescript

import (
	"strings"
	"testing"
)

func TestTranspile(t *testing.T) {
	t.Parallel()
	js, err := Transpile("interface P { x: number }\nconst p: P = { x: 3 }\nawait Promise.resolve(p.x as number)")
	if err != nil || strings.Contains(js, "interface") || strings.Contains(js, ": P") || !strings.Contains(js, "await Promise.resolve(p.x)") {
		t.Fatalf("Transpile = %q, %+v", js, err)
	}
	_, err = Transpile("let x: = 1")
	if err == nil || err.Name != "SyntaxError" || !strings.Contains(err.Traceback, "<cell>:1:") {
		t.Fatalf("a cell that does not parse: %+v", err)
	}
}
