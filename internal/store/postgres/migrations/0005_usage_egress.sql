-- Requests a sandbox made through the egress gateway (connections, and
-- plain HTTP requests after a connection's first), per hour.
ALTER TABLE usage_hours ADD COLUMN egress_requests bigint NOT NULL DEFAULT 0;
