package server

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/sheepfold/sheepfold/api"
	"github.com/sheepfold/sheepfold/internal/apierr"
	"github.com/sheepfold/sheepfold/internal/llm"
	"github.com/sheepfold/sheepfold/internal/policy"
	"github.com/sheepfold/sheepfold/internal/sandbox"
	"github.com/sheepfold/sheepfold/internal/session"
	"github.com/sheepfold/sheepfold/internal/store"
)

// Sessions: a model bound to a sandbox under a security policy. A
// session's id is its sandbox's, so every sandbox route (policy, events,
// files, usage) takes it too; deleting either ends both. The session adds
// the seeds' execute shape (/execute) and the model loop (/ask,
// session_ask.go; both internal/session's).

func (s *Server) sessionRoutes(add addFunc) {
	add("POST /v1/sessions", true, s.createSession)
	add("GET /v1/sessions/{id}", true, s.getSession)
	add("DELETE /v1/sessions/{id}", true, s.deleteSession)
	add("POST /v1/sessions/{id}/execute", true, s.sessionExecute)
	add("POST /v1/sessions/{id}/ask", true, s.sessionAsk)
}

func sessionOf(rec store.Session, sb api.Sandbox) api.Session {
	return api.Session{ID: rec.ID, Model: rec.Model, SandboxID: sb.ID, Template: sb.Template, State: sb.State,
		CreatedAt: rec.CreatedAt.UTC(), ExpiresAt: sb.ExpiresAt, Resources: sb.Resources, StopReason: sb.StopReason}
}

func (s *Server) createSession(w http.ResponseWriter, r *http.Request) error {
	var req api.CreateSession
	if err := decodeJSON(w, r, &req, false); err != nil {
		return err
	}
	if req.Model == "" {
		return apierr.New(apierr.BadRequest, "model is required")
	}
	own := owner(r)
	// The model must be served and have quota left this month (or a
	// fallback that has): a session whose every ask would fail is not
	// made.
	call, err := s.admitModel(r.Context(), own, req.Model, llm.Usage{})
	if err != nil {
		return err
	}
	call.release()
	opt, execTimeout, err := s.createOptions(api.CreateSandbox{Template: req.Template, Timeout: req.Timeout, Resources: req.Resources,
		Metadata: req.Metadata, SandboxConfig: req.SandboxConfig, SecurityPolicy: req.SecurityPolicy})
	if err != nil {
		return err
	}
	done, err := s.admitSession(r.Context(), own, opt.Policy)
	if err != nil {
		return err
	}
	defer done()
	sb, err := s.create(r.Context(), own, opt, execTimeout, nil)
	if err != nil {
		return err
	}
	rec := store.Session{ID: sb.ID, Owner: own, Model: req.Model, CreatedAt: time.Now()}
	if err := s.store.PutSession(context.WithoutCancel(r.Context()), rec); err != nil {
		if b, lerr := s.lookupID(r.Context(), own, sb.ID); lerr == nil {
			_ = s.engine.Kill(context.Background(), sb.ID)
			s.forget(context.Background(), b)
		}
		return fmt.Errorf("record session: %w", err)
	}
	done() // recorded: counted among the running from now on
	writeJSON(w, http.StatusCreated, sessionOf(rec, sandboxFromInfo(sb.Info())))
	return nil
}

// admitSession enforces rate_limiting.concurrent_sessions: the account's
// running sessions, with the ones it is creating now, must stay within
// the cap of the new session's policy and of every running session's.
// done ends the new session's place among those being created (call it
// once the session is recorded, or failed).
func (s *Server) admitSession(ctx context.Context, own string, p *policy.Policy) (done func(), err error) {
	s.sessionMu.Lock()
	defer s.sessionMu.Unlock()
	recs, err := s.store.ListSandboxes(ctx, store.SandboxFilter{Owner: own, State: string(sandbox.StateRunning)})
	if err != nil {
		return nil, err
	}
	capOf, capBy := p.ConcurrentSessions(), "the new session's"
	capped := capOf > 0
	caps := make([]int64, len(recs))
	for i, rec := range recs {
		if rp, err := policy.Parse(rec.Policy); err == nil { // a record's policy was valid when written
			caps[i] = rp.ConcurrentSessions()
			capped = capped || caps[i] > 0
		}
	}
	running := 0
	for i, rec := range recs {
		if !capped {
			break // no cap anywhere: nothing to count
		}
		if _, err := s.store.GetSession(ctx, rec.ID); err != nil {
			if errors.Is(err, store.ErrNotFound) {
				continue // a sandbox, not a session
			}
			return nil, err
		}
		running++
		if c := caps[i]; c > 0 && (capOf == 0 || c < capOf) {
			capOf, capBy = c, "session "+rec.ID+"'s"
		}
	}
	n := running + s.pendingSessions[own]
	if capOf > 0 && int64(n) >= capOf {
		return nil, &apierr.Error{Code: apierr.RateLimited, RetryAfter: time.Second,
			Message: fmt.Sprintf("this account has %d sessions running, the most %s rate_limiting.concurrent_sessions allows is %d; end one first", n, capBy, capOf),
			Details: map[string]any{"running": n, "limit": capOf}}
	}
	if s.pendingSessions == nil {
		s.pendingSessions = map[string]int{}
	}
	s.pendingSessions[own]++
	var once sync.Once
	return func() {
		once.Do(func() { s.endPending(own) })
	}, nil
}

