-- Sandbox events (internal/events) and webhooks. Event ids come from a
-- sequence, which never gives an id twice (not even after retention
-- deletes the newest rows), so an id is a stable cursor and SSE
-- Last-Event-ID. AddEvents takes a lock so that ids also become visible
-- in order (events.go).
CREATE TABLE events (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    time         timestamptz NOT NULL,
    type         text NOT NULL,
    sandbox_id   text NOT NULL DEFAULT '',
    owner        text NOT NULL,
    execution_id text NOT NULL DEFAULT '',
    details      text NOT NULL DEFAULT '{}'
);
CREATE INDEX events_owner ON events (owner, id);
CREATE INDEX events_sandbox ON events (sandbox_id, id);
CREATE INDEX events_time ON events (time);

CREATE TABLE webhooks (
    id         text PRIMARY KEY,
    owner      text NOT NULL,
    url        text NOT NULL,
    secret     text NOT NULL,
    types      text[] NOT NULL DEFAULT '{}',
    created_at timestamptz NOT NULL
);
CREATE INDEX webhooks_owner ON webhooks (owner);

CREATE TABLE webhook_deliveries (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    webhook_id  text NOT NULL REFERENCES webhooks (id) ON DELETE CASCADE,
    event_id    bigint NOT NULL,
    event_type  text NOT NULL,
    attempt     integer NOT NULL,
    status_code integer NOT NULL DEFAULT 0,
    error       text NOT NULL DEFAULT '',
    succeeded   boolean NOT NULL DEFAULT false,
    time        timestamptz NOT NULL,
    duration_ms double precision NOT NULL DEFAULT 0
);
CREATE INDEX webhook_deliveries_webhook ON webhook_deliveries (webhook_id, id);
CREATE INDEX webhook_deliveries_time ON webhook_deliveries (time);
