package engine_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/agentproto"
	"github.com/sheepfold/sheepfold/internal/config"
	"github.com/sheepfold/sheepfold/internal/egress"
	"github.com/sheepfold/sheepfold/internal/engine"
	"github.com/sheepfold/sheepfold/internal/runtime/oci"
	"github.com/sheepfold/sheepfold/internal/sandbox"
	"github.com/sheepfold/sheepfold/internal/template"
	"github.com/sheepfold/sheepfold/internal/testutil"
)

// TestTagMoveUnderSandboxes: a tag moved while sandboxes run on its copy
// leaves that copy to them. A running sandbox of app:prod and a paused
// one go on reading their files after prod moves to another build (the
// paused one across an engine restart, whose sweep at the start spares
// the copy it holds again, and removes a copy a crash left unlinked); a
// new sandbox of app:prod gets the new build; the old copy leaves the
// disk when the last of them is killed.
func TestTagMoveUnderSandboxes(t *testing.T) {
	data := buildDataDir(t)
	ctx := context.Background()
	cfg := config.Config{DataDir: data, RuntimePath: testutil.Runc(t), AgentPath: testutil.AgentBin(t)}
	runner, err := engine.NewStepRunner(cfg, egress.Options{})
	if err != nil {
		t.Fatal(err)
	}
	build := func(version string) {
		t.Helper()
		var log bytes.Buffer
		if _, err := template.BuildDockerfile(ctx, []byte("FROM python\nRUN echo "+version+" > /etc/app-version\n"), template.DockerfileOptions{
			DataDir: data, Name: "app", UIDShift: oci.DefaultIDMap.HostID, Runner: runner, Log: &log,
		}); err != nil {
			t.Fatalf("build %s: %v\n%s", version, err, log.String())
		}
	}
	tags := filepath.Join(data, "templates", ".tags", "app")
	build("one")
	if _, err := template.Tag(ctx, data, "app", []string{"prod"}); err != nil {
		t.Fatal(err)
	}
	oldCopy, err := os.Readlink(filepath.Join(tags, "prod"))
	if err != nil {
		t.Fatal(err)
	}
	build("two")

	instance := fmt.Sprintf("test-tags-%d", os.Getpid())
	quiet := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	open := func() *engine.Engine {
		t.Helper()
		e, err := engine.Open(ctx, cfg, instance, 0, quiet, func(c *sandbox.Config) { c.KeepPaused = true; c.PoolSize = 0 })
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	e := open()
	closed := false
	t.Cleanup(func() {
		if !closed {
			e.Close(ctx)
		}
	})
	version := func(s *sandbox.Sandbox) string {
		t.Helper()
		var out strings.Builder
		res, err := s.Run(ctx, sandbox.ProcessSpec{Cmd: "/bin/sh", Args: []string{"-c", "cat /etc/app-version; python3 -c 'print(6 * 7)'"}, TimeoutMS: 60_000},
			func(ev agentproto.Event) {
				if ev.Type == agentproto.EventStdout {
					out.Write(ev.Data)
				}
			})
		if err != nil || res.ExitCode != 0 {
			t.Fatalf("read the version: %v %+v", err, res)
		}
		return strings.Join(strings.Fields(out.String()), " ")
	}
	running, err := e.Create(ctx, sandbox.CreateOptions{Template: "app:prod", Timeout: 10 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	paused, err := e.Create(ctx, sandbox.CreateOptions{Template: "app:prod", Timeout: 10 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if v := version(running); v != "one 42" {
		t.Fatalf("app:prod before the move: %q", v)
	}
	if err := paused.Pause(ctx); err != nil {
		t.Fatal(err)
	}

	// The move: no refusal, prod is the new build at once.
	if _, err := template.Tag(ctx, data, "app", []string{"prod"}); err != nil {
		t.Fatalf("move a tag sandboxes run on: %v", err)
	}
	fresh, err := e.Create(ctx, sandbox.CreateOptions{Template: "app:prod"})
	if err != nil {
		t.Fatal(err)
	}
	if v := version(fresh); v != "two 42" {
		t.Errorf("a new sandbox of app:prod after the move: %q, want the new build", v)
	}
	if v := version(running); v != "one 42" {
		t.Errorf("the running sandbox after the move: %q, want its own copy", v)
	}
	if _, err := os.Stat(filepath.Join(tags, oldCopy)); err != nil {
		t.Fatalf("the old copy went while sandboxes run on it: %v", err)
	}
	if err := e.Kill(ctx, running.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(tags, oldCopy)); err != nil {
		t.Fatalf("the old copy went while a paused sandbox holds it: %v", err)
	}

	// A restart: the paused sandbox is taken back, its copy held again
	// before the sweep; a copy a crash left, unlinked, is swept.
	if err := e.Close(ctx); err != nil {
		t.Fatal(err)
	}
	closed = true
	leaked := filepath.Join(tags, ".gen-leakedbycrash")
	if err := os.MkdirAll(filepath.Join(leaked, "rootfs"), 0o755); err != nil {
		t.Fatal(err)
	}
	e = open()
	closed = false
	if _, err := os.Stat(leaked); !os.IsNotExist(err) {
		t.Errorf("a copy nothing uses survived the restart: %v", err)
	}
	back, err := e.Get(paused.ID)
	if err != nil {
		t.Fatalf("the paused sandbox was not taken back: %v", err)
	}
	if err := back.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	if v := version(back); v != "one 42" {
		t.Errorf("the paused sandbox after the move and a restart: %q, want its own copy", v)
	}
	if err := e.Kill(ctx, back.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(tags, oldCopy)); !os.IsNotExist(err) {
		t.Errorf("the old copy after its last sandbox's kill: %v", err)
	}
	if err := e.Close(ctx); err != nil {
		t.Fatal(err)
	}
	closed = true
}
