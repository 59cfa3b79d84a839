package server

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/sheepfold/sheepfold/api"
	"github.com/sheepfold/sheepfold/internal/apierr"
	"github.com/sheepfold/sheepfold/internal/policy"
)

// Security policies (internal/policy): given at create as security_policy
// (or the seeds' sandbox_config shorthand), read and replaced here.

func (s *Server) policyRoutes(add addFunc) {
	add("GET /v1/sandboxes/{id}/policy", true, s.getPolicy)
	add("PUT /v1/sandboxes/{id}/policy", true, s.putPolicy)
}

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
		writeJSON(w, http.StatusOK, api.PolicyAnswer{Policy: out})
		return nil
	}
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, api.PolicyAnswer{Policy: policyJSON(b.sb.Policy())})
	return nil
}

// putPolicy applies a policy over a sandbox's: each section the body
// sets replaces that section, each it leaves out keeps its rules
// (policy.Merge); the answer is the whole policy now. memory_mb and
// disk_write_mb resize the running sandbox, up to the account's
// max_memory_mb and max_disk_mb.
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
	if err := s.checkPolicySecrets(r.Context(), b.owner, p, nil); err != nil {
		return err
	}
	if err := s.admitResize(b, p); err != nil {
		return err
	}
	ch, err := b.sb.SetPolicy(p)
	// What the host counts for the sandbox is its limits in force now,
	// resized or not.
	s.mu.Lock()
	b.footprint = s.engine.Footprint(b.sb.CurrentLimits())
	s.mu.Unlock()
	if err != nil {
		return err
	}
	s.trustEgress(r.Context(), b.sb)
	out := policyJSON(ch.Policy)
	if err := s.store.UpdateSandboxPolicy(r.Context(), b.sb.ID, out); err != nil {
		return fmt.Errorf("record policy: %w", err)
	}
	writeJSON(w, http.StatusOK, api.PolicyAnswer{Policy: out, RestartRequired: ch.RestartRequired, Loosened: ch.Loosened})
	return nil
}

// admitResize takes the growth of a sandbox a policy raises out of the
// host's memory (Config.HostMemoryBytes, as admit does for a new
// sandbox): ERR_CAPACITY when it does not fit. The caller sets the box's
// footprint to its limits in force once the policy is applied.
func (s *Server) admitResize(b *box, p *policy.Policy) error {
	l := b.sb.CurrentLimits()
	if m := p.MemoryBytes(); m > 0 {
		l.MemoryBytes = m
	}
	if d := p.DiskBytes(); d > 0 {
		l.DiskBytes = d
	}
	next := s.engine.Footprint(l)
	s.mu.Lock()
	defer s.mu.Unlock()
	if next <= b.footprint || s.cfg.HostMemoryBytes <= 0 {
		return nil
	}
	capacity := int64(float64(s.cfg.HostMemoryBytes) * s.cfg.Overcommit)
	used := s.pooled.bytes
	for _, o := range s.boxes {
		used += o.footprint
	}
	if used-b.footprint+next > capacity {
		return &apierr.Error{Code: apierr.Capacity, RetryAfter: time.Second,
			Message: fmt.Sprintf("the host cannot hold this sandbox at %d MiB (memory plus disk): %d of %d MiB are committed",
				next>>20, used>>20, capacity>>20)}
	}
	b.footprint = next
	return nil
}
