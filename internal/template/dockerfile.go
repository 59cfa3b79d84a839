package template

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/moby/buildkit/frontend/dockerfile/instructions"
	"github.com/moby/buildkit/frontend/dockerfile/parser"
)

// Labels of a Dockerfile that Sheepfold reads (see Dockerfile).
const (
	// LabelStart is the command a sandbox of the template starts with
	// (run by sh -c as the template's user, in its working directory).
	LabelStart = "sheepfold.start"
	// LabelReady is the ready check: a TCP port ("port:5173") or a
	// command ("cmd:curl -sf localhost:8080"), polled until it succeeds.
	LabelReady = "sheepfold.ready"
	// LabelRoot is the template's project directory: the file API
	// resolves an absolute path whose first component is not in the
	// root filesystem ("/src/App.tsx") under it, as CodeSandbox resolves
	// a project's paths.
	LabelRoot = "sheepfold.root"
)

// ErrDockerfile: the Dockerfile does not parse, or uses what Sheepfold does
// not build. Its message names the line.
var ErrDockerfile = errors.New("bad Dockerfile")

// Dockerfile is a parsed Dockerfile: one stage, from a template or an
// image, and its instructions.
type Dockerfile struct {
	From     string // as written (build args expanded at build time)
	FromLine int
	MetaArgs []instructions.ArgCommand // ARGs before FROM
	Steps    []Step
}

// Step is one instruction after FROM.
type Step struct {
	Line int    // 1-based line of the instruction's start
	Text string // the instruction as written, continuation lines joined
	cmd  instructions.Command
}

// ParseDockerfile parses a Dockerfile with BuildKit's parser (the one
// `docker build` uses) and checks that it uses only what BuildDockerfile
// builds: one FROM, then RUN (no --mount, --network or --security flags),
// COPY and ADD from the build context (no --from, no URLs, no git),
// ENV, ARG, WORKDIR, USER, LABEL and the ignored MAINTAINER, EXPOSE,
// STOPSIGNAL. Every error wraps ErrDockerfile and names the line.
func ParseDockerfile(r io.Reader) (*Dockerfile, error) {
	res, err := parser.Parse(r)
	if err != nil {
		return nil, fmt.Errorf("%w: %s", ErrDockerfile, lineError(err))
	}
	df := &Dockerfile{}
	for _, n := range res.AST.Children {
		bad := func(format string, a ...any) error {
			return fmt.Errorf("%w: line %d: %s", ErrDockerfile, n.StartLine, fmt.Sprintf(format, a...))
		}
		v, err := instructions.ParseInstruction(n)
		if err != nil {
			var le *parser.LocationError
			if errors.As(err, &le) {
				err = le.Unwrap()
			}
			return nil, bad("%v", err)
		}
		if st, ok := v.(*instructions.Stage); ok {
			if df.From != "" {
				return nil, bad("a second FROM: multi-stage builds are not supported")
			}
			if st.Platform != "" {
				return nil, bad("FROM --platform is not supported")
			}
			if st.Name != "" {
				return nil, bad("FROM ... AS is not supported (one stage only)")
			}
			df.From, df.FromLine = st.BaseName, n.StartLine
			continue
		}
		if df.From == "" {
			if a, ok := v.(*instructions.ArgCommand); ok {
				df.MetaArgs = append(df.MetaArgs, *a)
				continue
			}
			return nil, bad("%s before FROM", strings.ToUpper(n.Value))
		}
		cmd, ok := v.(instructions.Command)
		if !ok {
			return nil, bad("%T is not an instruction", v)
		}
		if err := supported(cmd); err != nil {
			return nil, bad("%v", err)
		}
		df.Steps = append(df.Steps, Step{Line: n.StartLine, Text: n.Original, cmd: cmd})
	}
	if df.From == "" {
		return nil, fmt.Errorf("%w: no FROM", ErrDockerfile)
	}
	return df, nil
}

// lineError is err's message, prefixed with "line N: " when BuildKit's
// error carries its location apart from the text.
func lineError(err error) string {
	var le *parser.LocationError
	if errors.As(err, &le) && len(le.Locations) > 0 && len(le.Locations[0]) > 0 {
		return fmt.Sprintf("line %d: %v", le.Locations[0][0].Start.Line, le.Unwrap())
	}
	return err.Error()
}

