// Package engine opens the sandbox engine: the OCI runtime (runc) on this
// host, or a Kubernetes cluster (kubernetes.go), under a sandbox.Manager,
// closed in reverse. sheepfold serve, run and bench (internal/bench) share
// it.
//
// Imports: internal/config, internal/runtime, internal/runtime/oci,
// internal/runtime/kubernetes, internal/sandbox, internal/template,
// internal/agenttls, internal/egress, internal/events and internal/policy
// (the egress gateway of template builds' RUN steps: build.go),
// client-go and the standard library.
package engine

import (
	"context"
	"log/slog"
	"path/filepath"
	"time"

	"github.com/sheepfold/sheepfold/internal/config"
	"github.com/sheepfold/sheepfold/internal/runtime"
	"github.com/sheepfold/sheepfold/internal/runtime/oci"
	"github.com/sheepfold/sheepfold/internal/sandbox"
	"github.com/sheepfold/sheepfold/internal/template"
)

// Runtime is a runtime the engine closes after its Manager.
type Runtime interface {
	runtime.Runtime
	Close() error
}

// Engine is a sandbox Manager with the runtime under it, closed in reverse.
type Engine struct {
	*sandbox.Manager
	Runtime Runtime // the runtime under the Manager
}

// Open starts the runtime (as instance) and the sandbox manager.
// idle is the idle limit (0: none); opts adjust the manager's Config.
func Open(ctx context.Context, cfg config.Config, instance string, idle time.Duration, log *slog.Logger,
	opts ...func(*sandbox.Config)) (*Engine, error) {
	// The runtime's sweep of dead instances tells of its leftovers as the
	// Manager does of its own instance's: the options' hook.
	var hooks sandbox.Config
	for _, o := range opts {
		o(&hooks)
	}
	rt, err := oci.New(oci.Config{
		RuntimePath: cfg.RuntimePath, RunscPath: cfg.RunscPath, DefaultRuntime: cfg.DefaultRuntime, StateDir: cfg.StateDir(), AgentBin: cfg.AgentPath,
		Instance: instance, CgroupRoot: cfg.CgroupRoot, Leftover: hooks.Leftover, Logger: log,
		VolumesDir: filepath.Join(cfg.DataDir, "volumes"), CDISpecDirs: cfg.CDISpecDirs,
	})
	if err != nil {
		return nil, err
	}
	// Paused sandboxes' checkpoints are kept on disk beside the runtime's
	// state: they are their memory, which a pause frees.
	checkpoints := func(c *sandbox.Config) { c.CheckpointDir = filepath.Join(cfg.DataDir, "checkpoints") }
	e, err := open(ctx, rt, templates{dataDir: cfg.DataDir, infos: new(template.Cache)}, idle, log, append([]func(*sandbox.Config){checkpoints}, opts...))
	if err != nil {
		return nil, err
	}
	// The paused sandboxes taken back hold their roots by now, and what
	// else an earlier engine left is destroyed: the template trees
	// nothing holds (a tag's old copies, a rebuilt name's old tree) go.
	if err := template.Sweep(cfg.DataDir); err != nil {
		log.Warn("remove unused template trees", "err", err)
	}
	return e, nil
}

// templates are the data dir's, with the runtime each may name
// (sandbox.TemplateRuntimes) and the devices each asks for
// (sandbox.TemplateDevices); the root each sandbox runs on is held
// (sandbox.TemplateHolds) until it is destroyed. A create asks all four
// questions of its template: infos reads its template.json once.
type templates struct {
	dataDir string
	infos   *template.Cache
}

func (t templates) RootFS(name string) (string, error) {
	info, err := t.infos.Get(t.dataDir, name)
	if err != nil {
		return "", err
	}
	return info.Path, nil
}

func (t templates) Devices(name string) (int, []string) {
	info, err := t.infos.Get(t.dataDir, name)
	if err != nil {
		return 0, nil // the create's RootFS says why
	}
	return info.GPUs, info.Devices
}

func (t templates) Runtime(name string) string {
	info, err := t.infos.Get(t.dataDir, name)
	if err != nil {
		return "" // the create's RootFS says why
	}
	return info.Runtime
}

// StartOf is the start command and ready check of template name's
// sandboxes (sandbox.TemplateStarts), with its USER, WORKDIR and ENV.
func (t templates) StartOf(name string) (sandbox.TemplateStart, error) {
	info, err := t.infos.Get(t.dataDir, name)
	if err != nil {
		return sandbox.TemplateStart{}, err
	}
	return sandbox.TemplateStart{Command: info.Start, Ready: info.Ready, User: info.User, WorkDir: info.WorkDir, Env: info.Env,
		Root: info.Labels[template.LabelRoot]}, nil
}

// HoldRoot holds template root rootfs for a sandbox that runs on it
// (sandbox.TemplateHolds): a tag moved or a name rebuilt meanwhile
// leaves the old tree to its sandboxes, removed when the last lets go
// (template.Hold).
func (t templates) HoldRoot(rootfs string) (func(collect bool), error) {
	return template.HoldPath(t.dataDir, rootfs)
}

// open starts the sandbox manager over rt; on error it closes rt.
func open(ctx context.Context, rt Runtime, templates sandbox.Templates, idle time.Duration, log *slog.Logger,
	opts []func(*sandbox.Config)) (*Engine, error) {
	scfg := sandbox.Config{Runtime: rt, Templates: templates, IdleTimeout: idle, Logger: log}
	for _, o := range opts {
		o(&scfg)
	}
	m, err := sandbox.New(ctx, scfg)
	if err != nil {
		rt.Close()
		return nil, err
	}
	return &Engine{Manager: m, Runtime: rt}, nil
}

// Close destroys every sandbox, then releases the runtime.
func (e *Engine) Close(ctx context.Context) error {
	err := e.Manager.Close(ctx)
	if cerr := e.Runtime.Close(); err == nil {
		err = cerr
	}
	return err
}
