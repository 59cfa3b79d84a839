package sandbox

import (
	"context"

	"github.com/sheepfold/sheepfold/internal/lang"
)

// isTypeScript reports whether a language name means TypeScript, whose
// cells are transpiled on the host (internal/typescript) and run by the
// Node kernel.
func isTypeScript(name string) bool {
	c, err := lang.Canonical(name)
	return err == nil && c == lang.TypeScript
}

// contextLanguage returns the language of a context of the sandbox, from
// what the sandbox has seen of its contexts, else by asking the agent.
func (s *Sandbox) contextLanguage(ctx context.Context, id string) string {
	if lang, ok := s.ctxLangs.Load(id); ok {
		return lang.(string)
	}
	if _, err := s.Contexts(ctx); err != nil {
		return ""
	}
	if lang, ok := s.ctxLangs.Load(id); ok {
		return lang.(string)
	}
	return ""
}
