-- Creates in progress hold a slot of their account's concurrent cap until
-- their sandbox is recorded or they fail (store.AdmissionStore): every
-- server sharing the database counts them.
CREATE TABLE sandbox_reservations (
    holder      text PRIMARY KEY,
    owner       text NOT NULL,
    created_at  timestamptz NOT NULL
);
CREATE INDEX sandbox_reservations_owner ON sandbox_reservations (owner, created_at);

-- Executions counted against monthly quotas, per account and month.
CREATE TABLE execution_counts (
    account_id  text NOT NULL,
    month       timestamptz NOT NULL,
    n           bigint NOT NULL,
    PRIMARY KEY (account_id, month)
);
