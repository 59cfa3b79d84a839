// Package typescript transpiles TypeScript cells to JavaScript for the
// Node kernel. It runs on the host, not in the agent: esbuild would add
// about 5 MB and 4 ms of start-up to every sandbox's agent.
//
// Imports: esbuild, agentproto and the standard library.
package typescript

import (
	"strconv"
	"strings"

	"github.com/evanw/esbuild/pkg/api"

	"github.com/sheepfold/sheepfold/internal/agentproto"
)

// Transpile turns a TypeScript cell into JavaScript for the Node driver:
// types are erased, nothing is bundled or lowered, so top-level await and
// the last expression's value survive. A cell that does not parse is an
// error in the shape of the one Node would raise.
func Transpile(code string) (string, *agentproto.ExecError) {
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
