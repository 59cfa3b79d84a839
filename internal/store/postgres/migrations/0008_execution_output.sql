-- An execution's record keeps the code it ran and its output (stdout,
-- stderr, results, error as the API showed them, JSON) for the
-- sandbox's execution history; the server bounds both, and the output
-- of all but a sandbox's newest executions is cleared (sandboxes.go).
-- The code is bytea: it is the user's, and may hold NUL (JSON's \u0000),
-- which text cannot. The output is JSON from encoding/json: NUL is
-- escaped there.
ALTER TABLE executions ADD COLUMN code bytea NOT NULL DEFAULT '';
ALTER TABLE executions ADD COLUMN output text NOT NULL DEFAULT '';
