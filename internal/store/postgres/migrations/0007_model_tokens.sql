-- Model tokens relayed to providers (internal/llm), per account, model and
-- hour. Flushes add deltas, like usage_hours.
CREATE TABLE token_hours (
    account_id        text NOT NULL,
    model             text NOT NULL,
    hour              timestamptz NOT NULL,
    requests          bigint NOT NULL DEFAULT 0,
    prompt_tokens     bigint NOT NULL DEFAULT 0,
    completion_tokens bigint NOT NULL DEFAULT 0,
    cost_micros       double precision NOT NULL DEFAULT 0,
    PRIMARY KEY (account_id, model, hour)
);

-- A session binds a model to a sandbox; its id is the sandbox's.
CREATE TABLE sessions (
    id          text PRIMARY KEY,
    owner       text NOT NULL,
    model       text NOT NULL,
    created_at  timestamptz NOT NULL
);
CREATE INDEX sessions_owner ON sessions (owner, created_at);
