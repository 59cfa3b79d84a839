package session

import "testing"

// TestFencedCode: a reply's fence tags are read with internal/lang's
// table (names, aliases, any case; no tag is Python), limited to the
// languages an ask runs; the first runnable block's language wins and its
// blocks are joined.
func TestFencedCode(t *testing.T) {
	t.Parallel()
	f := func(tag, code string) string { return "```" + tag + "\n" + code + "```\n" }
	for _, tc := range []struct {
		name, text, code, lang string
		ok                     bool
	}{
		{"no tag", f("", "1+1\n"), "1+1\n", "python", true},
		{"alias", f("py", "x\n"), "x\n", "python", true},
		{"node alias", f("nodejs", "console.log(1)\n"), "console.log(1)\n", "javascript", true},
		{"any case", f("SH", "echo\n"), "echo\n", "bash", true},
		{"first language wins", f("js", "a\n") + f("python", "b\n") + f("node", "c\n"), "a\n\nc\n", "javascript", true},
		{"not an ask language", f("ts", "let x: number = 1\n"), "", "", false},
		{"unknown", f("cobol", "DISPLAY 'X'.\n"), "", "", false},
		{"no fence", "just words", "", "", false},
	} {
		code, lang, ok := fencedCode(tc.text)
		if code != tc.code || lang != tc.lang || ok != tc.ok {
			t.Errorf("%s: fencedCode = %q, %q, %v; want %q, %q, %v", tc.name, code, lang, ok, tc.code, tc.lang, tc.ok)
		}
	}
}
