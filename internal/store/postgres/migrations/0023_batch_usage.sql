-- Batches: items sharing a sandbox per worker (reuse), and what a
-- batch's sandboxes used, summed as each ends (store.BatchUsage).
ALTER TABLE batches ADD COLUMN reuse text NOT NULL DEFAULT '';
ALTER TABLE batches ADD COLUMN sandboxes bigint NOT NULL DEFAULT 0;
ALTER TABLE batches ADD COLUMN wall_nanos bigint NOT NULL DEFAULT 0;
ALTER TABLE batches ADD COLUMN cpu_nanos bigint NOT NULL DEFAULT 0;
ALTER TABLE batches ADD COLUMN gb_seconds_reserved double precision NOT NULL DEFAULT 0;
ALTER TABLE batches ADD COLUMN gb_seconds_used double precision NOT NULL DEFAULT 0;
ALTER TABLE batches ADD COLUMN executions bigint NOT NULL DEFAULT 0;
