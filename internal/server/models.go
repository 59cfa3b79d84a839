package server

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"time"

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

// chooseModel admits a completion of model for own: the model must be
// configured, the account must have credits (when enforced), and the
// model's monthly token quota must not be used up, else its fallback
// model serves (whose own quota is checked in turn).
func (s *Server) chooseModel(ctx context.Context, own, model string) (*account.Account, *llm.Provider, string, error) {
	p := s.cfg.Models.Provider(model)
	if p == nil {
		if len(s.cfg.Models.Models()) == 0 {
			return nil, nil, "", apierr.New(apierr.ModelNotFound, "model %q is not served: this server has no model providers configured", model)
		}
		return nil, nil, "", apierr.New(apierr.ModelNotFound, "model %q is not served by this server; GET /v1/models lists the models that are", model)
	}
	acct, err := s.accounts.Get(ctx, own)
	if err != nil {
		return nil, nil, "", err
	}
	if s.cfg.NoAccounting {
		return acct, p, model, nil
	}
	if err := acct.CheckCredits(); err != nil {
		return nil, nil, "", err
	}
	for hops := 0; p.MonthlyTokenQuota > 0; hops++ {
		used, err := s.meter.TokensThisMonth(ctx, own, model)
		if err != nil {
			return nil, nil, "", err
		}
		if used < p.MonthlyTokenQuota {
			break
		}
		if p.QuotaFallbackModel == "" || hops >= 8 {
			return nil, nil, "", &apierr.Error{Code: apierr.SessionQuotaExceeded,
				Message: fmt.Sprintf("Monthly quota exceeded for model %s", model),
				Details: map[string]any{"model": model, "tokens_used": used, "tokens_limit": p.MonthlyTokenQuota,
					"resets_at": account.NextMonth(time.Now().UTC())}}
		}
		model, p = p.QuotaFallbackModel, s.cfg.Models.Provider(p.QuotaFallbackModel)
	}
	return acct, p, model, nil
}

// meterTokens meters one completion.
func (s *Server) meterTokens(acct *account.Account, p *llm.Provider, model string, u llm.Usage) {
	if s.cfg.NoAccounting || acct == nil {
		return
	}
	s.meter.AddTokens(acct, model, u.PromptTokens, u.CompletionTokens, p.Cost(u))
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
	acct, p, model, err := s.chooseModel(r.Context(), owner(r), req.Model)
	if err != nil {
		return err
	}
	if model != req.Model {
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
		s.meterTokens(acct, p, model, resp.Usage)
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
	s.meterTokens(acct, p, model, u)
	if err == nil || clientGone(r.Context()) {
		return nil // (a drain's cut is told: ERR_SHUTTING_DOWN)
	}
	if !started {
		return err
	}
	_, ej := s.errorJSON(r, err)
	b, _ := json.Marshal(errorBody{Error: ej})
	w.Write(append(append([]byte("data: "), b...), "\n\n"...))
	rc.Flush()
	return nil
}
