package postgres

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/sheepfold/sheepfold/internal/store"
)

// jsonText is a JSON object as stored: nil is {}.
func jsonText(m json.RawMessage) string {
	if len(m) == 0 {
		return "{}"
	}
	return string(m)
}

// CreateKey implements store.Store.
func (s *Store) CreateKey(ctx context.Context, k store.Key) error {
	return createKey(ctx, s.pool, k)
}

func createKey(ctx context.Context, q querier, k store.Key) error {
	if k.Role == "" {
		k.Role = store.RoleUser
	}
	_, err := q.Exec(ctx, `INSERT INTO keys (id, name, owner, role, hash, created_at, revoked_at) VALUES ($1, $2, $3, $4, $5, $6, $7)`,
		k.ID, k.Name, k.Owner, k.Role, k.Hash, dbTime(k.CreatedAt), dbTimePtr(k.RevokedAt))
	return storeErr("create key", err)
}

const keyCols = `id, name, owner, role, hash, created_at, revoked_at`

func scanKey(row pgx.Row) (store.Key, error) {
	var k store.Key
	err := row.Scan(&k.ID, &k.Name, &k.Owner, &k.Role, &k.Hash, &k.CreatedAt, &k.RevokedAt)
	k.CreatedAt, k.RevokedAt = k.CreatedAt.UTC(), utcPtr(k.RevokedAt)
	return k, err
}

// KeyByHash implements store.Store.
func (s *Store) KeyByHash(ctx context.Context, hash string) (store.Key, error) {
	k, err := scanKey(s.pool.QueryRow(ctx, `SELECT `+keyCols+` FROM keys WHERE hash = $1`, hash))
	return k, notFound("look up key", err)
}

// KeyByID implements store.Store.
func (s *Store) KeyByID(ctx context.Context, id string) (store.Key, error) {
	k, err := scanKey(s.pool.QueryRow(ctx, `SELECT `+keyCols+` FROM keys WHERE id = $1`, id))
	return k, notFound("look up key", err)
}

// ListKeys implements store.Store, oldest first.
func (s *Store) ListKeys(ctx context.Context) ([]store.Key, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+keyCols+` FROM keys ORDER BY created_at, id`)
	if err != nil {
		return nil, storeErr("list keys", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (store.Key, error) { return scanKey(r) })
	return out, storeErr("list keys", err)
}

// RevokeKey implements store.Store.
func (s *Store) RevokeKey(ctx context.Context, id string, at time.Time) error {
	tag, err := s.pool.Exec(ctx, `UPDATE keys SET revoked_at = coalesce(revoked_at, $1) WHERE id = $2`, dbTime(at), id)
	if err != nil {
		return storeErr("revoke key", err)
	}
	if tag.RowsAffected() == 0 {
		return store.ErrNotFound
	}
	return nil
}

// CountActiveKeys implements store.Store.
func (s *Store) CountActiveKeys(ctx context.Context) (int, error) {
	var n int
	err := s.pool.QueryRow(ctx, `SELECT count(*) FROM keys WHERE revoked_at IS NULL`).Scan(&n)
	return n, storeErr("count keys", err)
}

// CreateAccount implements store.Store.
func (s *Store) CreateAccount(ctx context.Context, a store.Account) error {
	_, err := s.pool.Exec(ctx, `INSERT INTO accounts (id, name, created_at, limits) VALUES ($1, $2, $3, $4)`,
		a.ID, a.Name, dbTime(a.CreatedAt), jsonText(a.Limits))
	if isUnique(err) {
		return store.ErrExists
	}
	return storeErr("create account", err)
}

// CreateAccountKey implements store.Store. The account is inserted unless
// its id exists (one statement, so two first keys of one new account at
// once do not both create it); only a new account gets free credits.
func (s *Store) CreateAccountKey(ctx context.Context, a store.Account, k store.Key, freeMicros int64) error {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return storeErr("create account key", err)
	}
	defer tx.Rollback(ctx)
	tag, err := tx.Exec(ctx, `INSERT INTO accounts (id, name, created_at, limits) VALUES ($1, $2, $3, $4)
		ON CONFLICT (id) DO NOTHING`, a.ID, a.Name, dbTime(a.CreatedAt), jsonText(a.Limits))
	if isUnique(err) {
		return store.ErrExists // the name is another account's
	}
	if err != nil {
		return storeErr("create account", err)
	}
	if tag.RowsAffected() == 1 && freeMicros > 0 {
		if err := addLedger(ctx, tx, store.LedgerEntry{Account: a.ID, CreatedAt: a.CreatedAt,
			Kind: store.LedgerFree, AmountMicros: freeMicros, Reason: "free credits of a new account"}); err != nil {
			return err
		}
	}
	k.Owner = a.ID
	if err := createKey(ctx, tx, k); err != nil {
		return err
	}
	return storeErr("create account key", tx.Commit(ctx))
}

