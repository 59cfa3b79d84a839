package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/sheepfold/sheepfold/internal/agentproto"
	"github.com/sheepfold/sheepfold/internal/apierr"
	"github.com/sheepfold/sheepfold/internal/config"
	"github.com/sheepfold/sheepfold/internal/lang"
	"github.com/sheepfold/sheepfold/internal/runtime"
	"github.com/sheepfold/sheepfold/internal/sandbox"
)

// interpreter runs a program file as a script.
type interpreter struct{ file, cmd string }

// interpreters are run's, by canonical language.
var interpreters = map[string]interpreter{
	lang.Python:     {"/tmp/main.py", "/usr/bin/python3"},
	lang.JavaScript: {"/tmp/main.js", "/usr/bin/node"},
	lang.Bash:       {"/tmp/main.sh", "/bin/bash"},
	lang.R:          {"/tmp/main.R", "/usr/bin/Rscript"},
	lang.Java:       {"/tmp/Main.java", "/usr/bin/java"}, // the launcher's source-file mode: the file's first class runs
}

// interpreterFor returns the interpreter of a language name or alias
// (internal/lang's table).
func interpreterFor(name string) (interpreter, error) {
	canon, err := lang.Canonical(name)
	interp, ok := interpreters[canon]
	if err != nil || !ok {
		return interpreter{}, fmt.Errorf("unknown language %q: want python, javascript, bash, r or java", name)
	}
	return interp, nil
}

func runCmd(cfg *config.Config, logger func() *slog.Logger) *cobra.Command {
	var (
		language, tmpl, memory, disk string
		timeout                      time.Duration
		cpus                         float64
		pids                         int64
		stats                        bool
	)
	cmd := &cobra.Command{
		Use:   "run [FILE|-]",
		Short: "Run a program in a fresh sandbox and print its output",
		Long: `Run a program in a fresh sandbox, stream its output, and exit with its
exit status (124 when it times out, 137 when it runs out of memory).
The program is read from FILE, or from standard input when FILE is - or absent.

  echo 'print(6*7)' | sheepfold run --lang python -`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			interp, err := interpreterFor(language)
			if err != nil {
				return err
			}
			code, err := readProgram(args)
			if err != nil {
				return err
			}
			var limits runtime.Limits
			if limits.MemoryBytes, err = config.ParseSize(memory); err != nil {
				return err
			}
			if limits.DiskBytes, err = config.ParseSize(disk); err != nil {
				return err
			}
			limits.CPUs, limits.Pids = cpus, pids
			if err := cfg.Resolve(); err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			eng, err := openEngine(ctx, *cfg, fmt.Sprintf("cli-%d", os.Getpid()), 0, logger())
			if err != nil {
				return err
			}
			defer eng.Close(context.Background())

			sb, err := eng.Create(ctx, sandbox.CreateOptions{Template: tmpl, Limits: limits, Timeout: timeout + time.Minute,
				Names: sandbox.FieldNames{CPUs: "--cpus", Memory: "--memory", Disk: "--disk", Pids: "--pids", Timeout: "--timeout"}})
			if err != nil {
				return err
			}
			if _, err := sb.WriteFile(ctx, interp.file, strings.NewReader(code), 0o644, 0); err != nil {
				return err
			}
			res, err := sb.Run(ctx, sandbox.ProcessSpec{
				Cmd: interp.cmd, Args: []string{interp.file},
				TimeoutMS: timeout.Milliseconds(), MaxOutputBytes: sandbox.DefaultMaxOutput * 16,
			}, func(ev agentproto.Event) {
				switch ev.Type {
				case agentproto.EventStdout:
					os.Stdout.Write(ev.Data)
				case agentproto.EventStderr:
					os.Stderr.Write(ev.Data)
				}
			})
			if err != nil {
				return err
			}
			if stats && res.Stats != nil {
				fmt.Fprintf(os.Stderr, "sheepfold: %.1f ms wall, %.1f ms CPU, %d KiB peak memory\n",
					res.Stats.DurationMS, res.Stats.CPUTimeMS, res.Stats.PeakMemoryBytes>>10)
			}
			return exitStatus(ctx, eng, sb, res, timeout)
		},
	}
	f := cmd.Flags()
	f.StringVarP(&language, "lang", "l", lang.Python, "language: python, javascript, bash, r or java")
	f.StringVarP(&tmpl, "template", "t", "python", "template to start the sandbox from")
	f.DurationVar(&timeout, "timeout", 30*time.Second, "wall-clock limit for the program")
	f.StringVar(&memory, "memory", "512MiB", "memory limit")
	f.StringVar(&disk, "disk", "256MiB", "size of the writable disk")
	f.Float64Var(&cpus, "cpus", 1, "CPU quota in cores")
	f.Int64Var(&pids, "pids", 256, "maximum number of processes and threads")
	f.BoolVar(&stats, "stats", false, "print duration, CPU time and peak memory to stderr")
	return cmd
}

func readProgram(args []string) (string, error) {
	var r io.Reader = os.Stdin
	if len(args) == 1 && args[0] != "-" {
		f, err := os.Open(args[0])
		if err != nil {
			return "", err
		}
		defer f.Close()
		r = f
	}
	b, err := io.ReadAll(io.LimitReader(r, 16<<20))
	return string(b), err
}

// exitStatus turns how the program ended into ours, explaining the
// sandbox's own interventions on stderr with their error codes.
func exitStatus(ctx context.Context, eng *engine, sb *sandbox.Sandbox, res *sandbox.ProcessResult, timeout time.Duration) error {
	switch {
	case res.Status == agentproto.StatusTimeout:
		fmt.Fprintf(os.Stderr, "sheepfold: %s: the program ran longer than %s and was killed\n", apierr.SandboxTimeout, timeout)
		return exitError{124}
	case res.Status == agentproto.StatusOutputLimit:
		fmt.Fprintf(os.Stderr, "sheepfold: %s: the program's output passed the limit and it was killed\n", apierr.OutputLimit)
		return exitError{1}
	case res.Signal != 0:
		if u, err := sb.Usage(ctx); err == nil && u.OOMKills > 0 {
			fmt.Fprintf(os.Stderr, "sheepfold: %s: the program ran out of memory (limit %d MiB) and was killed\n",
				apierr.OutOfMemory, sb.Limits.MemoryBytes>>20)
		}
		return exitError{128 + res.Signal}
	case res.ExitCode != 0:
		return exitError{res.ExitCode}
	}
	return nil
}
