-- Accounts own keys, sandboxes, usage, credits and alerts. An account's id
-- is the "owner" its keys and sandboxes already carry, so nothing else
-- changes: every owner of an existing key (by default each key is its own
-- owner) becomes an account of its own, named after that owner.
CREATE TABLE accounts (
    id          text PRIMARY KEY,
    name        text NOT NULL UNIQUE,
    created_at  timestamptz NOT NULL,
    limits      text NOT NULL DEFAULT '{}'
);
INSERT INTO accounts (id, name, created_at)
    SELECT owner, owner, min(created_at) FROM keys GROUP BY owner;
INSERT INTO accounts (id, name, created_at)
    SELECT owner, owner, min(created_at) FROM sandboxes GROUP BY owner
    ON CONFLICT DO NOTHING;

-- admin keys manage accounts; user keys use the API.
ALTER TABLE keys ADD COLUMN role text NOT NULL DEFAULT 'user';

-- Metered usage in per-hour buckets of each sandbox. Flushes add deltas,
-- so a bucket is written many times and never counts a second twice.
CREATE TABLE usage_hours (
    sandbox_id          text NOT NULL,
    account_id          text NOT NULL,
    template            text NOT NULL DEFAULT '',
    hour                timestamptz NOT NULL,
    wall_ns             bigint NOT NULL DEFAULT 0,
    cpu_ns              bigint NOT NULL DEFAULT 0,
    gb_seconds_reserved double precision NOT NULL DEFAULT 0,
    gb_seconds_used     double precision NOT NULL DEFAULT 0,
    disk_peak_bytes     bigint NOT NULL DEFAULT 0,
    executions          bigint NOT NULL DEFAULT 0,
    commands            bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (sandbox_id, hour)
);
CREATE INDEX usage_hours_account ON usage_hours (account_id, hour);

-- Credits: every grant and deduction is a row; the balance is their sum.
CREATE TABLE credit_ledger (
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    account_id    text NOT NULL,
    created_at    timestamptz NOT NULL,
    kind          text NOT NULL,
    amount_micros bigint NOT NULL,
    reason        text NOT NULL DEFAULT ''
);
CREATE INDEX credit_ledger_account ON credit_ledger (account_id, id);

CREATE TABLE alerts (
    id              text PRIMARY KEY,
    account_id      text NOT NULL,
    severity        text NOT NULL,
    kind            text NOT NULL,
    message         text NOT NULL,
    sandbox_id      text NOT NULL DEFAULT '',
    session_id      text NOT NULL DEFAULT '',
    dedupe_key      text,
    created_at      timestamptz NOT NULL,
    acknowledged_at timestamptz
);
CREATE UNIQUE INDEX alerts_dedupe ON alerts (account_id, dedupe_key) WHERE dedupe_key IS NOT NULL;
CREATE INDEX alerts_account ON alerts (account_id, created_at);
