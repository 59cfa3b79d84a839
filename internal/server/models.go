package server

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"github.com/sheepfold/sheepfold/api"
	"github.com/sheepfold/sheepfold/internal/account"
	"github.com/sheepfold/sheepfold/internal/apierr"
	"github.com/sheepfold/sheepfold/internal/llm"
)

// The OpenAI-compatible model relay: POST /v1/chat/completions goes to
// the provider of the requested model (internal/llm), its tokens metered
// per account and model, its cost accrued to the account; GET /v1/models
// lists the configured models. The caller's Sheepfold key authenticates;
// the provider's key is the server's.

func (s *Server) modelRoutes(add addFunc) {
	add("POST /v1/chat/completions", true, s.chatCompletions)
	add("GET /v1/models", true, s.listModels)
}

func (s *Server) listModels(w http.ResponseWriter, r *http.Request) error {
	models := s.cfg.Models.Models()
	if models == nil {
		models = []llm.Model{}
	}
	writeJSON(w, http.StatusOK, map[string]any{"object": "list", "data": models})
	return nil
}

// modelCall is an admitted completion: the account it is metered to,
// the model serving it (the one asked for or its fallback), and what it
// holds of the model's monthly quota and the account's credits until
// settle or release.
type modelCall struct {
	s     *Server
	acct  *account.Account // nil with accounting off
	p     *llm.Provider
	model string
	// reserved is the tokens held of the model's quota (0: none).
	reserved int64
	// credits gives back the credits held.
	credits func()
	done    bool
}

// admitModel admits a completion of model for own that may use need
// (llm.Request.Reservation): the model must be configured and the
// account must have credits (when enforced). The model's monthly token
// quota, counting the tokens reserved by the account's completions still
// running, must not be used up, else its fallback model serves (whose own
// quota is checked in turn). The call then holds need of the quota and
// its price of the credits, so that concurrent calls are admitted against
// what the ones before them may use; settle (or release, for a call that
// delivered nothing) gives them back.
func (s *Server) admitModel(ctx context.Context, own, model string, need llm.Usage) (*modelCall, error) {
	p := s.cfg.Models.Provider(model)
	if p == nil {
		if len(s.cfg.Models.Models()) == 0 {
			return nil, apierr.New(apierr.ModelNotFound, "model %q is not served: this server has no model providers configured", model)
		}
		return nil, apierr.New(apierr.ModelNotFound, "model %q is not served by this server; GET /v1/models lists the models that are", model)
	}
	acct, err := s.accounts.Get(ctx, own)
	if err != nil {
		return nil, err
	}
	c := &modelCall{s: s, acct: acct, p: p, model: model, credits: func() {}}
	if s.cfg.NoAccounting {
		c.acct = nil
		return c, nil
	}
	if err := acct.CheckCredits(); err != nil {
		return nil, err
	}
	for hops := 0; c.p.MonthlyTokenQuota > 0; hops++ {
		used, ok, err := s.meter.ReserveTokens(ctx, own, c.model, need.Total(), c.p.MonthlyTokenQuota)
		if err != nil {
			return nil, err
		}
		if ok {
			c.reserved = max(need.Total(), 1) // what ReserveTokens holds
			break
		}
		if c.p.QuotaFallbackModel == "" || hops >= 8 {
			return nil, &apierr.Error{Code: apierr.SessionQuotaExceeded,
				Message: fmt.Sprintf("Monthly quota exceeded for model %s", c.model),
				Details: map[string]any{"model": c.model, "tokens_used": used, "tokens_limit": c.p.MonthlyTokenQuota,
					"resets_at": account.NextMonth(time.Now().UTC())}}
		}
		c.model, c.p = c.p.QuotaFallbackModel, s.cfg.Models.Provider(c.p.QuotaFallbackModel)
	}
	release, err := acct.HoldCredits(c.p.Cost(need))
	if err != nil {
		c.release()
		return nil, err
	}
	c.credits = release
	return c, nil
}

// settle meters what the call delivered and gives back what it held.
func (c *modelCall) settle(u llm.Usage) {
	if c.done {
		return
	}
	if c.acct != nil {
		c.s.meter.AddTokens(c.acct, c.model, u.PromptTokens, u.CompletionTokens, c.p.Cost(u))
	}
	c.release()
}

// release gives back what the call held, metering nothing (a call that
// delivered nothing); after settle it does nothing.
func (c *modelCall) release() {
	if c.done {
		return
	}
	c.done = true
	if c.reserved > 0 {
		c.s.meter.ReleaseTokens(c.acct.ID, c.model, c.reserved)
	}
	c.credits()
}

func (s *Server) chatCompletions(w http.ResponseWriter, r *http.Request) error {
	body, err := readBody(w, r)
	if err != nil {
		return err
	}
	req, err := llm.ParseRequest(body)
	if err != nil {
		return err
	}
	call, err := s.admitModel(r.Context(), owner(r), req.Model, req.Reservation(body))
	if err != nil {
		return err
	}
	defer call.release()
	if model := call.model; model != req.Model {
		if body, err = llm.SetModel(body, model); err != nil {
			return apierr.Wrap(err, apierr.BadRequest, "the request body must be a JSON object")
		}
		w.Header().Set("Sheepfold-Model-Fallback", model)
		req.Model = model
	}
	if !req.Stream {
		resp, err := s.cfg.Models.Complete(r.Context(), req, body)
		if err != nil {
			return err
		}
		call.settle(resp.Usage)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		w.Write(resp.Body)
		return nil
	}
	// Headers go with the first event: an error before it is a plain
	// JSON error with its status, one after it an error event, the way
	// OpenAI's own streams report one ({"error":{...}}).
	rc := http.NewResponseController(w)
	started := false
	u, err := s.cfg.Models.Stream(r.Context(), req, body, func(data []byte) error {
		rc.SetWriteDeadline(time.Now().Add(streamWriteTimeout))
		if !started {
			started = true
			h := w.Header()
			h.Set("Content-Type", "text/event-stream")
			h.Set("Cache-Control", "no-cache")
			h.Set("X-Accel-Buffering", "no")
			w.WriteHeader(http.StatusOK)
		}
		buf := make([]byte, 0, len(data)+8)
		buf = append(append(append(buf, "data: "...), data...), "\n\n"...)
		if _, err := w.Write(buf); err != nil {
			return err
		}
		return rc.Flush()
	})
	call.settle(u) // what was delivered, also of a stream cut short
	if err == nil || clientGone(r.Context()) {
		return nil // (a drain's cut is told: ERR_SHUTTING_DOWN)
	}
	if !started {
		return err
	}
	_, ej := s.errorJSON(r, err)
	b, _ := json.Marshal(api.Error{Error: ej})
	w.Write(append(append([]byte("data: "), b...), "\n\n"...))
	rc.Flush()
	return nil
}
