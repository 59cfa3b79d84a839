-- What each account keeps, by kind of record (store.Kind*): how many
-- records and their bytes, counted by the triggers below on every insert,
-- update and delete, so that whatever writes or deletes keeps the count
-- exact. A record's bytes are its text fields' octets plus 128
-- (store.RecordOverhead), as SQLite counts them. The triggers run once a
-- statement, over its transition tables, and take the rows of stored in
-- account order, so that two statements never wait for each other's in
-- a cycle. The writes bound each account's records with it
-- (store.StorageStore).
CREATE TABLE stored (
    account_id  text NOT NULL,
    kind        text NOT NULL,
    records     bigint NOT NULL DEFAULT 0,
    bytes       bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (account_id, kind)
);

-- A delivery names its webhook's owner, whose records it is.
ALTER TABLE webhook_deliveries ADD COLUMN owner text NOT NULL DEFAULT '';
UPDATE webhook_deliveries d SET owner = w.owner FROM webhooks w WHERE w.id = d.webhook_id;
CREATE INDEX webhook_deliveries_owner ON webhook_deliveries (owner, id);
-- The oldest of an account's executions, and of its stopped sandboxes,
-- go first.
CREATE INDEX executions_owner ON executions (owner, created_at);
CREATE INDEX sandboxes_owner_stopped ON sandboxes (owner, stopped_at) WHERE state = 'stopped';

-- Each kind's bytes of one record (a name each: the rows of a trigger's
-- transition tables are records, which the functions' argument types would
-- not tell apart).
CREATE FUNCTION sandboxes_size(r sandboxes) RETURNS bigint LANGUAGE sql IMMUTABLE AS $$
    SELECT octet_length(r.id)::bigint + octet_length(r.owner) + octet_length(r.template) + octet_length(r.state)
        + octet_length(r.stop_reason) + octet_length(r.metadata) + octet_length(r.resources) + octet_length(r.policy) + 128
$$;
CREATE FUNCTION executions_size(r executions) RETURNS bigint LANGUAGE sql IMMUTABLE AS $$
    SELECT octet_length(r.id)::bigint + octet_length(r.sandbox_id) + octet_length(r.owner) + octet_length(r.language)
        + octet_length(r.status) + octet_length(r.error_code) + octet_length(r.error) + octet_length(r.code)
        + octet_length(r.output) + octet_length(r.replica) + 128
$$;
CREATE FUNCTION events_size(r events) RETURNS bigint LANGUAGE sql IMMUTABLE AS $$
    SELECT octet_length(r.type)::bigint + octet_length(r.sandbox_id) + octet_length(r.owner) + octet_length(r.execution_id)
        + octet_length(r.details) + octet_length(r.source) + 128
$$;
CREATE FUNCTION alerts_size(r alerts) RETURNS bigint LANGUAGE sql IMMUTABLE AS $$
    SELECT octet_length(r.id)::bigint + octet_length(r.account_id) + octet_length(r.severity) + octet_length(r.kind)
        + octet_length(r.message) + octet_length(r.sandbox_id) + octet_length(r.session_id)
        + octet_length(coalesce(r.dedupe_key, '')) + 128
$$;
CREATE FUNCTION deliveries_size(r webhook_deliveries) RETURNS bigint LANGUAGE sql IMMUTABLE AS $$
    SELECT octet_length(r.webhook_id)::bigint + octet_length(r.event_type) + octet_length(r.error) + octet_length(r.owner) + 128
$$;

INSERT INTO stored (account_id, kind, records, bytes)
    SELECT owner, 'sandboxes', count(*), sum(sandboxes_size(r)) FROM sandboxes r GROUP BY owner;
INSERT INTO stored (account_id, kind, records, bytes)
    SELECT owner, 'executions', count(*), sum(executions_size(r)) FROM executions r GROUP BY owner;
INSERT INTO stored (account_id, kind, records, bytes)
    SELECT owner, 'events', count(*), sum(events_size(r)) FROM events r GROUP BY owner;
INSERT INTO stored (account_id, kind, records, bytes)
    SELECT account_id, 'alerts', count(*), sum(alerts_size(r)) FROM alerts r GROUP BY account_id;
INSERT INTO stored (account_id, kind, records, bytes)
    SELECT owner, 'deliveries', count(*), sum(deliveries_size(r)) FROM webhook_deliveries r GROUP BY owner;

-- stored_count adds each account's records and bytes of one statement
-- (negative for those it removed) in account order.
CREATE FUNCTION stored_count(k text, accounts text[], records bigint[], bytes bigint[]) RETURNS void LANGUAGE sql AS $$
    INSERT INTO stored (account_id, kind, records, bytes)
        SELECT a, k, n, b FROM unnest(accounts, records, bytes) AS t(a, n, b) ORDER BY a
    ON CONFLICT (account_id, kind) DO UPDATE SET records = stored.records + excluded.records, bytes = stored.bytes + excluded.bytes
$$;

CREATE FUNCTION sandboxes_stored() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE a text[]; n bigint[]; b bigint[];
BEGIN
    IF TG_OP = 'INSERT' THEN
        SELECT array_agg(owner), array_agg(c), array_agg(s) INTO a, n, b
            FROM (SELECT owner, count(*) c, sum(sandboxes_size(r)) s FROM new_rows r GROUP BY owner) t;
    ELSIF TG_OP = 'DELETE' THEN
        SELECT array_agg(owner), array_agg(c), array_agg(s) INTO a, n, b
            FROM (SELECT owner, -count(*) c, -sum(sandboxes_size(r)) s FROM old_rows r GROUP BY owner) t;
    ELSE
        SELECT array_agg(owner), array_agg(c), array_agg(s) INTO a, n, b
            FROM (SELECT owner, sum(c)::bigint c, sum(s)::bigint s FROM (
                SELECT owner, 1 c, sandboxes_size(r) s FROM new_rows r
                UNION ALL SELECT owner, -1, -sandboxes_size(r) FROM old_rows r) u GROUP BY owner) t;
    END IF;
    IF a IS NOT NULL THEN PERFORM stored_count('sandboxes', a, n, b); END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER sandboxes_stored_insert AFTER INSERT ON sandboxes REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION sandboxes_stored();
