-- What each account keeps, metered over time: the GB-seconds of its
-- records (the sum of stored.bytes) per hour, and the time each account
-- was last metered up to, so that servers sharing the store charge every
-- second once (store.StorageMeterStore).
CREATE TABLE storage_hours (
    account_id  TEXT NOT NULL,
    hour        TEXT NOT NULL,
    gb_seconds  REAL NOT NULL DEFAULT 0,
    PRIMARY KEY (account_id, hour)
);
CREATE TABLE storage_points (
    account_id  TEXT PRIMARY KEY,
    metered_at  TEXT NOT NULL
);
