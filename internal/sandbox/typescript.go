package sandbox

import (
	"context"
	"strconv"
	"strings"

	"github.com/evanw/esbuild/pkg/api"

	"github.com/sheepfold/sheepfold/internal/agentproto"
	"github.com/sheepfold/sheepfold/internal/kernel"
)

// TypeScript cells are transpiled here, on the host, rather than in the
// agent: esbuild would add about 5 MB and 4 ms of start-up to every
// sandbox's agent. A typescript context's kernel runs the result on Node.

// isTypeScript reports whether a language name means TypeScript.
func isTypeScript(lang string) bool {
	c, err := kernel.Canonical(lang)
	return err == nil && c == "typescript"
}

// transpileTS turns a TypeScript cell into JavaScript for the Node driver:
// types are erased, nothing is bundled or lowered, so top-level await and
// the last expression's value survive. A cell that does not parse is an
// error in the shape of the one Node would raise.
func transpileTS(code string) (string, *agentproto.ExecError) {
	res := api.Transform(code, api.TransformOptions{
		Loader: api.LoaderTS, Target: api.ESNext, Sourcefile: "<cell>",
		TsconfigRaw: `{"compilerOptions":{"verbatimModuleSyntax":false,"preserveValueImports":false}}`,
	})
	if len(res.Errors) == 0 {
		return string(res.Code), nil
	}
	var lines []string
	for _, m := range res.Errors {
		s := m.Text
		if m.Location != nil {
			s = m.Location.File + ":" + strconv.Itoa(m.Location.Line) + ":" + strconv.Itoa(m.Location.Column+1) + ": " + s
			if m.Location.LineText != "" {
				s += "\n    " + m.Location.LineText
			}
		}
		lines = append(lines, s)
	}
	return "", &agentproto.ExecError{Name: "SyntaxError", Value: res.Errors[0].Text, Traceback: strings.Join(lines, "\n")}
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
