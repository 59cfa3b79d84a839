-- Replicas: servers that share their sandboxes over one database (the
-- Kubernetes backend). Each records until when it is alive and renews it
-- well before then; an execution names the replica running it, so that
-- when one dies the others end its executions (store.ReplicaStore).
CREATE TABLE replicas (
    id          text PRIMARY KEY,
    alive_until timestamptz NOT NULL
);
ALTER TABLE executions ADD COLUMN replica text NOT NULL DEFAULT '';

-- Meter leases: the one replica that meters a shared sandbox, until when,
-- and the sandbox's counters as metered so far (its CPU counter, and the
-- time up to which it is metered), from which the next holder goes on.
-- ended: the sandbox stopped and its last usage is metered.
CREATE TABLE meter_leases (
    sandbox_id  text PRIMARY KEY,
    replica     text NOT NULL,
    lease_until timestamptz NOT NULL,
    ended       boolean NOT NULL DEFAULT false,
    cpu_ns      bigint NOT NULL,
    metered_at  timestamptz NOT NULL
);