CREATE TRIGGER sandboxes_stored_update AFTER UPDATE ON sandboxes REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION sandboxes_stored();
CREATE TRIGGER sandboxes_stored_delete AFTER DELETE ON sandboxes REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION sandboxes_stored();

CREATE FUNCTION executions_stored() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE a text[]; n bigint[]; b bigint[];
BEGIN
    IF TG_OP = 'INSERT' THEN
        SELECT array_agg(owner), array_agg(c), array_agg(s) INTO a, n, b
            FROM (SELECT owner, count(*) c, sum(executions_size(r)) s FROM new_rows r GROUP BY owner) t;
    ELSIF TG_OP = 'DELETE' THEN
        SELECT array_agg(owner), array_agg(c), array_agg(s) INTO a, n, b
            FROM (SELECT owner, -count(*) c, -sum(executions_size(r)) s FROM old_rows r GROUP BY owner) t;
    ELSE
        SELECT array_agg(owner), array_agg(c), array_agg(s) INTO a, n, b
            FROM (SELECT owner, sum(c)::bigint c, sum(s)::bigint s FROM (
                SELECT owner, 1 c, executions_size(r) s FROM new_rows r
                UNION ALL SELECT owner, -1, -executions_size(r) FROM old_rows r) u GROUP BY owner) t;
    END IF;
    IF a IS NOT NULL THEN PERFORM stored_count('executions', a, n, b); END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER executions_stored_insert AFTER INSERT ON executions REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION executions_stored();
CREATE TRIGGER executions_stored_update AFTER UPDATE ON executions REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION executions_stored();
CREATE TRIGGER executions_stored_delete AFTER DELETE ON executions REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION executions_stored();

CREATE FUNCTION events_stored() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE a text[]; n bigint[]; b bigint[];
BEGIN
    IF TG_OP = 'INSERT' THEN
        SELECT array_agg(owner), array_agg(c), array_agg(s) INTO a, n, b
            FROM (SELECT owner, count(*) c, sum(events_size(r)) s FROM new_rows r GROUP BY owner) t;
    ELSE
        SELECT array_agg(owner), array_agg(c), array_agg(s) INTO a, n, b
            FROM (SELECT owner, -count(*) c, -sum(events_size(r)) s FROM old_rows r GROUP BY owner) t;
    END IF;
    IF a IS NOT NULL THEN PERFORM stored_count('events', a, n, b); END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER events_stored_insert AFTER INSERT ON events REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION events_stored();
CREATE TRIGGER events_stored_delete AFTER DELETE ON events REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION events_stored();

CREATE FUNCTION alerts_stored() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE a text[]; n bigint[]; b bigint[];
BEGIN
    IF TG_OP = 'INSERT' THEN
        SELECT array_agg(account_id), array_agg(c), array_agg(s) INTO a, n, b
            FROM (SELECT account_id, count(*) c, sum(alerts_size(r)) s FROM new_rows r GROUP BY account_id) t;
    ELSIF TG_OP = 'DELETE' THEN
        SELECT array_agg(account_id), array_agg(c), array_agg(s) INTO a, n, b
            FROM (SELECT account_id, -count(*) c, -sum(alerts_size(r)) s FROM old_rows r GROUP BY account_id) t;
    ELSE
        SELECT array_agg(account_id), array_agg(c), array_agg(s) INTO a, n, b
            FROM (SELECT account_id, sum(c)::bigint c, sum(s)::bigint s FROM (
                SELECT account_id, 1 c, alerts_size(r) s FROM new_rows r
                UNION ALL SELECT account_id, -1, -alerts_size(r) FROM old_rows r) u GROUP BY account_id) t;
    END IF;
    IF a IS NOT NULL THEN PERFORM stored_count('alerts', a, n, b); END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER alerts_stored_insert AFTER INSERT ON alerts REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION alerts_stored();
CREATE TRIGGER alerts_stored_update AFTER UPDATE ON alerts REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION alerts_stored();
CREATE TRIGGER alerts_stored_delete AFTER DELETE ON alerts REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION alerts_stored();

CREATE FUNCTION deliveries_stored() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE a text[]; n bigint[]; b bigint[];
BEGIN
    IF TG_OP = 'INSERT' THEN
        SELECT array_agg(owner), array_agg(c), array_agg(s) INTO a, n, b
            FROM (SELECT owner, count(*) c, sum(deliveries_size(r)) s FROM new_rows r GROUP BY owner) t;
    ELSE
        SELECT array_agg(owner), array_agg(c), array_agg(s) INTO a, n, b
            FROM (SELECT owner, -count(*) c, -sum(deliveries_size(r)) s FROM old_rows r GROUP BY owner) t;
    END IF;
    IF a IS NOT NULL THEN PERFORM stored_count('deliveries', a, n, b); END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER deliveries_stored_insert AFTER INSERT ON webhook_deliveries REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION deliveries_stored();
CREATE TRIGGER deliveries_stored_delete AFTER DELETE ON webhook_deliveries REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION deliveries_stored();
