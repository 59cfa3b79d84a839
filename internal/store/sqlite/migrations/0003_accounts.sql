-- Accounts own keys, sandboxes, usage, credits and alerts. An account's id
-- is the "owner" its keys and sandboxes already carry, so nothing else
-- changes: every owner of an existing key (by default each key is its own
-- owner) becomes an account of its own, named after that owner.
CREATE TABLE accounts (
    id          TEXT PRIMARY KEY,
    name        TEXT NOT NULL UNIQUE,
    created_at  TEXT NOT NULL,
    limits      TEXT NOT NULL DEFAULT '{}'
);
INSERT INTO accounts (id, name, created_at)
    SELECT owner, owner, min(created_at) FROM keys GROUP BY owner;
INSERT OR IGNORE INTO accounts (id, name, created_at)
    SELECT owner, owner, min(created_at) FROM sandboxes GROUP BY owner;

-- admin keys manage accounts; user keys use the API.
ALTER TABLE keys ADD COLUMN role TEXT NOT NULL DEFAULT 'user';

-- Metered usage in per-hour buckets of each sandbox. Flushes add deltas,
-- so a bucket is written many times and never counts a second twice.
CREATE TABLE usage_hours (
    sandbox_id          TEXT NOT NULL,
    account_id          TEXT NOT NULL,
    template            TEXT NOT NULL DEFAULT '',
    hour                TEXT NOT NULL,
    wall_ns             INTEGER NOT NULL DEFAULT 0,
    cpu_ns              INTEGER NOT NULL DEFAULT 0,
    gb_seconds_reserved REAL NOT NULL DEFAULT 0,
    gb_seconds_used     REAL NOT NULL DEFAULT 0,
    disk_peak_bytes     INTEGER NOT NULL DEFAULT 0,
    executions          INTEGER NOT NULL DEFAULT 0,
    commands            INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (sandbox_id, hour)
);
CREATE INDEX usage_hours_account ON usage_hours (account_id, hour);

-- Credits: every grant and deduction is a row; the balance is their sum.
CREATE TABLE credit_ledger (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    account_id    TEXT NOT NULL,
    created_at    TEXT NOT NULL,
    kind          TEXT NOT NULL,
    amount_micros INTEGER NOT NULL,
    reason        TEXT NOT NULL DEFAULT ''
);
CREATE INDEX credit_ledger_account ON credit_ledger (account_id, id);

CREATE TABLE alerts (
    id              TEXT PRIMARY KEY,
    account_id      TEXT NOT NULL,
    severity        TEXT NOT NULL,
    kind            TEXT NOT NULL,
    message         TEXT NOT NULL,
    sandbox_id      TEXT NOT NULL DEFAULT '',
    session_id      TEXT NOT NULL DEFAULT '',
    dedupe_key      TEXT,
    created_at      TEXT NOT NULL,
    acknowledged_at TEXT
);
CREATE UNIQUE INDEX alerts_dedupe ON alerts (account_id, dedupe_key) WHERE dedupe_key IS NOT NULL;
CREATE INDEX alerts_account ON alerts (account_id, created_at);