// supported refuses the instructions and flags BuildDockerfile does not
// build.
func supported(cmd instructions.Command) error {
	switch c := cmd.(type) {
	case *instructions.RunCommand:
		if len(c.FlagsUsed) > 0 {
			return fmt.Errorf("RUN --%s is not supported", c.FlagsUsed[0])
		}
		if len(c.CmdLine) == 0 || strings.TrimSpace(strings.Join(c.CmdLine, "")) == "" {
			return errors.New("RUN needs a command")
		}
		if len(c.Files) > 0 {
			return errors.New("RUN with a here-document is not supported")
		}
	case *instructions.CopyCommand:
		if c.From != "" {
			return errors.New("COPY --from is not supported (one stage only)")
		}
		if c.Link || c.Parents || len(c.ExcludePatterns) > 0 {
			return errors.New("COPY --link, --parents and --exclude are not supported")
		}
		if len(c.SourceContents) > 0 {
			return errors.New("COPY with a here-document is not supported")
		}
	case *instructions.AddCommand:
		if c.Checksum != "" || c.KeepGitDir != nil || c.Link || len(c.ExcludePatterns) > 0 || c.Unpack != nil {
			return errors.New("ADD --checksum, --keep-git-dir, --link, --exclude and --unpack are not supported")
		}
		if len(c.SourceContents) > 0 {
			return errors.New("ADD with a here-document is not supported")
		}
		for _, s := range c.SourcePaths {
			if strings.Contains(s, "://") || strings.HasPrefix(s, "git@") {
				return fmt.Errorf("ADD %s: only files of the build context can be added (no URLs)", s)
			}
		}
	case *instructions.EnvCommand, *instructions.ArgCommand, *instructions.WorkdirCommand,
		*instructions.UserCommand, *instructions.LabelCommand, *instructions.MaintainerCommand,
		*instructions.ExposeCommand, *instructions.StopSignalCommand:
	case *instructions.CmdCommand, *instructions.EntrypointCommand:
		return fmt.Errorf("%s is not supported: sandboxes start Sheepfold's agent; use LABEL %s=\"command\" for a command to start with",
			strings.ToUpper(c.Name()), LabelStart)
	case *instructions.HealthCheckCommand:
		return fmt.Errorf("HEALTHCHECK is not supported: use LABEL %s=\"port:N\" or \"cmd:COMMAND\"", LabelReady)
	default:
		return fmt.Errorf("%s is not supported", strings.ToUpper(cmd.Name()))
	}
	return nil
}

// DockerfileOptions configure BuildDockerfile.
type DockerfileOptions struct {
	DataDir string // required
	Name    string // the template to build (replaced if it exists)
	// Context is the build context directory COPY and ADD read from; ""
	// has none (COPY fails). Nothing outside it is read: a source path
	// with .. or a symbolic link that leaves it is refused.
	Context   string
	BuildArgs map[string]string // values of ARGs (--build-arg)
	// UIDShift must be the FROM template's (the runtime's mapping).
	UIDShift uint32
	// Runner runs RUN steps; nil fails a Dockerfile with RUN.
	Runner StepRunner
	// Registries are those a FROM HOST/REPO:TAG may pull from; none
	// refuses every such FROM (ErrRegistryNotAllowed).
	Registries Registries
	// NoCache builds every layer anew (and replaces the cached ones).
	NoCache bool
	// Progress: as BuildOptions.Progress, one unit per step.
	Progress func(step string, done, total int)
	// Log, if set, receives the build's log (also kept in the data dir:
	// BuildLog).
	Log io.Writer
}

// StepRunner runs one RUN step: in a sandbox whose root is RootFS (an
// overlay of the half-built template, owned by host ids shifted by
// UIDShift, which it must map to the sandbox's 0..65535), and returns when
// every process it started has ended. Output goes to out. A non-zero exit
// is an error.
type StepRunner interface {
	RunStep(ctx context.Context, s RunStep, out io.Writer) error
}

// RunStep is one RUN for a StepRunner.
type RunStep struct {
	RootFS   string
	Args     []string
	Env      []string
	Cwd      string
	UID, GID uint32 // in the sandbox
	UIDShift uint32
}

// Layout of the data dir used by Dockerfile builds.
const (
	layersDir = ".layers" // <templates>/.layers/<key>/diff
	logsDir   = ".logs"   // <templates>/.logs/<name>.log
	diffDir   = "diff"
)

// defaultPath is RUN's PATH when neither the FROM template nor an ENV sets
// one.
const defaultPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

func buildLogPath(dataDir, name string) string {
	return filepath.Join(templatesDir(dataDir), logsDir, name+".log")
}

// BuildLog returns the log of the last Dockerfile build of template name
// (finished or failed), or an error wrapping fs.ErrNotExist.
func BuildLog(dataDir, name string) ([]byte, error) {
	if err := validName(name); err != nil {
		return nil, err
	}
	return os.ReadFile(buildLogPath(dataDir, name))
}
