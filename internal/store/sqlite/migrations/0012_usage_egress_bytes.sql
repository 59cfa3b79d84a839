-- Bytes the egress gateway carried to and from a sandbox (the payload of
-- its TCP connections), per hour.
ALTER TABLE usage_hours ADD COLUMN egress_bytes_in INTEGER NOT NULL DEFAULT 0;
ALTER TABLE usage_hours ADD COLUMN egress_bytes_out INTEGER NOT NULL DEFAULT 0;
