-- Per-minute rate limits counted for every server sharing the database
-- (store.RateStore): one token bucket per key, kept as the time, in
-- nanoseconds since 1970 UTC, at which it is full again. allowed is the
-- outcome of the last take, which the take's statement returns. Rows
-- whose time has passed are full buckets and are deleted.
CREATE TABLE rate_buckets (
    key      TEXT PRIMARY KEY,
    full_at  INTEGER NOT NULL,
    allowed  INTEGER NOT NULL
);
