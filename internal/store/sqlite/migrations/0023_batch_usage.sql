-- Batches: items sharing a sandbox per worker (reuse), and what a
-- batch's sandboxes used, summed as each ends (store.BatchUsage).
ALTER TABLE batches ADD COLUMN reuse TEXT NOT NULL DEFAULT '';
ALTER TABLE batches ADD COLUMN sandboxes INTEGER NOT NULL DEFAULT 0;
ALTER TABLE batches ADD COLUMN wall_nanos INTEGER NOT NULL DEFAULT 0;
ALTER TABLE batches ADD COLUMN cpu_nanos INTEGER NOT NULL DEFAULT 0;
ALTER TABLE batches ADD COLUMN gb_seconds_reserved REAL NOT NULL DEFAULT 0;
ALTER TABLE batches ADD COLUMN gb_seconds_used REAL NOT NULL DEFAULT 0;
ALTER TABLE batches ADD COLUMN executions INTEGER NOT NULL DEFAULT 0;
