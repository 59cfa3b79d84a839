-- Each account's persistent volumes (store.VolumeStore, internal/server
-- volumes.go): id names the volume's storage on the host.
CREATE TABLE volumes (
    owner       TEXT NOT NULL,
    name        TEXT NOT NULL,
    id          TEXT NOT NULL UNIQUE,
    size_bytes  INTEGER NOT NULL,
    created_at  TEXT NOT NULL,
    PRIMARY KEY (owner, name)
);
