package server

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sheepfold/sheepfold/api"
	"github.com/sheepfold/sheepfold/internal/account"
	"github.com/sheepfold/sheepfold/internal/apierr"
	"github.com/sheepfold/sheepfold/internal/auth"
	"github.com/sheepfold/sheepfold/internal/bound"
	"github.com/sheepfold/sheepfold/internal/store"
)

// Accounts: the admin API (admin keys only) and the per-request rate
// limit. Accounts are addressed by name or id.

func (s *Server) accountRoutes(add addFunc) {
	add("POST /v1/admin/accounts", true, s.admin(s.createAccount))
	add("GET /v1/admin/accounts", true, s.admin(s.listAccounts))
	add("GET /v1/admin/accounts/{account}", true, s.admin(s.showAccount))
	add("POST /v1/admin/accounts/{account}/limits", true, s.admin(s.setAccountLimits))
	add("POST /v1/admin/accounts/{account}/credits", true, s.admin(s.creditAccount))
	add("POST /v1/admin/accounts/{account}/runtime", true, s.admin(s.setAccountRuntime))
	add("POST /v1/admin/keys", true, s.admin(s.createAccountKey))
	add("GET /v1/account", true, s.showOwnAccount)
}

// admin refuses callers whose key is not an admin key.
func (s *Server) admin(h handlerFunc) handlerFunc {
	return func(w http.ResponseWriter, r *http.Request) error {
		if p, _ := auth.PrincipalFrom(r.Context()); !p.Admin() {
			return apierr.New(apierr.Forbidden, "this call needs an admin key")
		}
		return h(w, r)
	}
}

// limitRequest takes the request from its account's per-minute budget and
// sets the X-RateLimit headers.
func (s *Server) limitRequest(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	a, err := s.accounts.Get(r.Context(), p.Owner)
	if errors.Is(err, store.ErrNotFound) {
		return apierr.Wrap(err, apierr.AuthenticationFailed, "the key's account %q does not exist", p.Owner)
	}
	if err != nil {
		return err
	}
	res, err := a.AllowRequest(r.Context())
	if err != nil {
		return err
	}
	if res.Limit > 0 {
		h := w.Header()
		h.Set("X-RateLimit-Limit", strconv.FormatInt(res.Limit, 10))
		h.Set("X-RateLimit-Remaining", strconv.FormatInt(res.Remaining, 10))
		h.Set("X-RateLimit-Reset", strconv.FormatInt(int64((res.Reset+time.Second-1)/time.Second), 10))
	}
	if !res.Allowed {
		return account.RateLimitError(res, "requests")
	}
	return nil
}

// limitsOf is an account's limits as the API shows them: every field
// set.
func limitsOf(l account.Limits) api.AccountLimits {
	return api.AccountLimits{MaxSandboxes: new(l.MaxSandboxes), RequestsPerMinute: new(l.RequestsPerMinute),
		ExecutionsPerMinute: new(l.ExecutionsPerMinute), MonthlySandboxSeconds: new(l.MonthlySandboxSeconds),
		MonthlyCPUSeconds: new(l.MonthlyCPUSeconds), MonthlyGBSeconds: new(l.MonthlyGBSeconds),
		MonthlyExecutions: new(l.MonthlyExecutions), MaxCPUs: new(l.MaxCPUs), MaxMemoryMB: new(l.MaxMemoryMB),
		MaxDiskMB: new(l.MaxDiskMB), MaxTimeout: new(l.MaxTimeout), MaxDevices: new(l.MaxDevices)}
}

// accountOut describes an account as the API shows it.
func (s *Server) accountOut(r *http.Request, rec store.Account, withKeys bool) (api.Account, error) {
	a, err := s.accounts.Get(r.Context(), rec.ID)
	if err != nil {
		return api.Account{}, err
	}
	used, limits := a.Month()
	_, over := a.Limits()
	now := time.Now()
	out := api.Account{ID: rec.ID, Name: rec.Name, CreatedAt: rec.CreatedAt.UTC(), Limits: limitsOf(limits), Overrides: api.AccountLimits(over),
		RunningSandboxes: a.Running(), Runtime: rec.Runtime, RuntimeLocked: rec.RuntimeLocked,
		Month: api.MonthUsage{Start: account.MonthStart(now), ResetAt: account.NextMonth(now), Usage: api.MonthFigures{
			SandboxSeconds: used.SandboxSeconds, CPUSeconds: used.CPUSeconds, GBSeconds: used.GBSeconds, Executions: used.Executions}}}
	c, err := s.creditsOf(r, a)
	if err != nil {
		return out, err
	}
	out.Credits = &c
	st, err := s.storageOf(r.Context(), rec.ID)
	if err != nil {
		return out, err
	}
	out.Storage = &st
	if withKeys {
		keys, err := s.store.ListKeys(r.Context())
		if err != nil {
			return out, err
		}
		for _, k := range keys {
			if k.Owner == rec.ID {
				out.Keys = append(out.Keys, api.AccountKey{ID: k.ID, Name: k.Name, Role: k.Role, CreatedAt: k.CreatedAt.UTC(), RevokedAt: k.RevokedAt})
			}
		}
	}
	return out, nil
}

