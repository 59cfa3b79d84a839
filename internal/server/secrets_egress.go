package server

import (
	"context"
	"fmt"
	"sync"

	"github.com/sheepfold/sheepfold/internal/apierr"
	"github.com/sheepfold/sheepfold/internal/egress"
	"github.com/sheepfold/sheepfold/internal/policy"
	"github.com/sheepfold/sheepfold/internal/secrets"
	"github.com/sheepfold/sheepfold/internal/store"
)

// Secrets at the egress gateway (issue 33): the gateway of every sandbox
// resolves the secrets its policy's rules name through EgressSecrets, in
// the account that owns the sandbox; a policy naming a secret its account
// does not have is refused when it is given (checkPolicySecrets).

// EgressSecrets resolves, for the egress gateways (egress.Options.Secrets),
// the secrets of the account that owns each sandbox.
type EgressSecrets struct {
	st  store.Store
	svc *secrets.Service

	// mu guards owners.
	mu     sync.Mutex
	owners map[string]string // sandbox → its account
}

var _ egress.Secrets = (*EgressSecrets)(nil)

// NewEgressSecrets returns the resolver over the store's sandboxes and svc.
func NewEgressSecrets(st store.Store, svc *secrets.Service) *EgressSecrets {
	return &EgressSecrets{st: st, svc: svc, owners: map[string]string{}}
}

// maxOwners bounds the remembered owners of sandboxes.
const maxOwners = 10_000

// owner returns the account that owns the sandbox.
func (e *EgressSecrets) owner(ctx context.Context, sandboxID string) (string, error) {
	e.mu.Lock()
	own, ok := e.owners[sandboxID]
	e.mu.Unlock()
	if ok {
		return own, nil
	}
	rec, err := e.st.GetSandbox(ctx, sandboxID)
	if err != nil {
		return "", fmt.Errorf("the owner of sandbox %s: %w", sandboxID, err)
	}
	e.mu.Lock()
	if len(e.owners) >= maxOwners {
		clear(e.owners)
	}
	e.owners[sandboxID] = rec.Owner
	e.mu.Unlock()
	return rec.Owner, nil
}

// Resolve implements egress.Secrets.
func (e *EgressSecrets) Resolve(ctx context.Context, sandboxID, name string) ([]byte, error) {
	own, err := e.owner(ctx, sandboxID)
	if err != nil {
		return nil, err
	}
	return e.svc.Resolve(ctx, own, name)
}

// Used implements egress.Secrets: the gateway emits each use as an event.
func (e *EgressSecrets) Used(egress.SecretUse) {}

// checkPolicySecrets refuses a policy whose rules, or env values, name a
// secret the account does not have (ERR_INVALID_POLICY naming the field).
func (s *Server) checkPolicySecrets(ctx context.Context, own string, p *policy.Policy, env map[string]string) error {
	named := policy.RuleSecrets(p.NetworkPolicy())
	for k, v := range env {
		names, ok := policy.Placeholders(v)
		if !ok {
			return &apierr.Error{Code: apierr.BadRequest, Details: map[string]any{"field": "env." + k},
				Message: fmt.Sprintf("env.%s holds a malformed placeholder: write ${secrets.NAME}", k)}
		}
		for _, n := range names {
			if _, seen := named[n]; !seen {
				named[n] = "env." + k
			}
		}
	}
	if len(named) == 0 {
		return nil
	}
	if s.secrets == nil {
		return errNoSecrets
	}
	for name, field := range named {
		_, err := s.secrets.Get(ctx, own, name)
		if apierr.CodeOf(err) == apierr.NotFound {
			code := apierr.InvalidPolicy
			if field[:4] == "env." {
				code = apierr.BadRequest
			}
			return &apierr.Error{Code: code, Details: map[string]any{"field": field, "secret": name},
				Message: fmt.Sprintf("%s names secret %q, which this account does not have: create it first (POST /v1/secrets)", field, name)}
		}
		if err != nil {
			return err
		}
	}
	return nil
}
