package engine

import (
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"

	"github.com/sheepfold/sheepfold/internal/config"
	"github.com/sheepfold/sheepfold/internal/egress"
	"github.com/sheepfold/sheepfold/internal/events"
	"github.com/sheepfold/sheepfold/internal/policy"
	"github.com/sheepfold/sheepfold/internal/runtime/oci"
	"github.com/sheepfold/sheepfold/internal/template"
)

// StepRunner is the template.StepRunner of Dockerfile builds on this host:
// each RUN in a runc container of its own (oci.StepRunner: the sandbox's
// seccomp profile and capabilities), its state under
// <DataDir>/templates/.runs. A step reaches cfg.BuildAllowHosts, and
// nothing else, through an egress gateway of its own (as a sandbox with
// that allowlist does); with none it has no network.
func StepRunner(cfg config.Config) template.StepRunner {
	r, err := NewStepRunner(cfg, egress.Options{})
	if err != nil {
		return failedRunner{err}
	}
	return r
}

// NewStepRunner is StepRunner with the gateways' options (the server's
// own listeners in Self; tests' TestNet).
func NewStepRunner(cfg config.Config, opt egress.Options) (template.StepRunner, error) {
	s := stepRunner{r: oci.StepRunner{RuntimePath: cfg.RuntimePath,
		Dir: filepath.Join(cfg.DataDir, "templates", ".runs")}, opt: opt}
	if len(cfg.BuildAllowHosts) > 0 {
		pol, err := policy.CompileEgress(&policy.Network{Mode: policy.NetworkAllowlist, Allow: cfg.BuildAllowHosts})
		if err != nil {
			return nil, fmt.Errorf("build allow hosts: %w", err)
		}
		s.pol, s.hosts, s.caFile = pol, cfg.BuildAllowHosts, cfg.BuildCAFile
	}
	if s.opt.Logger == nil {
		s.opt.Logger = slog.New(slog.DiscardHandler)
	}
	return s, nil
}

type stepRunner struct {
	r      oci.StepRunner
	pol    *policy.Egress // nil: no network
	hosts  []string
	caFile string
	opt    egress.Options
}

func (s stepRunner) RunStep(ctx context.Context, st template.RunStep, out io.Writer) error {
	step := oci.Step{RootFS: st.RootFS, Args: st.Args, Env: st.Env, Cwd: st.Cwd,
		UID: st.UID, GID: st.GID, HostID: st.UIDShift}
	if s.pol != nil {
		// What the gateway refuses is said in the step's output: the
		// reason an install failed.
		opt := s.opt
		var mu sync.Mutex
		opt.Events = events.SinkFunc(func(e events.Event) {
			if e.Type != events.SecurityViolation {
				return
			}
			mu.Lock()
			defer mu.Unlock()
			fmt.Fprintf(out, "sheepfold: the build's network refused %v (%v): only %s are allowed (--build-allow-host)\n",
				e.Details["target"], e.Details["kind"], strings.Join(s.hosts, ", "))
		})
		gw, err := egress.New(opt, "build-"+strings.ToLower(rand.Text()[:12]), s.pol, 0)
		if err != nil {
			return fmt.Errorf("step network: %w", err)
		}
		defer gw.Close()
		step.Network = &oci.StepNetwork{ResolvConf: egress.ResolvConf, Attach: gw.AttachNamespace, CAFile: s.caFile}
	}
	return s.r.Run(ctx, step, out)
}

// failedRunner fails every step with the error that made it.
type failedRunner struct{ err error }

func (f failedRunner) RunStep(context.Context, template.RunStep, io.Writer) error { return f.err }