// endPending ends one of own's sessions being created.
func (s *Server) endPending(own string) {
	s.sessionMu.Lock()
	defer s.sessionMu.Unlock()
	if s.pendingSessions[own]--; s.pendingSessions[own] <= 0 {
		delete(s.pendingSessions, own)
	}
}

// lookupSession returns the caller's session record; another owner's is
// not found, as an unknown one.
func (s *Server) lookupSession(r *http.Request) (store.Session, error) {
	id := r.PathValue("id")
	rec, err := s.store.GetSession(r.Context(), id)
	if errors.Is(err, store.ErrNotFound) || err == nil && rec.Owner != owner(r) {
		return rec, apierr.New(apierr.SessionNotFound, "session %q not found", id)
	}
	return rec, err
}

// sessionBox returns the caller's session and its running sandbox.
func (s *Server) sessionBox(r *http.Request) (store.Session, *box, error) {
	rec, err := s.lookupSession(r)
	if err != nil {
		return rec, nil, err
	}
	b, err := s.lookupID(r.Context(), rec.Owner, rec.ID)
	if apierr.CodeOf(err) == apierr.SandboxNotFound {
		// Recorded and not held: from before a restart.
		return rec, nil, apierr.New(apierr.SandboxState, "session %s has stopped", rec.ID)
	}
	return rec, b, err
}

func (s *Server) getSession(w http.ResponseWriter, r *http.Request) error {
	rec, b, err := s.sessionBox(r)
	switch {
	case err == nil:
		writeJSON(w, http.StatusOK, sessionOf(rec, sandboxFromInfo(b.sb.Info())))
		return nil
	case apierr.CodeOf(err) != apierr.SandboxState:
		return err
	}
	sb, err := s.store.GetSandbox(r.Context(), rec.ID)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, sessionOf(rec, sandboxFromRecord(sb)))
	return nil
}

// deleteSession ends a session and its sandbox; ending one that has
// already stopped succeeds too.
func (s *Server) deleteSession(w http.ResponseWriter, r *http.Request) error {
	_, b, err := s.sessionBox(r)
	if apierr.CodeOf(err) == apierr.SandboxState {
		w.WriteHeader(http.StatusNoContent)
		return nil
	}
	if err != nil {
		return err
	}
	if err := s.engine.Kill(context.WithoutCancel(r.Context()), b.sb.ID); err != nil && apierr.CodeOf(err) != apierr.SandboxNotFound {
		return err
	}
	s.forget(r.Context(), b)
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// runInSession runs code in a session's sandbox and records it.
func (s *Server) runInSession(r *http.Request, b *box, code, lang string, timeoutMS *int64) (session.Execution, error) {
	timeout, err := b.execTimeoutFor(timeoutMS)
	if err != nil {
		return session.Execution{}, err
	}
	if timeout == 0 {
		timeout = sandbox.DefaultExecTimeout
	}
	ereq := sandbox.ExecuteRequest{ID: newID("exe_"), Code: code, Language: lang, Timeout: timeout}
	rec := s.beginExecution(r, b, ereq.ID, api.ExecuteRequest{Code: code, Language: lang})
	ex, err := b.sb.Execute(r.Context(), ereq, nil)
	rec.End(ex, err)
	if err != nil {
		return session.Execution{}, err
	}
	return session.ExecutionOf(ex, timeout), nil
}

func (s *Server) sessionExecute(w http.ResponseWriter, r *http.Request) error {
	var req api.SessionExecuteRequest
	if err := decodeJSON(w, r, &req, false); err != nil {
		return err
	}
	_, b, err := s.sessionBox(r)
	if err != nil {
		return err
	}
	out, err := s.runInSession(r, b, req.Code, req.Language, req.TimeoutMS)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}
