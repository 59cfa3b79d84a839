package server

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sheepfold/sheepfold/internal/apierr"
	"github.com/sheepfold/sheepfold/internal/egress"
	"github.com/sheepfold/sheepfold/internal/policy"
	"github.com/sheepfold/sheepfold/internal/sandbox"
	"github.com/sheepfold/sheepfold/internal/secrets"
	"github.com/sheepfold/sheepfold/internal/store"
)

// Secrets at the egress gateway (issue 33): the gateway of every sandbox
// resolves the secrets its policy's rules name through EgressSecrets, in
// the account that owns the sandbox; a policy naming a secret its account
// does not have is refused when it is given (checkPolicySecrets).

// EgressSecrets resolves, for the egress gateways (egress.Options.Secrets),
// the secrets of the account that owns each sandbox, and records their
// uses (the audit: GET /v1/secrets/{name}/uses, use_count). Uses are
// queued and written in batches by one goroutine, so that a request
// through the gateway never waits for a write; Close writes what is
// queued.
type EgressSecrets struct {
	st   store.Store
	svc  *secrets.Service
	log  *slog.Logger
	uses chan egress.SecretUse
	stop chan struct{}
	done chan struct{}
	once sync.Once

	dropped atomic.Int64 // uses not recorded: the queue was full

	// mu guards owners.
	mu     sync.Mutex
	owners map[string]string // sandbox → its account
}

var _ egress.Secrets = (*EgressSecrets)(nil)

// Bounds of the queue of uses.
const (
	usesQueue = 4096
	usesBatch = 256
	usesDelay = 50 * time.Millisecond
)

// NewEgressSecrets returns the resolver over the store's sandboxes and
// svc; Close stops it.
func NewEgressSecrets(st store.Store, svc *secrets.Service, log *slog.Logger) *EgressSecrets {
	if log == nil {
		log = slog.Default()
	}
	e := &EgressSecrets{st: st, svc: svc, log: log, owners: map[string]string{},
		uses: make(chan egress.SecretUse, usesQueue), stop: make(chan struct{}), done: make(chan struct{})}
	go e.record()
	return e
}

// Close writes the uses queued and stops.
func (e *EgressSecrets) Close() {
	e.once.Do(func() { close(e.stop) })
	<-e.done
}

// record writes the queued uses in batches until Close.
func (e *EgressSecrets) record() {
	defer close(e.done)
	for {
		var batch []egress.SecretUse
		select {
		case u := <-e.uses:
			batch = append(batch, u)
		case <-e.stop:
			for {
				select {
				case u := <-e.uses:
					batch = append(batch, u)
				default:
					e.write(batch)
					return
				}
			}
		}
		t := time.NewTimer(usesDelay)
	fill:
		for len(batch) < usesBatch {
			select {
			case u := <-e.uses:
				batch = append(batch, u)
			case <-t.C:
				break fill
			case <-e.stop:
				break fill
			}
		}
		t.Stop()
		e.write(batch)
	}
}

// write records a batch of uses in their sandboxes' accounts.
func (e *EgressSecrets) write(batch []egress.SecretUse) {
	if len(batch) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out := make([]store.SecretUse, 0, len(batch))
	for _, u := range batch {
		own, err := e.owner(ctx, u.SandboxID)
		if err != nil {
			e.log.Warn("secret use not recorded: no owner", "sandbox", u.SandboxID, "secret", u.Secret, "err", err)
			continue
		}
		out = append(out, store.SecretUse{Owner: own, Name: u.Secret, SandboxID: u.SandboxID, Host: u.Host,
			Method: u.Method, Path: u.Path, Outcome: u.Outcome, At: u.At})
	}
	if err := e.svc.RecordUses(ctx, out); err != nil {
		e.log.Error("secret uses not recorded", "count", len(out), "err", err)
	}
	if n := e.dropped.Swap(0); n > 0 {
		e.log.Warn("secret uses not recorded: the queue was full", "count", n)
	}
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
	return e.svc.Value(ctx, own, name)
}

// Used implements egress.Secrets: it queues the use, never waiting.
func (e *EgressSecrets) Used(u egress.SecretUse) {
	select {
	case e.uses <- u:
	default:
		e.dropped.Add(1)
	}
}

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

// egressTrustEnv adds to env (a copy) what points a sandbox's TLS clients
// at the bundle that carries the egress CA (egress.TrustEnv), when the
// gateways terminate TLS and the policy has rules; what the caller set
// stays.
func (s *Server) egressTrustEnv(p *policy.Policy, env map[string]string) map[string]string {
	if s.cfg.EgressCA == nil || p.NetworkPolicy() == nil || len(p.NetworkPolicy().Rules) == 0 {
		return env
	}
	out := make(map[string]string, len(env)+6)
	for k, v := range egress.TrustEnv() {
		out[k] = v
	}
	for k, v := range env {
		out[k] = v
	}
	return out
}

// trustEgress adds the egress CA to the trust stores of a sandbox whose
// policy has rules (sandbox.TrustEgressCA). A sandbox where it cannot be
// written (a read-only filesystem) is logged: its TLS clients then refuse
// the gateway's certificates for those hosts, failing closed.
func (s *Server) trustEgress(ctx context.Context, sb *sandbox.Sandbox) {
	p := sb.Policy()
	if s.cfg.EgressCA == nil || p.NetworkPolicy() == nil || len(p.NetworkPolicy().Rules) == 0 {
		return
	}
	if err := sb.TrustEgressCA(context.WithoutCancel(ctx), s.cfg.EgressCA); err != nil {
		s.log.Warn("the egress CA is not in the sandbox's trust stores: HTTPS to its rules' hosts will fail", "sandbox", sb.ID, "err", err)
	}
}
