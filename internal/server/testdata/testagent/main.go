// Command testagent is a stand-in for cmd/sheepfold-agent in the server's
// tests while that command does not build: the real internal/agent
// (processes, files, contexts) with a trivial kernel that runs each
// execution as a fresh interpreter process (no state between executions).
// It takes the fake runtime's arguments: serve --listen S --root R --home H.
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/sheepfold/sheepfold/internal/agent"
	"github.com/sheepfold/sheepfold/internal/agentproto"
)

var interpreters = map[string][]string{
	"python":     {"/usr/bin/python3", "-c"},
	"javascript": {"/usr/bin/node", "-e"},
	"bash":       {"/bin/bash", "-c"},
}

type kernel struct {
	lang, root, cwd string
	env             map[string]string
}

func (k *kernel) Language() string              { return k.lang }
func (k *kernel) Restart(context.Context) error { return nil }
func (k *kernel) Close() error                  { return nil }

type emitter struct {
	typ  string
	emit func(agentproto.Event) error
}

func (e emitter) Write(p []byte) (int, error) {
	_ = e.emit(agentproto.Event{Type: e.typ, Data: bytes.Clone(p)})
	return len(p), nil
}

func (k *kernel) Execute(ctx context.Context, spec agentproto.ExecuteSpec, emit func(agentproto.Event) error) agentproto.Event {
	start := time.Now()
	if spec.TimeoutMS > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, time.Duration(spec.TimeoutMS)*time.Millisecond)
		defer cancel()
	}
	argv := append(append([]string{}, interpreters[k.lang]...), spec.Code)
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Dir = filepath.Join(k.root, k.cwd)
	cmd.Env = os.Environ()
	for key, v := range k.env {
		cmd.Env = append(cmd.Env, key+"="+v)
	}
	for key, v := range spec.Env {
		cmd.Env = append(cmd.Env, key+"="+v)
	}
	var stderr bytes.Buffer
	cmd.Stdout = emitter{agentproto.EventStdout, emit}
	cmd.Stderr = io.MultiWriter(emitter{agentproto.EventStderr, emit}, &stderr)
	err := cmd.Run()
	done := agentproto.Event{Type: agentproto.EventDone, Status: agentproto.StatusOK,
		Stats: &agentproto.Stats{DurationMS: float64(time.Since(start).Microseconds()) / 1000}}
	var ee *exec.ExitError
	switch {
	case ctx.Err() != nil:
		done.Status = agentproto.StatusTimeout
	case errors.As(err, &ee):
		lines := strings.Split(strings.TrimSpace(stderr.String()), "\n")
		name, value, _ := strings.Cut(lines[len(lines)-1], ": ")
		_ = emit(agentproto.Event{Type: agentproto.EventError, Error: &agentproto.ExecError{Name: name, Value: value, Traceback: stderr.String()}})
		done.Status = agentproto.StatusError
	case err != nil:
		return agentproto.Event{Type: agentproto.EventDone, Code: agentproto.CodeInternal, Message: err.Error()}
	}
	return done
}

func main() {
	fs := flag.NewFlagSet("serve", flag.ExitOnError)
	listen := fs.String("listen", "", "socket")
	root := fs.String("root", "/", "root")
	home := fs.String("home", "/home/user", "home")
	if len(os.Args) < 2 || os.Args[1] != "serve" {
		fmt.Fprintln(os.Stderr, "usage: testagent serve --listen S --root R --home H")
		os.Exit(2)
	}
	fs.Parse(os.Args[2:])
	h := *home
	if rel, err := filepath.Rel(*root, h); err == nil && !strings.HasPrefix(rel, "..") {
		h = "/" + rel
	}
	ln, err := net.Listen("unix", *listen)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	err = agent.Serve(ctx, ln, agent.Config{
		Root: *root, Home: h, Version: "test",
		Languages: []string{"python", "javascript", "bash"},
		Canonical: func(l string) (string, error) {
			switch l {
			case "python", "py", "python3":
				return "python", nil
			case "javascript", "js", "node":
				return "javascript", nil
			case "bash", "sh":
				return "bash", nil
			}
			return "", fmt.Errorf("unknown language %q", l)
		},
		NewKernel: func(_ context.Context, spec agentproto.ContextSpec) (agent.Kernel, error) {
			return &kernel{lang: spec.Language, root: *root, cwd: spec.Cwd, env: spec.Env}, nil
		},
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
