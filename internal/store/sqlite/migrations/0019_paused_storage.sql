-- What a sandbox's checkpoint and kept disk held while it was paused,
-- in GB-seconds, per hour (internal/metering: paused storage).
ALTER TABLE usage_hours ADD COLUMN paused_gb_seconds REAL NOT NULL DEFAULT 0;
