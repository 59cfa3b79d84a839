package lang

import (
	"errors"
	"testing"
)

func TestCanonical(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"": Python, "py": Python, " Python3 ": Python, "JS": JavaScript, "node": JavaScript, "nodejs": JavaScript,
		"ts": TypeScript, "TypeScript": TypeScript, "sh": Bash, "shell": Bash, "bash": Bash,
		"r": R, " R ": R, "java": Java, "Java": Java, "jshell": Java,
	} {
		if got, err := Canonical(in); err != nil || got != want {
			t.Errorf("Canonical(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"cobol", "rust", "python2", "javascript2", "kotlin"} {
		if _, err := Canonical(in); !errors.Is(err, ErrUnsupported) {
			t.Errorf("Canonical(%q) = %v, want ErrUnsupported", in, err)
		}
	}
	for _, name := range All() {
		if got, err := Canonical(name); err != nil || got != name {
			t.Errorf("canonical name %q maps to %q, %v", name, got, err)
		}
	}
}
