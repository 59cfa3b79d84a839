-- What each account's snapshots hold on each server's disk
-- (store.StorageStore.SetSnapshotBytes, internal/server snapshots.go):
-- disk names the snapshot dir that holds them, so that servers sharing
-- the store with disks of their own each count theirs.
CREATE TABLE snapshot_bytes (
    disk        TEXT NOT NULL,
    account_id  TEXT NOT NULL,
    bytes       bigint NOT NULL,
    PRIMARY KEY (disk, account_id)
);
-- Snapshots are metered with the account's storage (MeterStorage): their
-- share of each hour's GB-seconds, which gb_seconds includes.
ALTER TABLE storage_hours ADD COLUMN snapshot_gb_seconds double precision NOT NULL DEFAULT 0;
