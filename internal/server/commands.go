package server

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/sheepfold/sheepfold/api"
	"github.com/sheepfold/sheepfold/internal/agentproto"
	"github.com/sheepfold/sheepfold/internal/apierr"
	"github.com/sheepfold/sheepfold/internal/sandbox"
)

func (s *Server) commandRoutes(add addFunc) {
	add("POST /v1/sandboxes/{id}/commands", true, s.runCommand)
	add("GET /v1/sandboxes/{id}/commands", true, s.listCommands)
	add("GET /v1/sandboxes/{id}/commands/{pid}/stream", true, s.streamCommand)
	add("POST /v1/sandboxes/{id}/commands/{pid}/input", true, s.commandInput)
	add("POST /v1/sandboxes/{id}/commands/{pid}/signal", true, s.commandSignal)
}

// Command statuses.
const (
	cmdExited      = "exited"       // ended by itself; see exit_code
	cmdSignaled    = "signaled"     // ended by a signal; see signal
	cmdTimeout     = "timeout"      // killed at timeout_ms
	cmdOutputLimit = "output_limit" // killed when its output passed the cap
)

// defaultCommandTimeout bounds a foreground command that names no timeout;
// maxCommandTimeout is the longest timeout_ms (more would overflow a
// time.Duration in nanoseconds on its way to the agent).
const (
	defaultCommandTimeout = 60 * time.Second
	maxCommandTimeout     = 30 * 24 * time.Hour
)

func commandResult(res *sandbox.ProcessResult, stdout, stderr string) api.Command {
	out := api.Command{PID: res.PID, ExitCode: res.ExitCode, Signal: res.Signal, Stdout: stdout, Stderr: stderr,
		Truncated: res.Truncated, Status: res.Status}
	if out.Status == "" {
		out.Status = cmdExited
		if res.Signal != 0 {
			out.Status = cmdSignaled
		}
	}
	return out
}

func (s *Server) runCommand(w http.ResponseWriter, r *http.Request) error {
	var req api.CommandRequest
	if err := decodeJSON(w, r, &req, false); err != nil {
		return err
	}
	if req.Cmd == "" {
		return apierr.New(apierr.BadRequest, "cmd is required")
	}
	spec := sandbox.ProcessSpec{Cmd: req.Cmd, Args: req.Args, Env: req.Env, Cwd: req.Cwd, Tag: req.Tag, Stdin: req.Stdin}
	if req.TimeoutMS != nil {
		if *req.TimeoutMS < 0 || *req.TimeoutMS > maxCommandTimeout.Milliseconds() {
			return apierr.New(apierr.BadRequest, "timeout_ms must be from 0 (none) to %d (30 days)", maxCommandTimeout.Milliseconds())
		}
		spec.TimeoutMS = *req.TimeoutMS
	} else if !req.Background {
		spec.TimeoutMS = defaultCommandTimeout.Milliseconds()
	}
	b, err := s.lookup(r)
	if err != nil {
		return err
	}
	if req.Background {
		// The process outlives the request.
		pid, err := b.sb.Start(context.WithoutCancel(r.Context()), spec)
		if err != nil {
			return explainCwd(r.Context(), b.sb, spec.Cwd, err)
		}
		writeJSON(w, http.StatusAccepted, map[string]int{"pid": pid})
		return nil
	}
	spec.MaxOutputBytes = sandbox.DefaultMaxOutput
	return s.followProcess(w, r, b, wantStream(r, streamNone), func(ctx context.Context, on func(agentproto.Event)) (*sandbox.ProcessResult, error) {
		res, err := b.sb.Run(ctx, spec, on)
		return res, explainCwd(ctx, b.sb, spec.Cwd, err)
	})
}

// followProcess runs or attaches to a process, answering with its whole
// result or streaming its events.
func (s *Server) followProcess(w http.ResponseWriter, r *http.Request, b *box, mode streamMode,
	run func(context.Context, func(agentproto.Event)) (*sandbox.ProcessResult, error)) error {
	var stdout, stderr strings.Builder
	pid := 0
	var st *streamer
	if mode != streamNone {
		st = newStreamer(w, mode)
	}
	texts := textStreams{}
	// A client that stops reading breaks its stream (write deadlines):
	// that ends the following, as the client leaving does.
	ctx, cancel := context.WithCancelCause(r.Context())
	defer cancel(nil)
	res, err := run(ctx, func(ev agentproto.Event) {
		if st != nil {
			defer func() {
				if werr := st.err(); werr != nil {
					cancel(werr)
				}
			}()
		}
		switch ev.Type {
		case agentproto.EventStart:
			pid = ev.PID
			if st != nil {
				st.send("start", map[string]int{"pid": ev.PID}, map[string]any{"type": "start", "pid": ev.PID})
			}
		case agentproto.EventStdout, agentproto.EventStderr:
			if st != nil {
				if text := texts.text(ev.Type, ev.Data); text != "" {
					st.send(ev.Type, textJSON{text}, map[string]any{"type": ev.Type, "text": text})
				}
				return
			}
			if ev.Type == agentproto.EventStdout {
				appendCapped(&stdout, ev.Data)
			} else {
				appendCapped(&stderr, ev.Data)
			}
		}
	})
	if err != nil && ctx.Err() != nil && pid != 0 && r.Method == http.MethodPost {
		// The caller of a foreground command went away (or stopped
		// reading): stop it.
		_ = b.sb.Signal(context.Background(), pid, int(syscall.SIGKILL))
	}
	var out api.Command
	if err == nil {
		out = commandResult(res, stdout.String(), stderr.String())
	}
	if st == nil {
		if err != nil {
			return err
		}
		writeJSON(w, http.StatusOK, out)
		return nil
	}
	s.end(st, w, r, err, "done", out, map[string]any{"type": "done", "command": out})
	return nil
}

