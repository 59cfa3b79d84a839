// Package lang is the one table of the languages code contexts speak:
// their canonical names and the aliases callers may use. The host (the
// engine, the server's executions and the ask's fence tags, the E2B
// surface, the CLI's run) and the agent (its kernels, its default
// context) all import it, so that a name means the same everywhere; no
// other table of language names is kept.
//
// Imports: the standard library only.
package lang

import (
	"errors"
	"fmt"
	"strings"
)

// The canonical languages.
const (
	Python     = "python"
	JavaScript = "javascript"
	TypeScript = "typescript" // run by the JavaScript kernel; the host transpiles cells
	Bash       = "bash"
	R          = "r"    // R (Debian's r-base-core), in templates that carry it
	Java       = "java" // jshell's engine in one JVM (Debian's default JDK), in templates that carry it
)

// ErrUnsupported reports an unknown language.
var ErrUnsupported = errors.New("unsupported language")

// All lists the canonical names, the default (Python) first.
func All() []string { return []string{Python, JavaScript, TypeScript, Bash, R, Java} }

// Canonical maps a language name or alias (any case; "" is Python) to its
// canonical name.
func Canonical(name string) (string, error) {
	switch strings.ToLower(strings.TrimSpace(name)) {
	case "", "python", "py", "python3":
		return Python, nil
	case "javascript", "js", "node", "nodejs":
		return JavaScript, nil
	case "typescript", "ts":
		return TypeScript, nil
	case "bash", "sh", "shell":
		return Bash, nil
	case "r":
		return R, nil
	case "java", "jshell":
		return Java, nil
	}
	return "", fmt.Errorf("%w: %q (supported: python, javascript, typescript, bash, r, java)", ErrUnsupported, name)
}
