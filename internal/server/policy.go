package server

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"

	"github.com/sheepfold/sheepfold/internal/apierr"
	"github.com/sheepfold/sheepfold/internal/policy"
)

// Security policies (internal/policy): given at create as security_policy
// (or the seeds' sandbox_config shorthand), read and replaced here.

func (s *Server) policyRoutes(add addFunc) {
	add("GET /v1/sandboxes/{id}/policy", true, s.getPolicy)
	add("PUT /v1/sandboxes/{id}/policy", true, s.putPolicy)
}

// policyAnswer is the body of both policy endpoints.
type policyAnswer struct {
	Policy json.RawMessage `json:"policy"`
	// RestartRequired: the change loosened a rule a running interpreter
	// cannot drop; each code context restarts (losing its state) before
	// its next execution.
	RestartRequired bool     `json:"restart_required"`
	Loosened        []string `json:"loosened,omitempty"`
}

// invalidPolicy renders a policy parse error as ERR_INVALID_POLICY naming
// the field.
func invalidPolicy(err error) error {
	if fe, ok := err.(*policy.FieldError); ok {
		return &apierr.Error{Code: apierr.InvalidPolicy, Message: fe.Error(), Details: map[string]any{"field": fe.Field}}
	}
	return err
}

// parsePolicy parses a security_policy body; nil for none.
func parsePolicy(raw json.RawMessage) (*policy.Policy, error) {
	p, err := policy.Parse(raw)
	if err != nil {
		return nil, invalidPolicy(err)
	}
	return p, nil
}

func policyJSON(p *policy.Policy) json.RawMessage {
	if p == nil {
		return json.RawMessage("{}")
	}
	b, _ := json.Marshal(p)
	return b
}

func (s *Server) getPolicy(w http.ResponseWriter, r *http.Request) error {
	b, err := s.lookup(r)
	if apierr.CodeOf(err) == apierr.SandboxState {
		rec, rerr := s.store.GetSandbox(r.Context(), r.PathValue("id"))
		if rerr != nil {
			return rerr
		}
		out := rec.Policy
		if len(out) == 0 {
			out = json.RawMessage("{}")
		}
		writeJSON(w, http.StatusOK, policyAnswer{Policy: out})
		return nil
	}
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, policyAnswer{Policy: policyJSON(b.sb.Policy())})
	return nil
}

// putPolicy replaces a sandbox's policy. The body is the whole new policy
// (as security_policy at create); rules left out are unset.
func (s *Server) putPolicy(w http.ResponseWriter, r *http.Request) error {
	raw, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxJSONBody))
	if err != nil {
		return apierr.Wrap(err, apierr.BadRequest, "the request body is larger than %d bytes", maxJSONBody)
	}
	if len(raw) == 0 {
		return apierr.New(apierr.InvalidPolicy, "the request body must be a security policy object")
	}
	p, err := parsePolicy(raw)
	if err != nil {
		return err
	}
	if p == nil {
		p = &policy.Policy{}
	}
	b, err := s.lookup(r)
	if err != nil {
		return err
	}
	if err := s.checkPolicyLimits(r.Context(), b.owner, p); err != nil {
		return err
	}
	ch, err := b.sb.SetPolicy(p)
	if err != nil {
		return err
	}
	out := policyJSON(p)
	if err := s.store.UpdateSandboxPolicy(r.Context(), b.sb.ID, out); err != nil {
		return fmt.Errorf("record policy: %w", err)
	}
	writeJSON(w, http.StatusOK, policyAnswer{Policy: out, RestartRequired: ch.RestartRequired, Loosened: ch.Loosened})
	return nil
}