func appendCapped(b *strings.Builder, p []byte) {
	if room := sandbox.DefaultMaxOutput - b.Len(); room > 0 {
		if len(p) > room {
			p = p[:room]
		}
		b.Write(p)
	}
}

func pathPID(r *http.Request) (int, error) {
	pid, err := strconv.Atoi(r.PathValue("pid"))
	if err != nil || pid <= 0 {
		return 0, apierr.New(apierr.BadRequest, "pid must be a positive integer, not %q", r.PathValue("pid"))
	}
	return pid, nil
}

func (s *Server) streamCommand(w http.ResponseWriter, r *http.Request) error {
	pid, err := pathPID(r)
	if err != nil {
		return err
	}
	b, err := s.lookup(r)
	if err != nil {
		return err
	}
	return s.followProcess(w, r, b, wantStream(r, streamSSE), func(ctx context.Context, on func(agentproto.Event)) (*sandbox.ProcessResult, error) {
		return b.sb.Connect(ctx, pid, on)
	})
}

func (s *Server) listCommands(w http.ResponseWriter, r *http.Request) error {
	b, err := s.lookup(r)
	if err != nil {
		return err
	}
	ps, err := b.sb.Processes(r.Context())
	if err != nil {
		return err
	}
	out := make([]api.Process, 0, len(ps))
	for _, p := range ps {
		args := p.Args
		if args == nil {
			args = []string{}
		}
		out = append(out, api.Process{PID: p.PID, Cmd: p.Cmd, Args: args, Cwd: p.Cwd, Tag: p.Tag, Started: p.Started.UTC()})
	}
	writeJSON(w, http.StatusOK, map[string]any{"processes": out})
	return nil
}

func (s *Server) commandInput(w http.ResponseWriter, r *http.Request) error {
	pid, err := pathPID(r)
	if err != nil {
		return err
	}
	var req api.Input
	if err := decodeJSON(w, r, &req, false); err != nil {
		return err
	}
	var data []byte
	switch {
	case req.Data != nil && req.DataBase64 != nil:
		return apierr.New(apierr.BadRequest, "send data or data_base64, not both")
	case req.Data != nil:
		data = []byte(*req.Data)
	case req.DataBase64 != nil:
		if data, err = base64.StdEncoding.DecodeString(*req.DataBase64); err != nil {
			return apierr.New(apierr.BadRequest, "data_base64 is not valid base64")
		}
	case !req.EOF:
		return apierr.New(apierr.BadRequest, "data, data_base64 or eof is required")
	}
	b, err := s.lookup(r)
	if err != nil {
		return err
	}
	if err := b.sb.SendInput(r.Context(), pid, data, req.EOF); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

var signals = map[string]syscall.Signal{
	"HUP": syscall.SIGHUP, "INT": syscall.SIGINT, "QUIT": syscall.SIGQUIT, "KILL": syscall.SIGKILL,
	"TERM": syscall.SIGTERM, "USR1": syscall.SIGUSR1, "USR2": syscall.SIGUSR2, "STOP": syscall.SIGSTOP,
	"CONT": syscall.SIGCONT, "ALRM": syscall.SIGALRM, "PIPE": syscall.SIGPIPE,
}

// parseSignal reads a signal given as a name ("SIGTERM", "term") or a
// number (15 or "15").
func parseSignal(raw json.RawMessage) (int, error) {
	bad := apierr.New(apierr.BadRequest, "signal must be a signal name such as SIGTERM or a number from 1 to 64")
	if len(raw) == 0 || string(raw) == "null" {
		return int(syscall.SIGTERM), nil
	}
	var n int
	if err := json.Unmarshal(raw, &n); err == nil {
		if n < 1 || n > 64 {
			return 0, bad
		}
		return n, nil
	}
	var name string
	if err := json.Unmarshal(raw, &name); err != nil {
		return 0, bad
	}
	if n, err := strconv.Atoi(name); err == nil {
		if n < 1 || n > 64 {
			return 0, bad
		}
		return n, nil
	}
	sig, ok := signals[strings.TrimPrefix(strings.ToUpper(name), "SIG")]
	if !ok {
		return 0, bad
	}
	return int(sig), nil
}

func (s *Server) commandSignal(w http.ResponseWriter, r *http.Request) error {
	pid, err := pathPID(r)
	if err != nil {
		return err
	}
	var req api.Signal
	if err := decodeJSON(w, r, &req, true); err != nil {
		return err
	}
	sig, err := parseSignal(req.Signal)
	if err != nil {
		return err
	}
	b, err := s.lookup(r)
	if err != nil {
		return err
	}
	if err := b.sb.Signal(r.Context(), pid, sig); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}
