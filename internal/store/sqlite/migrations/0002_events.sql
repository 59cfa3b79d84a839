-- Sandbox events (internal/events) and webhooks. Event ids only grow
-- (AUTOINCREMENT never reuses an id, even after retention deletes the
-- newest rows), so an id is a stable cursor and SSE Last-Event-ID.
CREATE TABLE events (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    time         TEXT NOT NULL,
    type         TEXT NOT NULL,
    sandbox_id   TEXT NOT NULL DEFAULT '',
    owner        TEXT NOT NULL,
    execution_id TEXT NOT NULL DEFAULT '',
    details      TEXT NOT NULL DEFAULT '{}'
);
CREATE INDEX events_owner ON events (owner, id);
CREATE INDEX events_sandbox ON events (sandbox_id, id);
CREATE INDEX events_time ON events (time);

CREATE TABLE webhooks (
    id         TEXT PRIMARY KEY,
    owner      TEXT NOT NULL,
    url        TEXT NOT NULL,
    secret     TEXT NOT NULL,
    types      TEXT NOT NULL DEFAULT '[]',
    created_at TEXT NOT NULL
);
CREATE INDEX webhooks_owner ON webhooks (owner);

CREATE TABLE webhook_deliveries (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    webhook_id  TEXT NOT NULL REFERENCES webhooks (id) ON DELETE CASCADE,
    event_id    INTEGER NOT NULL,
    event_type  TEXT NOT NULL,
    attempt     INTEGER NOT NULL,
    status_code INTEGER NOT NULL DEFAULT 0,
    error       TEXT NOT NULL DEFAULT '',
    succeeded   INTEGER NOT NULL DEFAULT 0,
    time        TEXT NOT NULL,
    duration_ms REAL NOT NULL DEFAULT 0
);
CREATE INDEX webhook_deliveries_webhook ON webhook_deliveries (webhook_id, id);
CREATE INDEX webhook_deliveries_time ON webhook_deliveries (time);