// findAccount resolves a path's account by id, then by name
// (account.Find: no name stands for another account's id).
func (s *Server) findAccount(r *http.Request, ref string) (store.Account, error) {
	rec, err := account.Find(r.Context(), s.store, ref)
	if errors.Is(err, store.ErrNotFound) {
		return rec, apierr.New(apierr.NotFound, "account %q not found", ref)
	}
	return rec, err
}

type createAccountRequest struct {
	Name   *string            `json:"name"`
	Limits *account.Overrides `json:"limits"`
}

func (s *Server) createAccount(w http.ResponseWriter, r *http.Request) error {
	var req createAccountRequest
	if err := decodeJSON(w, r, &req, false); err != nil {
		return err
	}
	if req.Name == nil {
		req.Name = new(string)
	}
	if err := account.CheckName(*req.Name); err != nil {
		return err
	}
	var over account.Overrides
	if req.Limits != nil {
		if err := req.Limits.Validate(); err != nil {
			return prefixField(err, "limits.")
		}
		over = *req.Limits
	}
	rec, err := account.Create(r.Context(), s.store, *req.Name, over, s.accounts.Config().FreeCreditsMicros)
	if errors.Is(err, store.ErrExists) {
		return apierr.New(apierr.Conflict, "an account named %q exists already", *req.Name)
	}
	if err != nil {
		return err
	}
	out, err := s.accountOut(r, rec, false)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, out)
	return nil
}

// prefixField puts a prefix before the field name of a validation error.
func prefixField(err error, prefix string) error {
	e := apierr.From(err)
	if e.Code != apierr.BadRequest {
		return err
	}
	return apierr.New(apierr.BadRequest, "%s%s", prefix, e.Message)
}

func (s *Server) listAccounts(w http.ResponseWriter, r *http.Request) error {
	recs, err := s.store.ListAccounts(r.Context())
	if err != nil {
		return err
	}
	out := make([]api.Account, 0, len(recs))
	for _, rec := range recs {
		a, err := s.accountOut(r, rec, false)
		if err != nil {
			return err
		}
		out = append(out, a)
	}
	writeJSON(w, http.StatusOK, map[string]any{"accounts": out})
	return nil
}

