package server

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sheepfold/sheepfold/api"
	"github.com/sheepfold/sheepfold/internal/account"
	"github.com/sheepfold/sheepfold/internal/apierr"
	"github.com/sheepfold/sheepfold/internal/e2b"
	"github.com/sheepfold/sheepfold/internal/runtime"
	"github.com/sheepfold/sheepfold/internal/sandbox"
	"github.com/sheepfold/sheepfold/internal/secrets"
	"github.com/sheepfold/sheepfold/internal/store"
)

// e2bBackend gives the E2B surface (internal/e2b) the server's keys,
// ownership and records: an E2B client sees exactly the sandboxes of its
// key's owner, like a /v1 client.
type e2bBackend struct{ s *Server }

var _ e2b.Backend = e2bBackend{}

// Authenticate checks the key and takes the request from its account's
// per-minute budget (E2B clients get 429 with a numeric code).
func (b e2bBackend) Authenticate(ctx context.Context, key string) (string, string, error) {
	p, err := b.s.auth.Check(ctx, key)
	if err == nil {
		err = b.s.paces.wait(ctx, p.Owner)
	}
	if err != nil || b.s.cfg.NoAccounting {
		return p.Owner, p.KeyID, classify(err)
	}
	a, err := b.s.accounts.Get(ctx, p.Owner)
	if err != nil {
		return "", "", classify(err)
	}
	res, err := a.AllowRequest(ctx)
	if err != nil {
		return "", "", classify(err)
	}
	if !res.Allowed {
		return "", "", account.RateLimitError(res, "requests")
	}
	return p.Owner, p.KeyID, nil
}

// e2bLearnInterval is e2b.Config.LearnInterval (0: its default); tests
// change it.
var e2bLearnInterval time.Duration

// keyCacheTTL is how long a key's state is trusted: a key revoked (by
// `sheepfold keys revoke`, another process) stops its E2B tokens within it.
const keyCacheTTL = 2 * time.Second

// keyState is a cached look-up of a key.
type keyState struct {
	owner string
	err   error
	at    time.Time
}

// KeyOwner returns the owner of a live key, from a cache of keyCacheTTL.
func (b e2bBackend) KeyOwner(ctx context.Context, keyID string) (string, error) {
	s := b.s
	s.keysMu.Lock()
	ks, ok := s.keys[keyID]
	s.keysMu.Unlock()
	if ok && time.Since(ks.at) < keyCacheTTL {
		return ks.owner, ks.err
	}
	k, err := s.store.KeyByID(ctx, keyID)
	switch {
	case errors.Is(err, store.ErrNotFound):
		err = apierr.New(apierr.AuthenticationFailed, "unknown key")
	case err != nil:
		return "", classify(err) // not cached: the store may answer next time
	case k.RevokedAt != nil:
		err = apierr.New(apierr.AuthenticationFailed, "the key was revoked")
	}
	s.keysMu.Lock()
	if len(s.keys) > 10000 {
		clear(s.keys) // keys are few; a flood of made-up ids does not grow it
	}
	s.keys[keyID] = keyState{owner: k.Owner, err: err, at: time.Now()}
	s.keysMu.Unlock()
	return k.Owner, err
}

func (b e2bBackend) Create(ctx context.Context, owner string, opt sandbox.CreateOptions, origin e2b.Origin) (*sandbox.Sandbox, error) {
	if sb, ok, err := b.createFromSnapshot(ctx, owner, opt, origin); ok {
		return sb, classify(err)
	}
	sb, err := b.s.create(ctx, owner, opt, 0, &origin)
	return sb, classify(err)
}

// Secrets implements e2b.Backend: the server's secrets (/v1/secrets).
func (b e2bBackend) Secrets() e2b.Secrets {
	if b.s.secrets == nil {
		return nil
	}
	return e2bSecrets{b.s.secrets}
}

// e2bSecrets gives the E2B surface the secrets service in its own terms
// (internal/e2b imports no store).
type e2bSecrets struct{ svc *secrets.Service }

func e2bSecretOf(i secrets.Info) e2b.SecretInfo {
	return e2b.SecretInfo{Name: i.Name, Metadata: i.Metadata, Version: i.Version, CreatedAt: i.CreatedAt, UpdatedAt: i.UpdatedAt}
}

