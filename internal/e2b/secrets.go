package e2b

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sheepfold/sheepfold/internal/apierr"
)

// E2B's Secret API (/secrets) over the account's secrets (internal/
// secrets, the same store as /v1/secrets): create, list, get, a new
// version, delete. A value is accepted and never given back; the answer
// is E2B's Secret {secretID, name, metadata, currentVersion, createdAt,
// updatedAt}.
//
// Names. E2B lower-cases a name before storing it and reserves the
// prefix sec_ for identifiers; its SDKs refuse only an empty name and
// braces or control characters (they would break the placeholder
// ${e2b.secrets.NAME}). Here a name is lower-cased and must then be one
// internal/secrets stores (its refusal is the answer) (letters, digits, underscores and hyphens, not
// starting with a digit or a hyphen, at most 64): a name outside it (a
// space, a dot, a slash, non-ASCII) is 400 naming the rule, so that every
// secret made through E2B is also reachable through /v1 and the
// placeholder ${secrets.NAME} by the same name.
//
// Identifiers. A secret's secretID is derived, not stored: "sec_" and 32
// hex digits of a SHA-256 of the account, the name and the creation time,
// so it is stable while the secret lives, differs for a secret deleted
// and made again under the same name, and says nothing of another
// account's. A selector ({secretID} in a path) is looked up as an
// identifier when it starts with sec_ (among the account's secrets, at
// most a few hundred), else as a name, as written and then lower-cased.

// SecretInfo is what the store shows of a secret (internal/SecretInfo,
// as the server's Backend gives it): never a value.
type SecretInfo struct {
	Name      string
	Metadata  map[string]string
	Version   int64
	CreatedAt time.Time
	UpdatedAt time.Time
}

// Secrets is the accounts' secrets store (internal/secrets.Service, through
// the server): its errors carry apierr codes (ERR_NOT_FOUND for a secret
// the account has not, ERR_BAD_REQUEST for a name it refuses).
type Secrets interface {
	Create(ctx context.Context, owner, name, value string, metadata map[string]string) (SecretInfo, error)
	Get(ctx context.Context, owner, name string) (SecretInfo, error)
	List(ctx context.Context, owner string) ([]SecretInfo, error)
	Update(ctx context.Context, owner, name, value string, metadata map[string]string) (SecretInfo, error)
	Delete(ctx context.Context, owner, name string) error
}

// secretIDPrefix starts every secret identifier; no name may.
const secretIDPrefix = "sec_"

// secretJSON is E2B's Secret: never a value.
type secretJSON struct {
	SecretID       string            `json:"secretID"`
	Name           string            `json:"name"`
	Metadata       map[string]string `json:"metadata"`
	CurrentVersion int64             `json:"currentVersion"`
	CreatedAt      time.Time         `json:"createdAt"`
	UpdatedAt      time.Time         `json:"updatedAt"`
}

// newSecretJSON is E2B's NewSecret, secretUpdateJSON its SecretUpdate.
type newSecretJSON struct {
	Name     *string           `json:"name"`
	Value    *string           `json:"value"`
	Metadata map[string]string `json:"metadata"`
}

type secretUpdateJSON struct {
	Value    *string           `json:"value"`
	Metadata map[string]string `json:"metadata"`
}

// secretID is the identifier of owner's secret info.
func secretID(owner string, info SecretInfo) string {
	h := sha256.New()
	h.Write([]byte("sheepfold-e2b-secret-id\x00" + owner + "\x00" + info.Name + "\x00"))
	h.Write(strconv.AppendInt(nil, info.CreatedAt.UnixMicro(), 10))
	return secretIDPrefix + hex.EncodeToString(h.Sum(nil)[:16])
}

func secretOf(owner string, info SecretInfo) secretJSON {
	md := info.Metadata
	if md == nil {
		md = map[string]string{}
	}
	return secretJSON{SecretID: secretID(owner, info), Name: info.Name, Metadata: md, CurrentVersion: info.Version,
		CreatedAt: info.CreatedAt, UpdatedAt: info.UpdatedAt}
}

// errNoSecrets answers on a server that keeps no secrets.
var errNoSecrets = apierr.New(apierr.StorageUnavailable, "this server keeps no secrets")

func (h *Handler) secretStore() (Secrets, error) {
	s := h.backend.Secrets()
	if s == nil {
		return nil, errNoSecrets
	}
	return s, nil
}

func secretNotFound(sel string) error {
	return &statusError{http.StatusNotFound, "secret " + strconv.Quote(sel) + " not found"}
}

