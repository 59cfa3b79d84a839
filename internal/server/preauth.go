package server

import (
	"context"
	"net/http"

	"github.com/sheepfold/sheepfold/internal/preview"
	"github.com/sheepfold/sheepfold/internal/store"
)

// Authentication before work. The /v1 API authenticates every request
// (endpoint) before its handler runs: one hash of the key, one look-up
// by it. The E2B surface checks its tokens and signatures before it looks
// a sandbox up (internal/e2b). Previews are the one surface where a
// request may be anonymous by right (a port made public, E2B's public
// traffic): there the credentials that hold by themselves are checked
// first, and an anonymous request goes on only where the port may be
// public, so that on a replica it adopts (sandbox.Manager.Adopt) only a
// sandbox whose traffic is public.

// previewCredentialed reports whether r carries a credential for t that
// holds by itself, one HMAC and nothing looked up: the sandbox's preview
// token, an E2B traffic token of it (whose key previewAllowed checks
// next), a signed preview parameter or the cookie it set.
func (s *Server) previewCredentialed(r *http.Request, t preview.Target) bool {
	return s.previewKeys.Credentialed(r, t, func(tok string) bool { return s.e2b.IsTrafficToken(t.ID, tok) })
}

// previewMayBePublic reports whether an anonymous preview request for
// sandbox id may go on to its sandbox, where public ports decide. A
// sandbox held here, or one that no running record names, goes on (no
// adoption follows: the answer is the held box's, or 502). On a replica
// a sandbox held elsewhere goes on only when its record says its E2B
// traffic is public, since ports made public through /v1 are each
// replica's own (shared.go): one read of its record by id, never an
// adoption for a private one.
func (s *Server) previewMayBePublic(ctx context.Context, id string) bool {
	if !s.shared() {
		return true
	}
	s.mu.Lock()
	b, held := s.boxes[id]
	s.mu.Unlock()
	if held && b.sb != nil {
		return true
	}
	rec, err := s.store.GetSandbox(ctx, id)
	if err != nil || rec.State == store.SandboxStopped {
		return true
	}
	var res recordResources
	if unmarshalObject(rec.Resources, &res) != nil {
		return false
	}
	return res.E2B != nil && res.E2B.PublicTraffic
}
