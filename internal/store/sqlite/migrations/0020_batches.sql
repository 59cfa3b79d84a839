-- Batch jobs (store.BatchStore, internal/batch): a handler run over many
-- inputs, each input an item that ends once.
CREATE TABLE batches (
    id           TEXT PRIMARY KEY,
    owner        TEXT NOT NULL,
    status       TEXT NOT NULL,
    template     TEXT NOT NULL,
    language     TEXT NOT NULL,
    code         TEXT NOT NULL,
    concurrency  INTEGER NOT NULL,
    timeout_ms   INTEGER NOT NULL,
    retries      INTEGER NOT NULL,
    resources    TEXT,
    created_at   TEXT NOT NULL,
    ended_at     TEXT,
    error_code   TEXT NOT NULL DEFAULT '',
    error        TEXT NOT NULL DEFAULT ''
);
CREATE INDEX batches_owner ON batches (owner, created_at);
CREATE INDEX batches_status ON batches (status);
CREATE TABLE batch_items (
    batch_id   TEXT NOT NULL REFERENCES batches (id) ON DELETE CASCADE,
    idx        INTEGER NOT NULL,
    input      TEXT NOT NULL,
    status     TEXT NOT NULL,
    attempts   INTEGER NOT NULL DEFAULT 0,
    result     TEXT,
    error      TEXT,
    ended_at   TEXT,
    PRIMARY KEY (batch_id, idx)
);
