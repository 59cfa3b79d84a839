package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"time"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/sheepfold/sheepfold/internal/store"
)

// execer is what both *sql.DB and *sql.Tx offer.
type execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// isUnique reports a UNIQUE (or primary key) constraint failure, by the
// driver's extended error code.
func isUnique(err error) bool {
	var se *sqlite.Error
	return errors.As(err, &se) && (se.Code() == sqlite3.SQLITE_CONSTRAINT_UNIQUE || se.Code() == sqlite3.SQLITE_CONSTRAINT_PRIMARYKEY)
}

// CreateAccount implements store.Store.
func (d *DB) CreateAccount(ctx context.Context, a store.Account) error {
	return createAccount(ctx, d.db, a)
}

func createAccount(ctx context.Context, db execer, a store.Account) error {
	_, err := db.ExecContext(ctx, `INSERT INTO accounts (id, name, created_at, limits) VALUES (?, ?, ?, ?)`,
		a.ID, a.Name, fmtTime(a.CreatedAt), jsonText(a.Limits))
	if isUnique(err) {
		return store.ErrExists
	}
	if err != nil {
		return fmt.Errorf("create account: %w", err)
	}
	return nil
}

// CreateAccountKey implements store.Store.
func (d *DB) CreateAccountKey(ctx context.Context, a store.Account, k store.Key, freeMicros int64) error {
	tx, err := d.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	var n int
	if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM accounts WHERE id = ?`, a.ID).Scan(&n); err != nil {
		return err
	}
	if n == 0 {
		if err := createAccount(ctx, tx, a); err != nil {
			return err
		}
		if freeMicros > 0 {
			if err := addLedger(ctx, tx, store.LedgerEntry{Account: a.ID, CreatedAt: a.CreatedAt,
				Kind: store.LedgerFree, AmountMicros: freeMicros, Reason: "free credits of a new account"}); err != nil {
				return err
			}
		}
	}
	k.Owner = a.ID
	if err := createKey(ctx, tx, k); err != nil {
		return err
	}
	return tx.Commit()
}

const accountCols = `id, name, created_at, limits, runtime, runtime_locked`

func scanAccount(sc interface{ Scan(...any) error }) (store.Account, error) {
	var a store.Account
	var created, limits string
	if err := sc.Scan(&a.ID, &a.Name, &created, &limits, &a.Runtime, &a.RuntimeLocked); err != nil {
		if errors.Is(err, sql.ErrNoRows) {
			return a, store.ErrNotFound
		}
		return a, err
	}
	var err error
	a.CreatedAt, err = parseTime(created)
	a.Limits = json.RawMessage(limits)
	return a, err
}

// Account implements store.Store.
func (d *DB) Account(ctx context.Context, id string) (store.Account, error) {
	return scanAccount(d.rd.QueryRowContext(ctx, `SELECT `+accountCols+` FROM accounts WHERE id = ?`, id))
}

// AccountByName implements store.Store.
func (d *DB) AccountByName(ctx context.Context, name string) (store.Account, error) {
	return scanAccount(d.rd.QueryRowContext(ctx, `SELECT `+accountCols+` FROM accounts WHERE name = ?`, name))
}

// ListAccounts implements store.Store, oldest first.
func (d *DB) ListAccounts(ctx context.Context) ([]store.Account, error) {
	rows, err := d.rd.QueryContext(ctx, `SELECT `+accountCols+` FROM accounts ORDER BY created_at, id`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := []store.Account{}
	for rows.Next() {
		a, err := scanAccount(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, a)
	}
	return out, rows.Err()
}

// SetAccountLimits implements store.Store.
func (d *DB) SetAccountLimits(ctx context.Context, id string, limits json.RawMessage) error {
	res, err := d.db.ExecContext(ctx, `UPDATE accounts SET limits = ? WHERE id = ?`, jsonText(limits), id)
	if err != nil {
		return fmt.Errorf("set account limits: %w", err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return store.ErrNotFound
	}
	return nil
}

// SetAccountRuntime implements store.Store.
func (d *DB) SetAccountRuntime(ctx context.Context, id, runtime string, locked bool) error {
	res, err := d.db.ExecContext(ctx, `UPDATE accounts SET runtime = ?, runtime_locked = ? WHERE id = ?`, runtime, locked, id)
	if err != nil {
		return fmt.Errorf("set account runtime: %w", err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return store.ErrNotFound
	}
	return nil
}

// AddUsage implements store.Store.
func (d *DB) AddUsage(ctx context.Context, deltas []store.UsageDelta, ledger []store.LedgerEntry) error {
	return d.AddLeasedUsage(ctx, deltas, ledger, nil)
}

// AddLeasedUsage implements store.ReplicaStore: the leases first, so that
// a lost one writes nothing.
func (d *DB) AddLeasedUsage(ctx context.Context, deltas []store.UsageDelta, ledger []store.LedgerEntry, leases []store.MeterLease) error {
	if len(deltas) == 0 && len(ledger) == 0 && len(leases) == 0 {
		return nil
	}
	tx, err := d.db.BeginTx(ctx, nil)
	if err != nil {
		return storeErr("add usage", err)
	}
	defer tx.Rollback()
	if err := putLeases(ctx, tx, leases); err != nil {
		return err
	}
	stmt, err := tx.PrepareContext(ctx, `INSERT INTO usage_hours
		(sandbox_id, account_id, template, hour, wall_ns, cpu_ns, gb_seconds_reserved, gb_seconds_used, disk_peak_bytes, executions, commands, egress_requests,
			egress_bytes_in, egress_bytes_out, paused_gb_seconds, device_seconds)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT (sandbox_id, hour) DO UPDATE SET
			wall_ns = wall_ns + excluded.wall_ns,
			cpu_ns = cpu_ns + excluded.cpu_ns,
			gb_seconds_reserved = gb_seconds_reserved + excluded.gb_seconds_reserved,
			gb_seconds_used = gb_seconds_used + excluded.gb_seconds_used,
			disk_peak_bytes = max(disk_peak_bytes, excluded.disk_peak_bytes),
			executions = executions + excluded.executions,
			commands = commands + excluded.commands,
			egress_requests = egress_requests + excluded.egress_requests,
			egress_bytes_in = egress_bytes_in + excluded.egress_bytes_in,
			egress_bytes_out = egress_bytes_out + excluded.egress_bytes_out,
			paused_gb_seconds = paused_gb_seconds + excluded.paused_gb_seconds,
			device_seconds = device_seconds + excluded.device_seconds`)
	if err != nil {
		return err
	}
	defer stmt.Close()
	for _, u := range deltas {
		if _, err := stmt.ExecContext(ctx, u.SandboxID, u.Account, u.Template, fmtTime(u.Hour.UTC().Truncate(time.Hour)),
			u.WallNanos, u.CPUNanos, u.GBSecondsReserved, u.GBSecondsUsed, u.DiskPeakBytes, u.Executions, u.Commands, u.EgressRequests,
			u.EgressBytesIn, u.EgressBytesOut, u.PausedGBSeconds, u.DeviceSeconds); err != nil {
			return fmt.Errorf("add usage: %w", err)
		}
	}
	for _, e := range ledger {
		if err := addLedger(ctx, tx, e); err != nil {
			return err
		}
	}
	return tx.Commit()
}

// QueryUsage implements store.Store.
func (d *DB) QueryUsage(ctx context.Context, f store.UsageFilter) ([]store.UsageRow, error) {
	var key string
	switch f.GroupBy {
	case store.GroupHour:
		key = "hour"
	case store.GroupDay:
		key = "substr(hour, 1, 10)"
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
	q := `SELECT ` + key + `, max(account_id), max(template), max(sandbox_id), ` + wideSum{}.sql("wall_ns") + `, ` + wideSum{}.sql("cpu_ns") + `,
		coalesce(sum(gb_seconds_reserved), 0), coalesce(sum(gb_seconds_used), 0), coalesce(max(disk_peak_bytes), 0),
		coalesce(sum(executions), 0), coalesce(sum(commands), 0), coalesce(sum(egress_requests), 0),
		coalesce(sum(egress_bytes_in), 0), coalesce(sum(egress_bytes_out), 0), coalesce(sum(paused_gb_seconds), 0),
		coalesce(sum(device_seconds), 0), count(*) FROM usage_hours WHERE 1 = 1`
	var args []any
	if f.Account != "" {
		q += ` AND account_id = ?`
		args = append(args, f.Account)
	}
	if f.SandboxID != "" {
		q += ` AND sandbox_id = ?`
		args = append(args, f.SandboxID)
	}
	if !f.From.IsZero() {
		q += ` AND hour >= ?`
		args = append(args, fmtTime(f.From))
	}
	if !f.To.IsZero() {
		q += ` AND hour < ?`
		args = append(args, fmtTime(f.To))
	}
	q += ` GROUP BY 1 ORDER BY 1`
	rows, err := d.rd.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := []store.UsageRow{}
	for rows.Next() {
		var r store.UsageRow
		var acct, tmpl, sb sql.NullString
		var n int
		var wall, cpu wideSum
		if err := rows.Scan(&r.Key, &acct, &tmpl, &sb, &wall.q, &wall.r, &cpu.q, &cpu.r, &r.GBSecondsReserved, &r.GBSecondsUsed,
			&r.DiskPeakBytes, &r.Executions, &r.Commands, &r.EgressRequests, &r.EgressBytesIn, &r.EgressBytesOut, &r.PausedGBSeconds, &r.DeviceSeconds, &n); err != nil {
			return nil, err
		}
		r.WallNanos, r.CPUNanos = wall.value(), cpu.value()
		if n == 0 {
			continue // the aggregate of no rows
		}
		if f.GroupBy == store.GroupSandbox {
			r.SandboxID, r.Account, r.Template = r.Key, acct.String, tmpl.String
		}
		if f.GroupBy == store.GroupHour {
			if t, err := parseTime(r.Key); err == nil {
				r.Hour = t
			}
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// AddLedger implements store.Store.
func (d *DB) AddLedger(ctx context.Context, e store.LedgerEntry) error {
	return addLedger(ctx, d.db, e)
}

func addLedger(ctx context.Context, db execer, e store.LedgerEntry) error {
	_, err := db.ExecContext(ctx, `INSERT INTO credit_ledger (account_id, created_at, kind, amount_micros, reason) VALUES (?, ?, ?, ?, ?)`,
		e.Account, fmtTime(e.CreatedAt), e.Kind, e.AmountMicros, e.Reason)
	if err != nil {
		return fmt.Errorf("add ledger entry: %w", err)
	}
	return nil
}

// CreditTotals implements store.Store.
func (d *DB) CreditTotals(ctx context.Context, account string) (store.CreditTotals, error) {
	var c store.CreditTotals
	var free, granted, used wideSum
	err := d.rd.QueryRowContext(ctx, `SELECT
		`+wideSum{}.sql(`CASE WHEN kind = 'free' THEN amount_micros END`)+`,
		`+wideSum{}.sql(`CASE WHEN kind NOT IN ('free', 'usage') THEN amount_micros END`)+`,
		`+wideSum{}.sql(`CASE WHEN kind = 'usage' THEN amount_micros END`)+`
		FROM credit_ledger WHERE account_id = ?`, account).Scan(&free.q, &free.r, &granted.q, &granted.r, &used.q, &used.r)
	c.FreeMicros, c.GrantedMicros, c.SpentMicros = free.value(), granted.value(), -used.value()
	if used.value() == math.MinInt64 {
		c.SpentMicros = math.MaxInt64
	}
	return c, err
}

// wideSum is a sum of integers (amounts of money, nanoseconds) that never
// fails. SQLite's sum() of integers fails past int64 ("integer
// overflow"), so the sum is taken in two parts: of the whole billions
// (x / 1000000000, each at most 9.3e9: a billion rows near int64's ends
// before it could overflow) and of the rest (x % 1000000000); value
// joins them, stopping at int64's ends (store.SumMicros).
type wideSum struct{ q, r int64 }

const wideUnit = 1_000_000_000

// sql is the two columns of the sum of expr.
func (wideSum) sql(expr string) string {
	return `coalesce(sum((` + expr + `) / 1000000000), 0), coalesce(sum((` + expr + `) % 1000000000), 0)`
}

func (m wideSum) value() int64 {
	switch {
	case m.q > math.MaxInt64/wideUnit:
		return math.MaxInt64
	case m.q < math.MinInt64/wideUnit:
		return math.MinInt64
	}
	return store.SumMicros(m.q*wideUnit, m.r)
}

// Balances implements store.Store.
func (d *DB) Balances(ctx context.Context) (map[string]int64, error) {
	rows, err := d.rd.QueryContext(ctx, `SELECT account_id, `+wideSum{}.sql(`amount_micros`)+` FROM credit_ledger GROUP BY account_id`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]int64{}
	for rows.Next() {
		var a string
		var b wideSum
		if err := rows.Scan(&a, &b.q, &b.r); err != nil {
			return nil, err
		}
		out[a] = b.value()
	}
	return out, rows.Err()
}

// CreateAlert implements store.Store: past the account's bound its
// oldest acknowledged alerts make room, or store.ErrStorageBound.
func (d *DB) CreateAlert(ctx context.Context, a store.Alert) (bool, error) {
	give, err := d.turns.take(ctx, a.Account)
	if err != nil {
		return false, storeErr("create alert", err)
	}
	defer give()
	tx, err := d.db.BeginTx(ctx, nil)
	if err != nil {
		return false, storeErr("create alert", err)
	}
	defer tx.Rollback()
	ok, err := d.addAlert(ctx, tx, a)
	if errors.Is(err, store.ErrStorageBound) {
		return false, err
	}
	if err != nil || !ok {
		return false, storeErr("create alert", err)
	}
	return true, storeErr("create alert", tx.Commit())
}

const alertCols = `id, account_id, severity, kind, message, sandbox_id, session_id, coalesce(dedupe_key, ''), created_at, acknowledged_at`

func scanAlert(sc interface{ Scan(...any) error }) (store.Alert, error) {
	var a store.Alert
	var created string
	var acked sql.NullString
	if err := sc.Scan(&a.ID, &a.Account, &a.Severity, &a.Kind, &a.Message, &a.SandboxID, &a.SessionID, &a.DedupeKey, &created, &acked); err != nil {
		if errors.Is(err, sql.ErrNoRows) {
			return a, store.ErrNotFound
		}
		return a, err
	}
	var err error
	if a.CreatedAt, err = parseTime(created); err != nil {
		return a, err
	}
	a.AcknowledgedAt, err = parseTimePtr(acked)
	return a, err
}

// ListAlerts implements store.Store, newest first.
func (d *DB) ListAlerts(ctx context.Context, account string, unackedOnly bool) ([]store.Alert, error) {
	q := `SELECT ` + alertCols + ` FROM alerts WHERE account_id = ?`
	if unackedOnly {
		q += ` AND acknowledged_at IS NULL`
	}
	rows, err := d.rd.QueryContext(ctx, q+` ORDER BY created_at DESC, id DESC LIMIT 1000`, account)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := []store.Alert{}
	for rows.Next() {
		a, err := scanAlert(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, a)
	}
	return out, rows.Err()
}

// AckAlert implements store.Store: acknowledging twice keeps the first time.
func (d *DB) AckAlert(ctx context.Context, account, id string, at time.Time) (store.Alert, error) {
	res, err := d.db.ExecContext(ctx, `UPDATE alerts SET acknowledged_at = coalesce(acknowledged_at, ?) WHERE id = ? AND account_id = ?`,
		fmtTime(at), id, account)
	if err != nil {
		return store.Alert{}, fmt.Errorf("acknowledge alert: %w", err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return store.Alert{}, store.ErrNotFound
	}
	return scanAlert(d.rd.QueryRowContext(ctx, `SELECT `+alertCols+` FROM alerts WHERE id = ?`, id))
}