func (e e2bSecrets) Create(ctx context.Context, owner, name, value string, md map[string]string) (e2b.SecretInfo, error) {
	i, err := e.svc.Create(ctx, owner, name, value, md)
	return e2bSecretOf(i), err
}

func (e e2bSecrets) Get(ctx context.Context, owner, name string) (e2b.SecretInfo, error) {
	i, err := e.svc.Get(ctx, owner, name)
	return e2bSecretOf(i), err
}

func (e e2bSecrets) List(ctx context.Context, owner string) ([]e2b.SecretInfo, error) {
	l, err := e.svc.List(ctx, owner)
	out := make([]e2b.SecretInfo, len(l))
	for i, s := range l {
		out[i] = e2bSecretOf(s)
	}
	return out, err
}

func (e e2bSecrets) Update(ctx context.Context, owner, name, value string, md map[string]string) (e2b.SecretInfo, error) {
	i, err := e.svc.Update(ctx, owner, name, value, md)
	return e2bSecretOf(i), err
}

func (e e2bSecrets) Delete(ctx context.Context, owner, name string) error {
	return e.svc.Delete(ctx, owner, name)
}

// SignerKeys implements e2b.Backend. Only replicas need it: a server
// alone issued every token of its sandboxes itself. The E2B surface asks
// at most once per e2b.Config.LearnInterval (a signed URL whose token it
// does not know), never once per request.
func (b e2bBackend) SignerKeys(ctx context.Context) map[string][]string {
	if !b.s.shared() {
		return nil
	}
	recs, err := b.s.store.ListSandboxes(ctx, store.SandboxFilter{AnyOwner: true, State: store.SandboxRunning})
	if err != nil {
		return nil
	}
	keys, err := b.s.store.ListKeys(ctx)
	if err != nil {
		return nil
	}
	byOwner := map[string][]string{}
	for _, k := range keys {
		if k.RevokedAt == nil {
			byOwner[k.Owner] = append(byOwner[k.Owner], k.ID)
		}
	}
	out := make(map[string][]string, len(recs))
	for _, rec := range recs {
		out[rec.ID] = byOwner[rec.Owner]
	}
	return out
}

// BeginExecution records a code-interpreter execution as the /v1 API
// records its own: the sandbox's page in the dashboard lists both.
func (b e2bBackend) BeginExecution(ctx context.Context, sb *sandbox.Sandbox, language, code string) e2b.RecordedExecution {
	b.s.mu.Lock()
	bx := b.s.boxes[sb.ID]
	b.s.mu.Unlock()
	owner := ""
	if bx != nil {
		owner = bx.owner
	}
	return b.s.recordExecution(ctx, sb.ID, owner, newID("exe_"), language, code)
}

// Sandbox returns a running sandbox; owner "" matches any owner.
func (b e2bBackend) Sandbox(ctx context.Context, owner, id string) (*sandbox.Sandbox, error) {
	if owner == "" && b.s.shared() {
		// Perhaps another replica's: its record, which decides, names
		// its owner.
		rec, err := b.s.store.GetSandbox(ctx, id)
		if err != nil {
			return nil, notFound(id)
		}
		bx, err := b.s.lookupRecord(ctx, rec)
		if err != nil {
			return nil, classify(err)
		}
		return bx.sb, nil
	}
	if owner == "" {
		b.s.mu.Lock()
		bx, ok := b.s.boxes[id]
		b.s.mu.Unlock()
		if !ok || bx.sb == nil {
			return nil, notFound(id)
		}
		owner = bx.owner
	}
	bx, err := b.s.lookupID(ctx, owner, id)
	if err != nil {
		return nil, classify(err)
	}
	return bx.sb, nil
}

// Sandboxes lists running sandboxes; owner "" lists every owner's.
func (b e2bBackend) Sandboxes(ctx context.Context, owner string) []*sandbox.Sandbox {
	if b.s.shared() {
		return b.s.runningShared(ctx, owner)
	}
	b.s.mu.Lock()
	defer b.s.mu.Unlock()
	var out []*sandbox.Sandbox
	for _, bx := range b.s.boxes {
		if bx.sb != nil && (owner == "" || bx.owner == owner) && live(bx.sb) {
			out = append(out, bx.sb)
		}
	}
	return out
}

