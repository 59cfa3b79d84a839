package server

import (
	"context"
	"net/http"

	"github.com/sheepfold/sheepfold/api"
	"github.com/sheepfold/sheepfold/internal/agentproto"
	"github.com/sheepfold/sheepfold/internal/apierr"
	"github.com/sheepfold/sheepfold/internal/lang"
	"github.com/sheepfold/sheepfold/internal/sandbox"
)

func (s *Server) contextRoutes(add addFunc) {
	add("POST /v1/sandboxes/{id}/contexts", true, s.createContext)
	add("GET /v1/sandboxes/{id}/contexts", true, s.listContexts)
	add("POST /v1/sandboxes/{id}/contexts/{ctx}/restart", true, s.restartContext)
	add("DELETE /v1/sandboxes/{id}/contexts/{ctx}", true, s.deleteContext)
}

func (s *Server) createContext(w http.ResponseWriter, r *http.Request) error {
	var req api.ContextRequest
	if err := decodeJSON(w, r, &req, true); err != nil {
		return err
	}
	if req.Language == "" {
		req.Language = lang.Python
	}
	b, err := s.lookup(r)
	if err != nil {
		return err
	}
	c, err := b.sb.CreateContext(r.Context(), agentproto.ContextSpec{Language: req.Language, Cwd: req.Cwd, Env: req.Env})
	if err != nil {
		return explainCwd(r.Context(), b.sb, req.Cwd, err)
	}
	writeJSON(w, http.StatusCreated, c)
	return nil
}

func (s *Server) listContexts(w http.ResponseWriter, r *http.Request) error {
	b, err := s.lookup(r)
	if err != nil {
		return err
	}
	cs, err := b.sb.Contexts(r.Context())
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, map[string]any{"contexts": cs})
	return nil
}

func (s *Server) restartContext(w http.ResponseWriter, r *http.Request) error {
	b, err := s.lookup(r)
	if err != nil {
		return err
	}
	c, err := b.sb.RestartContext(r.Context(), r.PathValue("ctx"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, c)
	return nil
}

func (s *Server) deleteContext(w http.ResponseWriter, r *http.Request) error {
	b, err := s.lookup(r)
	if err != nil {
		return err
	}
	if err := b.sb.DeleteContext(r.Context(), r.PathValue("ctx")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// explainCwd turns a failure to start something in cwd into a 400 when cwd
// is the reason: the kernel's own error ("fork/exec /usr/bin/python3: no
// such file or directory") names the interpreter, not the directory, and
// the agent's own check of cwd answers not found or not allowed, which
// here is the request's mistake. It costs a Stat only after a failure.
func explainCwd(ctx context.Context, sb *sandbox.Sandbox, cwd string, err error) error {
	switch apierr.CodeOf(err) {
	case apierr.Internal, apierr.NotFound, apierr.PathNotAllowed:
	default:
		return err
	}
	if cwd == "" || ctx.Err() != nil {
		return err
	}
	fi, serr := sb.Stat(ctx, cwd)
	switch {
	case apierr.CodeOf(serr) == apierr.NotFound:
		return apierr.Wrap(err, apierr.BadRequest, "cwd %s does not exist", cwd)
	case serr == nil && fi.Type != "dir":
		return apierr.Wrap(err, apierr.BadRequest, "cwd %s is not a directory", cwd)
	case apierr.CodeOf(serr) == apierr.PathNotAllowed:
		return apierr.Wrap(err, apierr.BadRequest, "cwd %s is not accessible", cwd)
	}
	return err
}
