-- Model tokens relayed to providers (internal/llm), per account, model and
-- hour. Flushes add deltas, like usage_hours.
CREATE TABLE token_hours (
    account_id        TEXT NOT NULL,
    model             TEXT NOT NULL,
    hour              TEXT NOT NULL,
    requests          INTEGER NOT NULL DEFAULT 0,
    prompt_tokens     INTEGER NOT NULL DEFAULT 0,
    completion_tokens INTEGER NOT NULL DEFAULT 0,
    cost_micros       REAL NOT NULL DEFAULT 0,
    PRIMARY KEY (account_id, model, hour)
);

-- A session binds a model to a sandbox; its id is the sandbox's.
CREATE TABLE sessions (
    id          TEXT PRIMARY KEY,
    owner       TEXT NOT NULL,
    model       TEXT NOT NULL,
    created_at  TEXT NOT NULL
);
CREATE INDEX sessions_owner ON sessions (owner, created_at);
