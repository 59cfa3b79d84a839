-- Batch jobs (store.BatchStore, internal/batch): a handler run over many
-- inputs, each input an item that ends once.
CREATE TABLE batches (
    id           text PRIMARY KEY,
    owner        text NOT NULL,
    status       text NOT NULL,
    template     text NOT NULL,
    language     text NOT NULL,
    code         text NOT NULL,
    concurrency  integer NOT NULL,
    timeout_ms   bigint NOT NULL,
    retries      integer NOT NULL,
    resources    text,
    created_at   timestamptz NOT NULL,
    ended_at     timestamptz,
    error_code   text NOT NULL DEFAULT '',
    error        text NOT NULL DEFAULT ''
);
CREATE INDEX batches_owner ON batches (owner, created_at);
CREATE INDEX batches_status ON batches (status);
CREATE TABLE batch_items (
    batch_id   text NOT NULL REFERENCES batches (id) ON DELETE CASCADE,
    idx        integer NOT NULL,
    input      text NOT NULL,
    status     text NOT NULL,
    attempts   integer NOT NULL DEFAULT 0,
    result     text,
    error      text,
    ended_at   timestamptz,
    PRIMARY KEY (batch_id, idx)
);
