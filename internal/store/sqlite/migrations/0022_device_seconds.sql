-- The seconds a sandbox held devices (GPUs and other CDI devices),
-- summed over its devices, per hour (internal/metering).
ALTER TABLE usage_hours ADD COLUMN device_seconds REAL NOT NULL DEFAULT 0;
