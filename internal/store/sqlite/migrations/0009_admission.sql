-- Creates in progress hold a slot of their account's concurrent cap until
-- their sandbox is recorded or they fail (store.AdmissionStore): every
-- server sharing the database counts them.
CREATE TABLE sandbox_reservations (
    holder      TEXT PRIMARY KEY,
    owner       TEXT NOT NULL,
    created_at  TEXT NOT NULL
);
CREATE INDEX sandbox_reservations_owner ON sandbox_reservations (owner, created_at);

-- Executions counted against monthly quotas, per account and month.
CREATE TABLE execution_counts (
    account_id  TEXT NOT NULL,
    month       TEXT NOT NULL,
    n           INTEGER NOT NULL,
    PRIMARY KEY (account_id, month)
);
