-- An execution is recorded when it starts (status 'running') and again
-- when it ends; error says why one ended without a result of its own
-- (an engine error, or "server restarted" for one a crash cut).
ALTER TABLE executions ADD COLUMN error text NOT NULL DEFAULT '';
CREATE INDEX executions_status ON executions (status) WHERE status = 'running';
