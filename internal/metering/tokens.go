package metering

import (
	"context"
	"sort"
	"sync"
	"time"

	"github.com/sheepfold/sheepfold/internal/account"
	"github.com/sheepfold/sheepfold/internal/store"
)

// Model tokens: each relayed completion adds its tokens (AddTokens, no
// I/O) to per-hour buckets of its account and model, written with every
// flush; its cost is accrued to the account like a sandbox's. Each
// account's tokens of each model this month are kept in memory (read from
// the store once a month) for the quota check, with the tokens reserved
// by completions still running (ReserveTokens), so that concurrent calls
// are admitted against what the ones before them may use.

type tokenKey struct{ account, model string }

type tokenMonth struct {
	month time.Time
	used  int64 // prompt plus completion tokens, stored and pending
}

// tokens is the Meter's token state; its mu is held across a flush's
// write, so that a month read from the store never counts a pending
// delta twice.
type tokens struct {
	st store.ModelStore // nil: not persisted

	// mu guards the fields below.
	mu       sync.Mutex
	pending  map[tokenKey]map[time.Time]*store.TokenDelta
	used     map[tokenKey]*tokenMonth
	reserved map[tokenKey]int64 // by completions running; none is a missing key
}

// AddTokens meters one completion's tokens for acct's model, and accrues
// their cost (micro-units) to the account.
func (m *Meter) AddTokens(acct *account.Account, model string, prompt, completion int64, cost float64) {
	now := time.Now().UTC()
	hour := now.Truncate(time.Hour)
	k := tokenKey{acct.ID, model}
	t := &m.tok
	t.mu.Lock()
	byHour := t.pending[k]
	if byHour == nil {
		byHour = map[time.Time]*store.TokenDelta{}
		t.pending[k] = byHour
	}
	d := byHour[hour]
	if d == nil {
		d = &store.TokenDelta{Account: acct.ID, Model: model, Hour: hour}
		byHour[hour] = d
	}
	d.Add(store.TokenDelta{Requests: 1, PromptTokens: prompt, CompletionTokens: completion, CostMicros: cost})
	if u := t.used[k]; u != nil && u.month.Equal(account.MonthStart(now)) {
		u.used += prompt + completion
	}
	t.mu.Unlock()
	acct.Accrue(account.Usage{}, cost)
}

// TokensThisMonth returns the tokens acct has used of model this month
// (UTC), pending ones included.
func (m *Meter) TokensThisMonth(ctx context.Context, acct, model string) (int64, error) {
	t := &m.tok
	t.mu.Lock()
	defer t.mu.Unlock()
	return m.usedLocked(ctx, tokenKey{acct, model})
}

// ReserveTokens admits a completion of acct's model under a monthly
// quota: when the tokens used this month plus those reserved by the
// completions still running are below quota, it reserves n more and
// says ok; else it reserves nothing. used is the month's tokens and
// reservations before the call. Each reservation that was made is given
// back with ReleaseTokens once the completion is metered (AddTokens), so
// at most one call's reservation passes the quota.
func (m *Meter) ReserveTokens(ctx context.Context, acct, model string, n, quota int64) (used int64, ok bool, err error) {
	k := tokenKey{acct, model}
	t := &m.tok
	t.mu.Lock()
	defer t.mu.Unlock()
	u, err := m.usedLocked(ctx, k)
	if err != nil {
		return 0, false, err
	}
	used = u + t.reserved[k]
	if used >= quota {
		return used, false, nil
	}
	t.reserved[k] += max(n, 1)
	return used, true, nil
}

// ReleaseTokens gives back a reservation of ReserveTokens (n as given).
func (m *Meter) ReleaseTokens(acct, model string, n int64) {
	k := tokenKey{acct, model}
	t := &m.tok
	t.mu.Lock()
	defer t.mu.Unlock()
	if r := t.reserved[k] - max(n, 1); r > 0 {
		t.reserved[k] = r
	} else {
		delete(t.reserved, k)
	}
}

// usedLocked is TokensThisMonth with t.mu held.
func (m *Meter) usedLocked(ctx context.Context, k tokenKey) (int64, error) {
	month := account.MonthStart(time.Now().UTC())
	t := &m.tok
	if u := t.used[k]; u != nil && u.month.Equal(month) {
		return u.used, nil
	}
	var used int64
	if t.st != nil {
		rows, err := t.st.QueryTokenUsage(ctx, store.TokenFilter{Account: k.account, Model: k.model, From: month})
		if err != nil {
			return 0, err
		}
		for _, r := range rows {
			used += r.PromptTokens + r.CompletionTokens
		}
	}
	for h, d := range t.pending[k] {
		if !h.Before(month) {
			used += d.PromptTokens + d.CompletionTokens
		}
	}
	t.used[k] = &tokenMonth{month: month, used: used}
	return used, nil
}

// Tokens returns an account's tokens per model in hours [from, to),
// stored and pending, ordered by model.
func (m *Meter) Tokens(ctx context.Context, acct string, from, to time.Time) ([]store.TokenDelta, error) {
	t := &m.tok
	t.mu.Lock()
	defer t.mu.Unlock()
	sums := map[string]*store.TokenDelta{}
	if t.st != nil {
		rows, err := t.st.QueryTokenUsage(ctx, store.TokenFilter{Account: acct, From: from, To: to})
		if err != nil {
			return nil, err
		}
		for i := range rows {
			sums[rows[i].Model] = &rows[i]
		}
	}
	for k, byHour := range t.pending {
		if k.account != acct {
			continue
		}
		for h, d := range byHour {
			if h.Before(from) || !h.Before(to) {
				continue
			}
			if sums[k.model] == nil {
				sums[k.model] = &store.TokenDelta{Account: acct, Model: k.model}
			}
			sums[k.model].Add(*d)
		}
	}
	out := make([]store.TokenDelta, 0, len(sums))
	for _, d := range sums {
		out = append(out, *d)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Model < out[j].Model })
	return out, nil
}

// flushTokens writes the pending token buckets; on failure they stay
// pending.
func (m *Meter) flushTokens(ctx context.Context) error {
	t := &m.tok
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.st == nil || len(t.pending) == 0 {
		return nil
	}
	var deltas []store.TokenDelta
	for _, byHour := range t.pending {
		for _, d := range byHour {
			deltas = append(deltas, *d)
		}
	}
	if err := t.st.AddTokenUsage(ctx, deltas); err != nil {
		return err
	}
	clear(t.pending)
	return nil
}
