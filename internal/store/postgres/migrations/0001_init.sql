-- The same tables as sqlite/migrations/0001_init.sql, in PostgreSQL's
-- types: times are timestamptz (microseconds, UTC in and out), JSON is
-- kept as text, verbatim, as SQLite keeps it.
CREATE TABLE keys (
    id          text PRIMARY KEY,
    name        text NOT NULL DEFAULT '',
    owner       text NOT NULL,
    hash        text NOT NULL UNIQUE,
    created_at  timestamptz NOT NULL,
    revoked_at  timestamptz
);

CREATE TABLE sandboxes (
    id          text PRIMARY KEY,
    owner       text NOT NULL,
    template    text NOT NULL,
    state       text NOT NULL,
    created_at  timestamptz NOT NULL,
    expires_at  timestamptz NOT NULL,
    stopped_at  timestamptz,
    stop_reason text NOT NULL DEFAULT '',
    metadata    text NOT NULL DEFAULT '{}',
    resources   text NOT NULL DEFAULT '{}'
);
CREATE INDEX sandboxes_owner_state ON sandboxes (owner, state);
CREATE INDEX sandboxes_state ON sandboxes (state);

CREATE TABLE executions (
    id                text PRIMARY KEY,
    sandbox_id        text NOT NULL,
    owner             text NOT NULL,
    language          text NOT NULL DEFAULT '',
    status            text NOT NULL,
    error_code        text NOT NULL DEFAULT '',
    execution_time_ms double precision NOT NULL DEFAULT 0,
    cpu_time_ms       double precision NOT NULL DEFAULT 0,
    peak_memory_bytes bigint NOT NULL DEFAULT 0,
    created_at        timestamptz NOT NULL
);
CREATE INDEX executions_sandbox ON executions (sandbox_id, created_at);
