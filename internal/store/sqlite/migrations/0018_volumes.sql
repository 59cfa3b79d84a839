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
-- Volumes are metered with the account's storage (MeterStorage): their
-- share of each hour's GB-seconds, which gb_seconds includes.
ALTER TABLE storage_hours ADD COLUMN volume_gb_seconds REAL NOT NULL DEFAULT 0;