func (b e2bBackend) SetTimeout(ctx context.Context, owner, id string, d time.Duration) error {
	bx, err := b.s.lookupID(ctx, owner, id)
	if err != nil {
		return classify(err)
	}
	if err := b.s.checkTimeout(ctx, owner, d); err != nil {
		return err
	}
	if err := bx.sb.SetTimeout(ctx, d); err != nil {
		return classify(err)
	}
	if err := b.s.store.UpdateSandboxExpiry(ctx, id, bx.sb.Deadline()); err != nil {
		return classify(fmt.Errorf("record timeout: %w", err))
	}
	return nil
}

// Kill stops a sandbox. For E2B clients a sandbox already stopped is not
// found, as in E2B.
func (b e2bBackend) Kill(ctx context.Context, owner, id string) error {
	bx, err := b.s.lookupID(ctx, owner, id)
	if apierr.CodeOf(err) == apierr.SandboxState {
		return notFound(id)
	}
	if b.s.shared() && apierr.CodeOf(err) == apierr.Internal {
		return classify(b.s.killUnreachable(ctx, owner, id))
	}
	if err != nil {
		return classify(err)
	}
	if err := b.s.recordKill(ctx, id); err != nil {
		return classify(err)
	}
	if err := b.s.engine.Kill(ctx, id); err != nil && apierr.CodeOf(err) != apierr.SandboxNotFound {
		return classify(err)
	}
	b.s.forget(ctx, bx)
	return nil
}

var _ e2b.SnapshotBackend = e2bBackend{}

// Snapshot implements e2b.SnapshotBackend.
func (b e2bBackend) Snapshot(ctx context.Context, owner, id, name string) (string, error) {
	if err := checkSnapshotName("name", name); err != nil {
		return "", classify(err)
	}
	bx, err := b.s.lookupID(ctx, owner, id)
	if err != nil {
		return "", classify(err)
	}
	rec, err := b.s.takeSnapshot(ctx, owner, bx, name)
	return rec.Name, classify(err)
}

// Snapshots implements e2b.SnapshotBackend.
func (b e2bBackend) Snapshots(ctx context.Context, owner, id string) ([]string, error) {
	root, err := b.s.snapshots()
	if err != nil {
		return nil, classify(err)
	}
	recs, err := readSnapshots(root, owner)
	if err != nil {
		return nil, classify(err)
	}
	var out []string
	for _, rec := range recs {
		if id == "" || rec.Sandbox == id {
			out = append(out, rec.Name)
		}
	}
	return out, nil
}

// DeleteSnapshot implements e2b.SnapshotBackend.
func (b e2bBackend) DeleteSnapshot(ctx context.Context, owner, name string) error {
	return classify(b.s.removeSnapshot(owner, name))
}

// Fork implements e2b.SnapshotBackend.
func (b e2bBackend) Fork(ctx context.Context, owner, id string, count int, timeout time.Duration, origin e2b.Origin) ([]*sandbox.Sandbox, error) {
	bx, err := b.s.lookupID(ctx, owner, id)
	if err != nil {
		return nil, classify(err)
	}
	made, err := b.s.fork(ctx, owner, bx, count, timeout, &origin)
	return made, classify(err)
}

// createFromSnapshot starts, for E2B's create, a sandbox from owner's
// snapshot named by E2B's templateID (origin.Alias); ok false: there is
// no such snapshot, and the create is an ordinary one.
func (b e2bBackend) createFromSnapshot(ctx context.Context, owner string, opt sandbox.CreateOptions, origin e2b.Origin) (sb *sandbox.Sandbox, ok bool, err error) {
	name := e2b.SnapshotName(origin.Alias)
	if !snapshotName.MatchString(name) || !b.s.engine.CanSnapshot() {
		return nil, false, nil
	}
	if _, _, err := b.s.findSnapshot(owner, name); err != nil {
		return nil, false, nil
	}
	if len(opt.Env) > 0 || opt.Policy != nil || opt.Limits != (runtime.Limits{}) {
		return nil, true, apierr.New(apierr.BadRequest, "a sandbox started from snapshot %q has the environment, resources and network of the one snapshotted: envVars, cpuCount, memoryMB, diskSizeMB and network options cannot be given", name)
	}
	sopt, execTimeout, release, err := b.s.snapshotCreateOptions(owner, api.CreateSandbox{Snapshot: name, Metadata: opt.Metadata})
	if err != nil {
		return nil, true, err
	}
	defer release()
	sopt.Timeout = opt.Timeout
	sb, err = b.s.create(ctx, owner, sopt, execTimeout, &origin)
	return sb, true, err
}