const accountCols = `id, name, created_at, limits, runtime, runtime_locked`

func scanAccount(row pgx.Row) (store.Account, error) {
	var a store.Account
	var limits string
	err := row.Scan(&a.ID, &a.Name, &a.CreatedAt, &limits, &a.Runtime, &a.RuntimeLocked)
	a.CreatedAt, a.Limits = a.CreatedAt.UTC(), json.RawMessage(limits)
	return a, err
}

// Account implements store.Store.
func (s *Store) Account(ctx context.Context, id string) (store.Account, error) {
	a, err := scanAccount(s.pool.QueryRow(ctx, `SELECT `+accountCols+` FROM accounts WHERE id = $1`, id))
	return a, notFound("get account", err)
}

// AccountByName implements store.Store.
func (s *Store) AccountByName(ctx context.Context, name string) (store.Account, error) {
	a, err := scanAccount(s.pool.QueryRow(ctx, `SELECT `+accountCols+` FROM accounts WHERE name = $1`, name))
	return a, notFound("get account", err)
}

// ListAccounts implements store.Store, oldest first.
func (s *Store) ListAccounts(ctx context.Context) ([]store.Account, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+accountCols+` FROM accounts ORDER BY created_at, id`)
	if err != nil {
		return nil, storeErr("list accounts", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (store.Account, error) { return scanAccount(r) })
	return out, storeErr("list accounts", err)
}

// SetAccountLimits implements store.Store.
func (s *Store) SetAccountLimits(ctx context.Context, id string, limits json.RawMessage) error {
	tag, err := s.pool.Exec(ctx, `UPDATE accounts SET limits = $1 WHERE id = $2`, jsonText(limits), id)
	if err != nil {
		return storeErr("set account limits", err)
	}
	if tag.RowsAffected() == 0 {
		return store.ErrNotFound
	}
	return nil
}

// SetAccountRuntime implements store.Store.
func (s *Store) SetAccountRuntime(ctx context.Context, id, runtime string, locked bool) error {
	tag, err := s.pool.Exec(ctx, `UPDATE accounts SET runtime = $1, runtime_locked = $2 WHERE id = $3`, runtime, locked, id)
	if err != nil {
		return storeErr("set account runtime", err)
	}
	if tag.RowsAffected() == 0 {
		return store.ErrNotFound
	}
	return nil
}

// AddUsage implements store.Store.
func (s *Store) AddUsage(ctx context.Context, deltas []store.UsageDelta, ledger []store.LedgerEntry) error {
	return s.AddLeasedUsage(ctx, deltas, ledger, nil)
}

