package server

import (
	"context"
	"net/http"
	"time"

	"github.com/sheepfold/sheepfold/internal/apierr"
	"github.com/sheepfold/sheepfold/internal/egress"
	"github.com/sheepfold/sheepfold/internal/identity"
)

// Workload identity (issue 33, item 4): the egress gateways mint tokens
// for the sandboxes' requests that rules cover (${identity.token},
// internal/egress inject.go) through EgressIdentity; a relying party
// verifies them with the OIDC discovery document and the JWKS served
// here, public and unauthenticated as OIDC wants.

// identityCache is how long a relying party may keep the documents: a
// new key is published at a restart, and a rotation keeps the older key
// published for far longer (docs/security.md §15.2).
const identityCache = "public, max-age=300"

func (s *Server) identityRoutes(add addFunc) {
	add("GET "+identity.DiscoveryPath, false, s.identityDocument(func(is *identity.Issuer) []byte { return is.Discovery() }))
	add("GET "+identity.JWKSPath, false, s.identityDocument(func(is *identity.Issuer) []byte { return is.JWKS() }))
}

func (s *Server) identityDocument(doc func(*identity.Issuer) []byte) handlerFunc {
	return func(w http.ResponseWriter, r *http.Request) error {
		if s.cfg.Identity == nil {
			return apierr.New(apierr.NotFound, "this server issues no workload identity tokens")
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", identityCache)
		w.Header().Set("Access-Control-Allow-Origin", "*")
		w.Write(doc(s.cfg.Identity))
		return nil
	}
}

// EgressIdentity mints, for the egress gateways (egress.Options.Identity),
// the tokens of the sandboxes, their subject the account that owns each
// (from the sandbox's record, as EgressSecrets finds it).
type EgressIdentity struct {
	owners *EgressSecrets
	is     *identity.Issuer
}

var _ egress.Identity = (*EgressIdentity)(nil)

// NewEgressIdentity returns the minter of is over the owners es finds.
func NewEgressIdentity(es *EgressSecrets, is *identity.Issuer) *EgressIdentity {
	return &EgressIdentity{owners: es, is: is}
}

// Token implements egress.Identity.
func (e *EgressIdentity) Token(ctx context.Context, sandboxID, audience string) (egress.IdentityToken, error) {
	own, err := e.owners.owner(ctx, sandboxID)
	if err != nil {
		return egress.IdentityToken{}, err
	}
	t, err := e.is.Mint(own, sandboxID, audience)
	if err != nil {
		return egress.IdentityToken{}, err
	}
	return egress.IdentityToken{JWT: t.JWT, ID: t.Claims.ID, Subject: t.Claims.Subject, Expires: time.Unix(t.Claims.Expires, 0)}, nil
}
