package server

import (
	"context"
	"net/http"
	"strings"

	"github.com/sheepfold/sheepfold/internal/apierr"
	"github.com/sheepfold/sheepfold/internal/llm"
	"github.com/sheepfold/sheepfold/internal/session"
)

// POST /v1/sessions/{id}/ask: the request, the session and its stream are
// the server's; the loop is internal/session's (session.Ask), reaching
// the model relay through askRelay (the session's account: admitted,
// metered, quota-checked with the fallback model and priced like any
// completion, models.go) and the sandbox through askSandbox.

func (s *Server) sessionAsk(w http.ResponseWriter, r *http.Request) error {
	var req session.Request
	if err := decodeJSON(w, r, &req, false); err != nil {
		return err
	}
	limit, err := session.Check(&req)
	if err != nil {
		return err
	}
	rec, b, err := s.sessionBox(r)
	if err != nil {
		return err
	}
	if s.cfg.Models.Provider(rec.Model) == nil {
		return apierr.New(apierr.ModelNotFound, "the session's model %q is no longer served by this server", rec.Model)
	}
	mode := wantStream(r, streamNone)
	var st *streamer
	emit := func(session.Step) {}
	if mode != streamNone {
		st = newStreamer(w, mode)
		emit = func(sj session.Step) { st.send("step", sj, map[string]any{"type": "step", "step": sj}) }
	}
	ans, err := session.Ask(r.Context(), rec.ID, rec.Model, askRelay{s: s, owner: rec.Owner}, askSandbox{s: s, r: r, b: b}, req, limit, emit)
	if st == nil {
		if err != nil {
			return err
		}
		writeJSON(w, http.StatusOK, ans)
		return nil
	}
	s.end(st, w, r, err, "done", ans, map[string]any{"type": "done", "answer": ans})
	return nil
}

// askRelay is the model relay for an ask of owner's session.
type askRelay struct {
	s     *Server
	owner string
}

func (a askRelay) Admit(ctx context.Context, model string, need llm.Usage) (session.Call, error) {
	c, err := a.s.admitModel(ctx, a.owner, model, need)
	if err != nil {
		return nil, err
	}
	return askCall{c}, nil
}

func (a askRelay) Complete(ctx context.Context, model string, body []byte) (*llm.Response, error) {
	return a.s.cfg.Models.Complete(ctx, llm.Request{Model: model}, body)
}

// askCall is an admitted completion of an ask (modelCall).
type askCall struct{ c *modelCall }

func (c askCall) Model() string            { return c.c.model }
func (c askCall) Cost(u llm.Usage) float64 { return c.c.p.Cost(u) }
func (c askCall) Settle(u llm.Usage)       { c.c.settle(u) }
func (c askCall) Release()                 { c.c.release() }

// askSandbox is an ask's session's sandbox, for the request r.
type askSandbox struct {
	s *Server
	r *http.Request
	b *box
}

func (a askSandbox) WriteFile(ctx context.Context, p string, data []byte) error {
	_, err := a.b.sb.WriteFile(ctx, p, strings.NewReader(string(data)), 0o644, session.MaxFileBytes)
	return err
}

func (a askSandbox) Run(ctx context.Context, code, language string) (session.Execution, error) {
	return a.s.runInSession(a.r.WithContext(ctx), a.b, code, language, nil)
}