// AddLeasedUsage implements store.ReplicaStore: the leases first, so that
// a lost one writes nothing.
func (s *Store) AddLeasedUsage(ctx context.Context, deltas []store.UsageDelta, ledger []store.LedgerEntry, leases []store.MeterLease) error {
	if len(deltas) == 0 && len(ledger) == 0 && len(leases) == 0 {
		return nil
	}
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return storeErr("add usage", err)
	}
	defer tx.Rollback(ctx)
	if err := putLeases(ctx, tx, leases); err != nil {
		return err
	}
	for _, u := range deltas {
		if _, err := tx.Exec(ctx, `INSERT INTO usage_hours AS u
			(sandbox_id, account_id, template, hour, wall_ns, cpu_ns, gb_seconds_reserved, gb_seconds_used, disk_peak_bytes,
			executions, commands, egress_requests, egress_bytes_in, egress_bytes_out, paused_gb_seconds, device_seconds)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16)
			ON CONFLICT (sandbox_id, hour) DO UPDATE SET
				wall_ns = u.wall_ns + excluded.wall_ns,
				cpu_ns = u.cpu_ns + excluded.cpu_ns,
				gb_seconds_reserved = u.gb_seconds_reserved + excluded.gb_seconds_reserved,
				gb_seconds_used = u.gb_seconds_used + excluded.gb_seconds_used,
				disk_peak_bytes = greatest(u.disk_peak_bytes, excluded.disk_peak_bytes),
				executions = u.executions + excluded.executions,
				commands = u.commands + excluded.commands,
				egress_requests = u.egress_requests + excluded.egress_requests,
				egress_bytes_in = u.egress_bytes_in + excluded.egress_bytes_in,
				egress_bytes_out = u.egress_bytes_out + excluded.egress_bytes_out,
				paused_gb_seconds = u.paused_gb_seconds + excluded.paused_gb_seconds,
				device_seconds = u.device_seconds + excluded.device_seconds`,
			u.SandboxID, u.Account, u.Template, u.Hour.UTC().Truncate(time.Hour),
			u.WallNanos, u.CPUNanos, u.GBSecondsReserved, u.GBSecondsUsed, u.DiskPeakBytes, u.Executions, u.Commands, u.EgressRequests,
			u.EgressBytesIn, u.EgressBytesOut, u.PausedGBSeconds, u.DeviceSeconds); err != nil {
			return storeErr("add usage", err)
		}
	}
	for _, e := range ledger {
		if err := addLedger(ctx, tx, e); err != nil {
			return err
		}
	}
	return storeErr("add usage", tx.Commit(ctx))
}

// Usage keys as SQLite's text times give them: an hour in RFC 3339 with
// nanoseconds, a day as a date, both in UTC.
const (
	hourKey = `to_char(hour AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS".000000000Z"')`
	dayKey  = `to_char(hour AT TIME ZONE 'UTC', 'YYYY-MM-DD')`
)

