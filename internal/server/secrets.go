package server

import (
	"net/http"
	"strconv"

	"github.com/sheepfold/sheepfold/api"
	"github.com/sheepfold/sheepfold/internal/apierr"
	"github.com/sheepfold/sheepfold/internal/secrets"
	"github.com/sheepfold/sheepfold/internal/store"
)

// Secrets (internal/secrets): an account's named values, written and
// never read back through any API. This file is their routes alone.

func (s *Server) secretRoutes(add addFunc) {
	add("POST /v1/secrets", true, s.createSecret)
	add("GET /v1/secrets", true, s.listSecrets)
	add("GET /v1/secrets/{name}", true, s.getSecret)
	add("PUT /v1/secrets/{name}", true, s.updateSecret)
	add("POST /v1/secrets/{name}/versions", true, s.updateSecret)
	add("DELETE /v1/secrets/{name}", true, s.deleteSecret)
	add("GET /v1/secrets/{name}/uses", true, s.secretUses)
}

// errNoSecrets answers on a server without a store (tests of routes).
var errNoSecrets = apierr.New(apierr.StorageUnavailable, "this server keeps no secrets: it has no store")

func (s *Server) createSecret(w http.ResponseWriter, r *http.Request) error {
	if s.secrets == nil {
		return errNoSecrets
	}
	var req api.SecretRequest
	if err := decodeJSON(w, r, &req, false); err != nil {
		return err
	}
	info, err := s.secrets.Create(r.Context(), owner(r), req.Name, req.Value, req.Metadata)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, info)
	return nil
}

func (s *Server) listSecrets(w http.ResponseWriter, r *http.Request) error {
	if s.secrets == nil {
		return errNoSecrets
	}
	l, err := s.secrets.List(r.Context(), owner(r))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, map[string]any{"secrets": l})
	return nil
}

func (s *Server) getSecret(w http.ResponseWriter, r *http.Request) error {
	if s.secrets == nil {
		return errNoSecrets
	}
	info, err := s.secrets.Get(r.Context(), owner(r), r.PathValue("name"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, info)
	return nil
}

func (s *Server) updateSecret(w http.ResponseWriter, r *http.Request) error {
	if s.secrets == nil {
		return errNoSecrets
	}
	var req api.SecretVersionRequest
	if err := decodeJSON(w, r, &req, false); err != nil {
		return err
	}
	info, err := s.secrets.Update(r.Context(), owner(r), r.PathValue("name"), req.Value, req.Metadata)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, info)
	return nil
}

func (s *Server) deleteSecret(w http.ResponseWriter, r *http.Request) error {
	if s.secrets == nil {
		return errNoSecrets
	}
	if err := s.secrets.Delete(r.Context(), owner(r), r.PathValue("name")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// secretUses lists a secret's uses at the egress gateway, newest first:
// ?limit= (1 to 1000, 100) and ?before= (an id: the next page).
func (s *Server) secretUses(w http.ResponseWriter, r *http.Request) error {
	if s.secrets == nil {
		return errNoSecrets
	}
	q := r.URL.Query()
	limit, before := 100, int64(0)
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			return &apierr.Error{Code: apierr.BadRequest, Message: "limit must be an integer from 1 to 1000", Details: map[string]any{"field": "limit"}}
		}
		limit = n
	}
	if v := q.Get("before"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 1 {
			return &apierr.Error{Code: apierr.BadRequest, Message: "before must be a use's id", Details: map[string]any{"field": "before"}}
		}
		before = n
	}
	l, err := s.secrets.Uses(r.Context(), owner(r), r.PathValue("name"), before, limit)
	if err != nil {
		return err
	}
	out := map[string]any{"uses": l}
	if len(l) == limit {
		out["next"] = strconv.FormatInt(l[len(l)-1].ID, 10)
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// ownSecrets is the service of a server given none: its values sealed
// with a random key of the server's own, which no restart keeps.
func ownSecrets(st store.SecretStore) *secrets.Service {
	line, err := secrets.NewKeyLine("ephemeral")
	if err != nil {
		panic(err) // crypto/rand never fails on Linux
	}
	k, err := secrets.ParseKeys(line)
	if err != nil {
		panic(err)
	}
	svc, err := secrets.New(st, k, secrets.Options{})
	if err != nil {
		panic(err)
	}
	return svc
}
