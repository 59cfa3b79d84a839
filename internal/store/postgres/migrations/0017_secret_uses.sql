-- Each use of a secret at the egress gateway (store.SecretUse,
-- internal/egress inject.go), and how many injected a value. Uses of a
-- secret are deleted with it; each keeps its newest 1000.
ALTER TABLE secrets ADD COLUMN use_count bigint NOT NULL DEFAULT 0;
CREATE TABLE secret_uses (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    owner       text NOT NULL,
    name        text NOT NULL,
    sandbox_id  text NOT NULL,
    host        text NOT NULL,
    method      text NOT NULL,
    path        text NOT NULL,
    outcome     text NOT NULL,
    at          timestamptz NOT NULL
);
CREATE INDEX secret_uses_secret ON secret_uses (owner, name, id);
