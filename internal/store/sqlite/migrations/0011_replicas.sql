-- Replicas: servers that share their sandboxes over one database (the
-- Kubernetes backend). Each records until when it is alive and renews it
-- well before then; an execution names the replica running it, so that
-- when one dies the others end its executions (store.ReplicaStore).
CREATE TABLE replicas (
    id          TEXT PRIMARY KEY,
    alive_until TEXT NOT NULL
);
ALTER TABLE executions ADD COLUMN replica TEXT NOT NULL DEFAULT '';

-- Meter leases: the one replica that meters a shared sandbox, until when,
-- and the sandbox's counters as metered so far (its CPU counter, and the
-- time up to which it is metered), from which the next holder goes on.
-- ended: the sandbox stopped and its last usage is metered.
CREATE TABLE meter_leases (
    sandbox_id  TEXT PRIMARY KEY,
    replica     TEXT NOT NULL,
    lease_until TEXT NOT NULL,
    ended       INTEGER NOT NULL DEFAULT 0,
    cpu_ns      INTEGER NOT NULL,
    metered_at  TEXT NOT NULL
);
