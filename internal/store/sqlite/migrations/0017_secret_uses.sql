-- Each use of a secret at the egress gateway (store.SecretUse,
-- internal/egress inject.go), and how many injected a value. Uses of a
-- secret are deleted with it; each keeps its newest 1000.
ALTER TABLE secrets ADD COLUMN use_count INTEGER NOT NULL DEFAULT 0;
CREATE TABLE secret_uses (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    owner       TEXT NOT NULL,
    name        TEXT NOT NULL,
    sandbox_id  TEXT NOT NULL,
    host        TEXT NOT NULL,
    method      TEXT NOT NULL,
    path        TEXT NOT NULL,
    outcome     TEXT NOT NULL,
    at          TEXT NOT NULL
);
CREATE INDEX secret_uses_secret ON secret_uses (owner, name, id);
