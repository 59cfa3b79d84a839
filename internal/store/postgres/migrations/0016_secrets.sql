-- Each account's secrets (store.SecretStore, internal/secrets): the value
-- only sealed (nonce and AEAD ciphertext under the server key key_id, the
-- owner, name and version as additional data), never in clear.
CREATE TABLE secrets (
    owner         text NOT NULL,
    name          text NOT NULL,
    metadata      text NOT NULL DEFAULT '{}',
    version       bigint NOT NULL,
    key_id        text NOT NULL,
    sealed        bytea NOT NULL,
    created_at    timestamptz NOT NULL,
    updated_at    timestamptz NOT NULL,
    last_used_at  timestamptz,
    PRIMARY KEY (owner, name)
);
CREATE INDEX secrets_key ON secrets (key_id);