// lookupSecret finds owner's secret by identifier or name.
func lookupSecret(ctx context.Context, st Secrets, owner, sel string) (SecretInfo, error) {
	if strings.HasPrefix(sel, secretIDPrefix) {
		l, err := st.List(ctx, owner)
		if err != nil {
			return SecretInfo{}, err
		}
		for _, info := range l {
			if secretID(owner, info) == sel {
				return info, nil
			}
		}
	}
	for _, name := range []string{sel, strings.ToLower(sel)} {
		info, err := st.Get(ctx, owner, name)
		if c := apierr.CodeOf(err); c == apierr.NotFound || c == apierr.BadRequest {
			continue // a name no secret can have is not found, as E2B answers
		}
		return info, err
	}
	return SecretInfo{}, secretNotFound(sel)
}

// maxSecretsPage is the largest page of GET /secrets (E2B's default).
const maxSecretsPage = 100

// listSecrets is GET /secrets: the account's secrets by name, a page of
// ?limit (1 to 100, 100) from ?nextToken, and X-Next-Token when more
// follow.
func (h *Handler) listSecrets(w http.ResponseWriter, r *http.Request, owner string) error {
	st, err := h.secretStore()
	if err != nil {
		return err
	}
	q := r.URL.Query()
	limit := maxSecretsPage
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxSecretsPage {
			return badRequest("limit must be an integer from 1 to %d", maxSecretsPage)
		}
		limit = n
	}
	after := ""
	if v := q.Get("nextToken"); v != "" {
		b, err := base64.RawURLEncoding.DecodeString(v)
		if err != nil || len(b) == 0 {
			return badRequest("nextToken is not one this server gave")
		}
		after = string(b)
	}
	l, err := st.List(r.Context(), owner)
	if err != nil {
		return err
	}
	slices.SortFunc(l, func(a, b SecretInfo) int { return strings.Compare(a.Name, b.Name) })
	i, _ := slices.BinarySearchFunc(l, after, func(s SecretInfo, n string) int { return strings.Compare(s.Name, n) })
	if i < len(l) && after != "" && l[i].Name == after {
		i++
	}
	page := l[i:min(i+limit, len(l))]
	out := make([]secretJSON, len(page))
	for j, info := range page {
		out[j] = secretOf(owner, info)
	}
	if i+len(page) < len(l) {
		w.Header().Set("X-Next-Token", base64.RawURLEncoding.EncodeToString([]byte(page[len(page)-1].Name)))
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// createSecret is POST /secrets.
func (h *Handler) createSecret(w http.ResponseWriter, r *http.Request, owner string) error {
	st, err := h.secretStore()
	if err != nil {
		return err
	}
	var req newSecretJSON
	if err := decodeBody(r, &req); err != nil {
		return err
	}
	switch {
	case req.Name == nil || *req.Name == "":
		return badRequest("name is required")
	case req.Value == nil:
		return badRequest("value is required")
	}
	name := strings.ToLower(*req.Name)
	if strings.HasPrefix(name, secretIDPrefix) {
		return badRequest("name %q starts with %q, which is reserved for secret identifiers", *req.Name, secretIDPrefix)
	}
	info, err := st.Create(r.Context(), owner, name, *req.Value, req.Metadata)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, secretOf(owner, info))
	return nil
}

// getSecret is GET /secrets/{secretID}, by identifier or name.
func (h *Handler) getSecret(w http.ResponseWriter, r *http.Request, owner string) error {
	_, info, err := h.pathSecret(r, owner)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, secretOf(owner, info))
	return nil
}

// pathSecret is the secret the request's path names ({secretID}: its
// identifier or name), and the store that holds it.
func (h *Handler) pathSecret(r *http.Request, owner string) (Secrets, SecretInfo, error) {
	st, err := h.secretStore()
	if err != nil {
		return nil, SecretInfo{}, err
	}
	info, err := lookupSecret(r.Context(), st, owner, r.PathValue("secretID"))
	return st, info, err
}

// updateSecret is POST /secrets/{secretID}: a new version of the value
// (metadata, when given, replaces the secret's).
func (h *Handler) updateSecret(w http.ResponseWriter, r *http.Request, owner string) error {
	st, err := h.secretStore()
	if err != nil {
		return err
	}
	var req secretUpdateJSON
	if err := decodeBody(r, &req); err != nil {
		return err
	}
	if req.Value == nil {
		return badRequest("value is required")
	}
	info, err := lookupSecret(r.Context(), st, owner, r.PathValue("secretID"))
	if err != nil {
		return err
	}
	info, err = st.Update(r.Context(), owner, info.Name, *req.Value, req.Metadata)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, secretOf(owner, info))
	return nil
}

// deleteSecret is DELETE /secrets/{secretID}: 204, or 404.
func (h *Handler) deleteSecret(w http.ResponseWriter, r *http.Request, owner string) error {
	st, info, err := h.pathSecret(r, owner)
	if err != nil {
		return err
	}
	if err := st.Delete(r.Context(), owner, info.Name); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}
