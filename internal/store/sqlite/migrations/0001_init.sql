CREATE TABLE keys (
    id          TEXT PRIMARY KEY,
    name        TEXT NOT NULL DEFAULT '',
    owner       TEXT NOT NULL,
    hash        TEXT NOT NULL UNIQUE,
    created_at  TEXT NOT NULL,
    revoked_at  TEXT
);

CREATE TABLE sandboxes (
    id          TEXT PRIMARY KEY,
    owner       TEXT NOT NULL,
    template    TEXT NOT NULL,
    state       TEXT NOT NULL,
    created_at  TEXT NOT NULL,
    expires_at  TEXT NOT NULL,
    stopped_at  TEXT,
    stop_reason TEXT NOT NULL DEFAULT '',
    metadata    TEXT NOT NULL DEFAULT '{}',
    resources   TEXT NOT NULL DEFAULT '{}'
);
CREATE INDEX sandboxes_owner_state ON sandboxes (owner, state);
CREATE INDEX sandboxes_state ON sandboxes (state);

CREATE TABLE executions (
    id                TEXT PRIMARY KEY,
    sandbox_id        TEXT NOT NULL,
    owner             TEXT NOT NULL,
    language          TEXT NOT NULL DEFAULT '',
    status            TEXT NOT NULL,
    error_code        TEXT NOT NULL DEFAULT '',
    execution_time_ms REAL NOT NULL DEFAULT 0,
    cpu_time_ms       REAL NOT NULL DEFAULT 0,
    peak_memory_bytes INTEGER NOT NULL DEFAULT 0,
    created_at        TEXT NOT NULL
);
CREATE INDEX executions_sandbox ON executions (sandbox_id, created_at);