// QueryUsage implements store.Store.
func (s *Store) QueryUsage(ctx context.Context, f store.UsageFilter) ([]store.UsageRow, error) {
	var key string
	switch f.GroupBy {
	case store.GroupHour:
		key = hourKey
	case store.GroupDay:
		key = dayKey
	case store.GroupSandbox:
		key = "sandbox_id"
	case store.GroupTemplate:
		key = "template"
	case store.GroupAccount:
		key = "account_id"
	case store.GroupNone:
		key = "''"
	default:
		return nil, fmt.Errorf("query usage: unknown grouping %q", f.GroupBy)
	}
	// sum of bigint is numeric: back to bigint.
	q := `SELECT ` + key + `::text, max(account_id), max(template), max(sandbox_id), min(hour),
		` + micros(`sum(wall_ns)`) + `, ` + micros(`sum(cpu_ns)`) + `,
		coalesce(sum(gb_seconds_reserved), 0), coalesce(sum(gb_seconds_used), 0), coalesce(max(disk_peak_bytes), 0),
		coalesce(sum(executions), 0)::bigint, coalesce(sum(commands), 0)::bigint, coalesce(sum(egress_requests), 0)::bigint,
		coalesce(sum(egress_bytes_in), 0)::bigint, coalesce(sum(egress_bytes_out), 0)::bigint, coalesce(sum(paused_gb_seconds), 0),
		coalesce(sum(device_seconds), 0)
		FROM usage_hours WHERE true`
	var a args
	if f.Account != "" {
		q += ` AND account_id = ` + a.add(f.Account)
	}
	if f.SandboxID != "" {
		q += ` AND sandbox_id = ` + a.add(f.SandboxID)
	}
	if !f.From.IsZero() {
		q += ` AND hour >= ` + a.add(dbTime(f.From))
	}
	if !f.To.IsZero() {
		q += ` AND hour < ` + a.add(dbTime(f.To))
	}
	q += ` GROUP BY 1 ORDER BY 1`
	rows, err := s.pool.Query(ctx, q, a...)
	if err != nil {
		return nil, storeErr("query usage", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (store.UsageRow, error) {
		var r store.UsageRow
		var acct, tmpl, sb string
		var first time.Time
		err := row.Scan(&r.Key, &acct, &tmpl, &sb, &first, &r.WallNanos, &r.CPUNanos, &r.GBSecondsReserved, &r.GBSecondsUsed,
			&r.DiskPeakBytes, &r.Executions, &r.Commands, &r.EgressRequests, &r.EgressBytesIn, &r.EgressBytesOut, &r.PausedGBSeconds, &r.DeviceSeconds)
		switch f.GroupBy {
		case store.GroupSandbox:
			r.SandboxID, r.Account, r.Template = r.Key, acct, tmpl
		case store.GroupHour:
			r.Hour = first.UTC()
		}
		return r, err
	})
	return out, storeErr("query usage", err)
}

// AddLedger implements store.Store.
func (s *Store) AddLedger(ctx context.Context, e store.LedgerEntry) error {
	return addLedger(ctx, s.pool, e)
}

func addLedger(ctx context.Context, q querier, e store.LedgerEntry) error {
	_, err := q.Exec(ctx, `INSERT INTO credit_ledger (account_id, created_at, kind, amount_micros, reason) VALUES ($1, $2, $3, $4, $5)`,
		e.Account, dbTime(e.CreatedAt), e.Kind, e.AmountMicros, e.Reason)
	return storeErr("add ledger entry", err)
}

// CreditTotals implements store.Store.
func (s *Store) CreditTotals(ctx context.Context, account string) (store.CreditTotals, error) {
	var c store.CreditTotals
	err := s.pool.QueryRow(ctx, `SELECT
		`+micros(`sum(amount_micros) FILTER (WHERE kind = 'free')`)+`,
		`+micros(`sum(amount_micros) FILTER (WHERE kind NOT IN ('free', 'usage'))`)+`,
		`+micros(`-sum(amount_micros) FILTER (WHERE kind = 'usage')`)+`
		FROM credit_ledger WHERE account_id = $1`, account).Scan(&c.FreeMicros, &c.GrantedMicros, &c.SpentMicros)
	return c, storeErr("credit totals", err)
}

// micros is a sum of amounts of money or of nanoseconds (a numeric,
// which cannot overflow) as a bigint, stopping at bigint's ends rather
// than failing there (store.SumMicros).
func micros(sum string) string {
	return `greatest(least(coalesce(` + sum + `, 0), 9223372036854775807), -9223372036854775808)::bigint`
}

// Balances implements store.Store.
func (s *Store) Balances(ctx context.Context) (map[string]int64, error) {
	rows, err := s.pool.Query(ctx, `SELECT account_id, `+micros(`sum(amount_micros)`)+` FROM credit_ledger GROUP BY account_id`)
	if err != nil {
		return nil, storeErr("balances", err)
	}
	out := map[string]int64{}
	var a string
	var b int64
	_, err = pgx.ForEachRow(rows, []any{&a, &b}, func() error {
		out[a] = b
		return nil
	})
	return out, storeErr("balances", err)
}

const alertCols = `id, account_id, severity, kind, message, sandbox_id, session_id, coalesce(dedupe_key, ''), created_at, acknowledged_at`

func scanAlert(row pgx.Row) (store.Alert, error) {
	var a store.Alert
	err := row.Scan(&a.ID, &a.Account, &a.Severity, &a.Kind, &a.Message, &a.SandboxID, &a.SessionID, &a.DedupeKey,
		&a.CreatedAt, &a.AcknowledgedAt)
	a.CreatedAt, a.AcknowledgedAt = a.CreatedAt.UTC(), utcPtr(a.AcknowledgedAt)
	return a, err
}

// ListAlerts implements store.Store, newest first.
func (s *Store) ListAlerts(ctx context.Context, account string, unackedOnly bool) ([]store.Alert, error) {
	q := `SELECT ` + alertCols + ` FROM alerts WHERE account_id = $1`
	if unackedOnly {
		q += ` AND acknowledged_at IS NULL`
	}
	rows, err := s.pool.Query(ctx, q+` ORDER BY created_at DESC, id DESC LIMIT 1000`, account)
	if err != nil {
		return nil, storeErr("list alerts", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (store.Alert, error) { return scanAlert(r) })
	return out, storeErr("list alerts", err)
}

// AckAlert implements store.Store: acknowledging twice keeps the first time.
func (s *Store) AckAlert(ctx context.Context, account, id string, at time.Time) (store.Alert, error) {
	a, err := scanAlert(s.pool.QueryRow(ctx, `UPDATE alerts SET acknowledged_at = coalesce(acknowledged_at, $1)
		WHERE id = $2 AND account_id = $3 RETURNING `+alertCols, dbTime(at), id, account))
	return a, notFound("acknowledge alert", err)
}