func (s *Server) showAccount(w http.ResponseWriter, r *http.Request) error {
	rec, err := s.findAccount(r, r.PathValue("account"))
	if err != nil {
		return err
	}
	out, err := s.accountOut(r, rec, true)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// showOwnAccount is GET /v1/account: the caller's own account.
func (s *Server) showOwnAccount(w http.ResponseWriter, r *http.Request) error {
	rec, err := s.store.Account(r.Context(), owner(r))
	if err != nil {
		return err
	}
	out, err := s.accountOut(r, rec, false)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// setAccountLimits merges the given limits into the account's overrides;
// a field set to null goes back to the server's default.
func (s *Server) setAccountLimits(w http.ResponseWriter, r *http.Request) error {
	rec, err := s.findAccount(r, r.PathValue("account"))
	if err != nil {
		return err
	}
	raw, err := readBody(w, r)
	if err != nil {
		return err
	}
	var set account.Overrides
	if err := decodeStrict(raw, &set); err != nil {
		return err
	}
	var req map[string]any
	if err := json.Unmarshal(raw, &req); err != nil {
		return jsonError(err)
	}
	if err := set.Validate(); err != nil {
		return err
	}
	cur, err := account.ParseOverrides(rec.Limits)
	if err != nil {
		return err
	}
	merged := cur.Merge(set)
	for k, v := range req {
		if v == nil {
			merged.Clear(k)
		}
	}
	if err := s.saveLimits(r, rec.ID, merged); err != nil {
		return err
	}
	rec.Limits = nil
	out, err := s.accountOut(r, rec, false)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s *Server) saveLimits(r *http.Request, id string, o account.Overrides) error {
	b, err := json.Marshal(o)
	if err != nil {
		return err
	}
	if err := s.store.SetAccountLimits(r.Context(), id, b); err != nil {
		return err
	}
	a, err := s.accounts.Get(r.Context(), id)
	if err != nil {
		return err
	}
	a.SetOverrides(o)
	return nil
}

// setAccountRuntime sets the default runtime of an account's sandboxes,
// which admin keys alone may do (s.admin): a tenant's own key cannot
// choose it, nor unlock a runtime its operator locked. The runtime must be
// one this server offers; "" clears it (the server's default), and
// cannot be locked.
func (s *Server) setAccountRuntime(w http.ResponseWriter, r *http.Request) error {
	rec, err := s.findAccount(r, r.PathValue("account"))
	if err != nil {
		return err
	}
	var req api.AccountRuntime
	if err := decodeJSON(w, r, &req, false); err != nil {
		return err
	}
	if req.Runtime == nil {
		return apierr.New(apierr.BadRequest, `runtime is required: one this server offers, or "" for the server's default`)
	}
	rt := *req.Runtime
	offered := s.engine.Runtimes()
	switch {
	case rt == "" && req.Locked:
		return apierr.New(apierr.BadRequest, "locked needs a runtime: name the one the account's sandboxes must run under")
	case rt != "" && !slices.Contains(offered, rt):
		return &apierr.Error{Code: apierr.BadRequest, Details: map[string]any{"field": "runtime"},
			Message: fmt.Sprintf("runtime %q is not offered by this server; offered: %s", rt, strings.Join(offered, ", "))}
	}
	if err := s.store.SetAccountRuntime(r.Context(), rec.ID, rt, req.Locked); err != nil {
		return err
	}
	a, err := s.accounts.Get(r.Context(), rec.ID)
	if err != nil {
		return err
	}
	a.SetRuntime(rt, req.Locked)
	s.log.Info("account runtime set", "account", rec.ID, "runtime", rt, "locked", req.Locked)
	rec.Runtime, rec.RuntimeLocked = rt, req.Locked
	out, err := s.accountOut(r, rec, false)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s *Server) creditAccount(w http.ResponseWriter, r *http.Request) error {
	rec, err := s.findAccount(r, r.PathValue("account"))
	if err != nil {
		return err
	}
	var req api.CreditGrant
	if err := decodeJSON(w, r, &req, false); err != nil {
		return err
	}
	if req.Amount == nil {
		return apierr.New(apierr.BadRequest, "amount is required: a decimal string such as \"25.00\"")
	}
	micros, err := account.ParseAmount(*req.Amount)
	if err != nil || micros == 0 {
		return bound.Error("amount", "must be a non-zero decimal string: %s", account.AmountRange)
	}
	if len(req.Reason) > 500 {
		return apierr.New(apierr.BadRequest, "reason must be at most 500 characters")
	}
	a, err := s.accounts.Get(r.Context(), rec.ID)
	if err != nil {
		return err
	}
	if err := account.CheckGrant("amount", a.Balance(), micros); err != nil {
		return err
	}
	if err := s.store.AddLedger(r.Context(), store.LedgerEntry{Account: rec.ID, CreatedAt: time.Now(),
		Kind: store.LedgerGrant, AmountMicros: micros, Reason: req.Reason}); err != nil {
		return err
	}
	a.Granted(micros)
	c, err := s.creditsOf(r, a)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, c)
	return nil
}

func (s *Server) createAccountKey(w http.ResponseWriter, r *http.Request) error {
	var req api.CreateKey
	if err := decodeJSON(w, r, &req, false); err != nil {
		return err
	}
	if req.Account == "" {
		return apierr.New(apierr.BadRequest, "account is required: the name or id of an existing account")
	}
	rec, err := s.findAccount(r, req.Account)
	if apierr.CodeOf(err) == apierr.NotFound {
		return apierr.New(apierr.BadRequest, "account %q does not exist", req.Account)
	}
	if err != nil {
		return err
	}
	if len(req.Name) > 200 {
		return apierr.New(apierr.BadRequest, "name must be at most 200 characters")
	}
	k, secret, err := auth.Create(r.Context(), s.store, auth.CreateOptions{Name: req.Name, Owner: rec.ID, Admin: req.Admin, E2B: req.E2B})
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, api.NewKey{ID: k.ID, Name: k.Name, Account: rec.Name, AccountID: rec.ID, Role: k.Role,
		CreatedAt: k.CreatedAt.UTC(), Key: secret})
	return nil
}

// readBody reads a JSON request body whole (bounded).
func readBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxJSONBody))
	if err != nil {
		return nil, jsonError(err)
	}
	if len(bytes.TrimSpace(b)) == 0 {
		return nil, apierr.New(apierr.BadRequest, "the request body must be a JSON object")
	}
	return b, nil
}

// decodeStrict decodes a whole body into v, refusing unknown fields.
func decodeStrict(b []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return jsonError(err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return apierr.New(apierr.BadRequest, "malformed JSON: unexpected data after the object")
	}
	return nil
}
