package template

import (
	"bytes"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"strings"

	"github.com/moby/buildkit/frontend/dockerfile/instructions"
	"github.com/moby/buildkit/frontend/dockerfile/parser"
	"github.com/moby/buildkit/frontend/dockerfile/shell"
)

// The builtin templates are declared in builtin/NAME.Dockerfile, one
// readable place each (see builtin/python.Dockerfile for the format).

//go:embed builtin/*.Dockerfile
var builtinSpecs embed.FS

// builtinFS is where Builtin reads the specs (tests swap it).
var builtinFS fs.FS = builtinSpecs

// builtinNamesInOrder are the builtin templates, python first.
var builtinNamesInOrder = []string{"python"}

// ParseSpec reads a builtin template's spec: FROM debian:SUITE, RUN
// apt-get install -y --no-install-recommends PACKAGE..., and LABEL
// sheepfold.description; anything else is an error naming its line.
func ParseSpec(name string, src []byte) (Definition, error) {
	res, err := parser.Parse(bytes.NewReader(src))
	if err != nil {
		return Definition{}, fmt.Errorf("template %s spec: %s", name, lineError(err))
	}
	d := Definition{Name: name}
	for _, n := range res.AST.Children {
		bad := func(format string, a ...any) error {
			return fmt.Errorf("template %s spec: line %d: %s", name, n.StartLine, fmt.Sprintf(format, a...))
		}
		v, err := instructions.ParseInstruction(n)
		if err != nil {
			return Definition{}, bad("%v", err)
		}
		switch c := v.(type) {
		case *instructions.Stage:
			suite, ok := strings.CutPrefix(c.BaseName, "debian:")
			if d.Suite != "" || !ok || c.Name != "" || c.Platform != "" {
				return Definition{}, bad("want one FROM debian:SUITE")
			}
			d.Suite = suite
		case *instructions.LabelCommand:
			lex := shell.NewLex('\\')
			if err := c.Expand(func(w string) (string, error) {
				out, _, err := lex.ProcessWord(w, shell.EnvsFromSlice(nil))
				return out, err
			}); err != nil {
				return Definition{}, bad("%v", err)
			}
			for _, kv := range c.Labels {
				if kv.Key != "sheepfold.description" {
					return Definition{}, bad("LABEL %s: only sheepfold.description", kv.Key)
				}
				d.Description = kv.Value
			}
		case *instructions.RunCommand:
			if d.Suite == "" {
				return Definition{}, bad("RUN before FROM")
			}
			words := strings.Fields(strings.Join(c.CmdLine, " "))
			if len(c.FlagsUsed) > 0 || !c.PrependShell || len(words) < 3 || words[0] != "apt-get" || words[1] != "install" {
				return Definition{}, bad("want RUN apt-get install -y --no-install-recommends PACKAGE...")
			}
			for _, w := range words[2:] {
				switch {
				case w == "-y" || w == "--no-install-recommends":
				case strings.HasPrefix(w, "-"):
					return Definition{}, bad("apt-get install %s: only -y and --no-install-recommends (debootstrap installs no recommends)", w)
				default:
					d.Packages = append(d.Packages, w)
				}
			}
		default:
			return Definition{}, bad("%s: only FROM, RUN apt-get install and LABEL", strings.ToUpper(n.Value))
		}
	}
	if d.Suite == "" {
		return Definition{}, fmt.Errorf("template %s spec: no FROM debian:SUITE", name)
	}
	if err := d.validate(); err != nil {
		return Definition{}, err
	}
	return d, nil
}

// builtinDefinitions parses the embedded specs.
func builtinDefinitions() ([]Definition, error) {
	var defs []Definition
	for _, name := range builtinNamesInOrder {
		src, err := fs.ReadFile(builtinFS, "builtin/"+name+".Dockerfile")
		if err != nil {
			return nil, err
		}
		d, err := ParseSpec(name, src)
		if err != nil {
			return nil, err
		}
		defs = append(defs, d)
	}
	if len(defs) == 0 {
		return nil, errors.New("no builtin template")
	}
	return defs, nil
}
