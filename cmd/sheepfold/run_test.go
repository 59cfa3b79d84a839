package main

import (
	"testing"

	"github.com/sheepfold/sheepfold/internal/lang"
)

// TestInterpreterFor: run's --lang takes internal/lang's names and
// aliases (any case) for the languages it has an interpreter for, and
// refuses the others with the same message.
func TestInterpreterFor(t *testing.T) {
	for name, want := range map[string]string{
		"python": "/usr/bin/python3", "py": "/usr/bin/python3", "Python3": "/usr/bin/python3",
		"javascript": "/usr/bin/node", "node": "/usr/bin/node", "nodejs": "/usr/bin/node", "JS": "/usr/bin/node",
		"bash": "/bin/bash", "sh": "/bin/bash", "shell": "/bin/bash",
		"r": "/usr/bin/Rscript", "R": "/usr/bin/Rscript", "java": "/usr/bin/java", "jshell": "/usr/bin/java",
	} {
		if got, err := interpreterFor(name); err != nil || got.cmd != want {
			t.Errorf("interpreterFor(%q) = %+v, %v; want %s", name, got, err, want)
		}
	}
	for _, name := range []string{"typescript", "ts", "cobol"} {
		if _, err := interpreterFor(name); err == nil || err.Error() != `unknown language "`+name+`": want python, javascript, bash, r or java` {
			t.Errorf("interpreterFor(%q) = %v", name, err)
		}
	}
	for _, l := range lang.All() {
		if _, ok := interpreters[l]; !ok && l != lang.TypeScript {
			t.Errorf("no interpreter for %s", l)
		}
	}
}
