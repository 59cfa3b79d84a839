package engine

import (
	"context"
	"io"
	"path/filepath"

	"github.com/sheepfold/sheepfold/internal/config"
	"github.com/sheepfold/sheepfold/internal/runtime/oci"
	"github.com/sheepfold/sheepfold/internal/template"
)

// StepRunner is the template.StepRunner of Dockerfile builds on this host:
// each RUN in a runc container of its own (oci.StepRunner: no network, the
// sandbox's seccomp profile and capabilities), its state under
// <DataDir>/templates/.runs.
func StepRunner(cfg config.Config) template.StepRunner {
	return stepRunner{oci.StepRunner{RuntimePath: cfg.RuntimePath,
		Dir: filepath.Join(cfg.DataDir, "templates", ".runs")}}
}

type stepRunner struct{ r oci.StepRunner }

func (s stepRunner) RunStep(ctx context.Context, st template.RunStep, out io.Writer) error {
	return s.r.Run(ctx, oci.Step{RootFS: st.RootFS, Args: st.Args, Env: st.Env, Cwd: st.Cwd,
		UID: st.UID, GID: st.GID, HostID: st.UIDShift}, out)
}
