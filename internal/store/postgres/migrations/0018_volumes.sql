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
-- Volumes are metered with the account's storage (MeterStorage): their
-- share of each hour's GB-seconds, which gb_seconds includes.
ALTER TABLE storage_hours ADD COLUMN volume_gb_seconds double precision NOT NULL DEFAULT 0;
