-- Each account's secrets (store.SecretStore, internal/secrets): the value
-- only sealed (nonce and AEAD ciphertext under the server key key_id, the
-- owner, name and version as additional data), never in clear.
CREATE TABLE secrets (
    owner         TEXT NOT NULL,
    name          TEXT NOT NULL,
    metadata      TEXT NOT NULL DEFAULT '{}',
    version       INTEGER NOT NULL,
    key_id        TEXT NOT NULL,
    sealed        BLOB NOT NULL,
    created_at    TEXT NOT NULL,
    updated_at    TEXT NOT NULL,
    last_used_at  TEXT,
    PRIMARY KEY (owner, name)
);
CREATE INDEX secrets_key ON secrets (key_id);
