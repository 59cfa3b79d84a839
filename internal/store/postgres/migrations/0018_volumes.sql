-- Each account's persistent volumes (store.VolumeStore, internal/server
-- volumes.go): id names the volume's storage on the host.
CREATE TABLE volumes (
    owner       text NOT NULL,
    name        text NOT NULL,
    id          text NOT NULL UNIQUE,
    size_bytes  bigint NOT NULL,
    created_at  timestamptz NOT NULL,
    PRIMARY KEY (owner, name)
);
