-- What each account keeps, by kind of record (store.Kind*): how many
-- records and their bytes, counted by the triggers below on every insert,
-- update and delete, so that whatever writes or deletes keeps the count
-- exact. A record's bytes are its text fields' octets plus 128
-- (store.RecordOverhead). The writes bound each account's records with it
-- (store.StorageStore).
CREATE TABLE stored (
    account_id  TEXT NOT NULL,
    kind        TEXT NOT NULL,
    records     INTEGER NOT NULL DEFAULT 0,
    bytes       INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (account_id, kind)
);

-- A delivery names its webhook's owner, whose records it is.
ALTER TABLE webhook_deliveries ADD COLUMN owner TEXT NOT NULL DEFAULT '';
UPDATE webhook_deliveries SET owner = coalesce((SELECT owner FROM webhooks WHERE webhooks.id = webhook_id), '');
CREATE INDEX webhook_deliveries_owner ON webhook_deliveries (owner, id);
-- The oldest of an account's executions, and of its stopped sandboxes,
-- go first.
CREATE INDEX executions_owner ON executions (owner, created_at);
CREATE INDEX sandboxes_owner_stopped ON sandboxes (owner, stopped_at) WHERE state = 'stopped';

INSERT INTO stored (account_id, kind, records, bytes)
    SELECT owner, 'sandboxes', count(*), sum(octet_length(id) + octet_length(owner) + octet_length(template) + octet_length(state)
        + octet_length(stop_reason) + octet_length(metadata) + octet_length(resources) + octet_length(policy) + 128)
    FROM sandboxes GROUP BY owner;
INSERT INTO stored (account_id, kind, records, bytes)
    SELECT owner, 'executions', count(*), sum(octet_length(id) + octet_length(sandbox_id) + octet_length(owner)
        + octet_length(language) + octet_length(status) + octet_length(error_code) + octet_length(error) + octet_length(code)
        + octet_length(output) + octet_length(replica) + 128)
    FROM executions GROUP BY owner;
INSERT INTO stored (account_id, kind, records, bytes)
    SELECT owner, 'events', count(*), sum(octet_length(type) + octet_length(sandbox_id) + octet_length(owner)
        + octet_length(execution_id) + octet_length(details) + octet_length(source) + 128)
    FROM events GROUP BY owner;
INSERT INTO stored (account_id, kind, records, bytes)
    SELECT account_id, 'alerts', count(*), sum(octet_length(id) + octet_length(account_id) + octet_length(severity)
        + octet_length(kind) + octet_length(message) + octet_length(sandbox_id) + octet_length(session_id)
        + octet_length(coalesce(dedupe_key, '')) + 128)
    FROM alerts GROUP BY account_id;
INSERT INTO stored (account_id, kind, records, bytes)
    SELECT owner, 'deliveries', count(*), sum(octet_length(webhook_id) + octet_length(event_type) + octet_length(error)
        + octet_length(owner) + 128)
    FROM webhook_deliveries GROUP BY owner;

CREATE TRIGGER sandboxes_stored_insert AFTER INSERT ON sandboxes BEGIN
    INSERT INTO stored (account_id, kind, records, bytes) VALUES (NEW.owner, 'sandboxes', 1,
        octet_length(NEW.id) + octet_length(NEW.owner) + octet_length(NEW.template) + octet_length(NEW.state)
        + octet_length(NEW.stop_reason) + octet_length(NEW.metadata) + octet_length(NEW.resources) + octet_length(NEW.policy) + 128)
    ON CONFLICT (account_id, kind) DO UPDATE SET records = records + 1, bytes = bytes + excluded.bytes;
END;
CREATE TRIGGER sandboxes_stored_delete AFTER DELETE ON sandboxes BEGIN
    UPDATE stored SET records = records - 1, bytes = bytes - (
        octet_length(OLD.id) + octet_length(OLD.owner) + octet_length(OLD.template) + octet_length(OLD.state)
        + octet_length(OLD.stop_reason) + octet_length(OLD.metadata) + octet_length(OLD.resources) + octet_length(OLD.policy) + 128)
    WHERE account_id = OLD.owner AND kind = 'sandboxes';
END;
CREATE TRIGGER sandboxes_stored_update AFTER UPDATE ON sandboxes BEGIN
    UPDATE stored SET records = records - 1, bytes = bytes - (
        octet_length(OLD.id) + octet_length(OLD.owner) + octet_length(OLD.template) + octet_length(OLD.state)
        + octet_length(OLD.stop_reason) + octet_length(OLD.metadata) + octet_length(OLD.resources) + octet_length(OLD.policy) + 128)
    WHERE account_id = OLD.owner AND kind = 'sandboxes';
    INSERT INTO stored (account_id, kind, records, bytes) VALUES (NEW.owner, 'sandboxes', 1,
        octet_length(NEW.id) + octet_length(NEW.owner) + octet_length(NEW.template) + octet_length(NEW.state)
        + octet_length(NEW.stop_reason) + octet_length(NEW.metadata) + octet_length(NEW.resources) + octet_length(NEW.policy) + 128)
    ON CONFLICT (account_id, kind) DO UPDATE SET records = records + 1, bytes = bytes + excluded.bytes;
END;

CREATE TRIGGER executions_stored_insert AFTER INSERT ON executions BEGIN
    INSERT INTO stored (account_id, kind, records, bytes) VALUES (NEW.owner, 'executions', 1,
        octet_length(NEW.id) + octet_length(NEW.sandbox_id) + octet_length(NEW.owner) + octet_length(NEW.language)
        + octet_length(NEW.status) + octet_length(NEW.error_code) + octet_length(NEW.error) + octet_length(NEW.code)
        + octet_length(NEW.output) + octet_length(NEW.replica) + 128)
    ON CONFLICT (account_id, kind) DO UPDATE SET records = records + 1, bytes = bytes + excluded.bytes;
END;
CREATE TRIGGER executions_stored_delete AFTER DELETE ON executions BEGIN
    UPDATE stored SET records = records - 1, bytes = bytes - (
        octet_length(OLD.id) + octet_length(OLD.sandbox_id) + octet_length(OLD.owner) + octet_length(OLD.language)
        + octet_length(OLD.status) + octet_length(OLD.error_code) + octet_length(OLD.error) + octet_length(OLD.code)
        + octet_length(OLD.output) + octet_length(OLD.replica) + 128)
    WHERE account_id = OLD.owner AND kind = 'executions';
END;
CREATE TRIGGER executions_stored_update AFTER UPDATE ON executions BEGIN
    UPDATE stored SET records = records - 1, bytes = bytes - (
        octet_length(OLD.id) + octet_length(OLD.sandbox_id) + octet_length(OLD.owner) + octet_length(OLD.language)
        + octet_length(OLD.status) + octet_length(OLD.error_code) + octet_length(OLD.error) + octet_length(OLD.code)
        + octet_length(OLD.output) + octet_length(OLD.replica) + 128)
    WHERE account_id = OLD.owner AND kind = 'executions';
    INSERT INTO stored (account_id, kind, records, bytes) VALUES (NEW.owner, 'executions', 1,
        octet_length(NEW.id) + octet_length(NEW.sandbox_id) + octet_length(NEW.owner) + octet_length(NEW.language)
        + octet_length(NEW.status) + octet_length(NEW.error_code) + octet_length(NEW.error) + octet_length(NEW.code)
        + octet_length(NEW.output) + octet_length(NEW.replica) + 128)
    ON CONFLICT (account_id, kind) DO UPDATE SET records = records + 1, bytes = bytes + excluded.bytes;
END;

CREATE TRIGGER events_stored_insert AFTER INSERT ON events BEGIN
    INSERT INTO stored (account_id, kind, records, bytes) VALUES (NEW.owner, 'events', 1,
        octet_length(NEW.type) + octet_length(NEW.sandbox_id) + octet_length(NEW.owner) + octet_length(NEW.execution_id)
        + octet_length(NEW.details) + octet_length(NEW.source) + 128)
    ON CONFLICT (account_id, kind) DO UPDATE SET records = records + 1, bytes = bytes + excluded.bytes;
END;
CREATE TRIGGER events_stored_delete AFTER DELETE ON events BEGIN
    UPDATE stored SET records = records - 1, bytes = bytes - (
        octet_length(OLD.type) + octet_length(OLD.sandbox_id) + octet_length(OLD.owner) + octet_length(OLD.execution_id)
        + octet_length(OLD.details) + octet_length(OLD.source) + 128)
    WHERE account_id = OLD.owner AND kind = 'events';
END;

CREATE TRIGGER alerts_stored_insert AFTER INSERT ON alerts BEGIN
    INSERT INTO stored (account_id, kind, records, bytes) VALUES (NEW.account_id, 'alerts', 1,
        octet_length(NEW.id) + octet_length(NEW.account_id) + octet_length(NEW.severity) + octet_length(NEW.kind)
        + octet_length(NEW.message) + octet_length(NEW.sandbox_id) + octet_length(NEW.session_id)
        + octet_length(coalesce(NEW.dedupe_key, '')) + 128)
    ON CONFLICT (account_id, kind) DO UPDATE SET records = records + 1, bytes = bytes + excluded.bytes;
END;
CREATE TRIGGER alerts_stored_delete AFTER DELETE ON alerts BEGIN
    UPDATE stored SET records = records - 1, bytes = bytes - (
        octet_length(OLD.id) + octet_length(OLD.account_id) + octet_length(OLD.severity) + octet_length(OLD.kind)
        + octet_length(OLD.message) + octet_length(OLD.sandbox_id) + octet_length(OLD.session_id)
        + octet_length(coalesce(OLD.dedupe_key, '')) + 128)
    WHERE account_id = OLD.account_id AND kind = 'alerts';
END;
CREATE TRIGGER alerts_stored_update AFTER UPDATE ON alerts BEGIN
    UPDATE stored SET records = records - 1, bytes = bytes - (
        octet_length(OLD.id) + octet_length(OLD.account_id) + octet_length(OLD.severity) + octet_length(OLD.kind)
        + octet_length(OLD.message) + octet_length(OLD.sandbox_id) + octet_length(OLD.session_id)
        + octet_length(coalesce(OLD.dedupe_key, '')) + 128)
    WHERE account_id = OLD.account_id AND kind = 'alerts';
    INSERT INTO stored (account_id, kind, records, bytes) VALUES (NEW.account_id, 'alerts', 1,
        octet_length(NEW.id) + octet_length(NEW.account_id) + octet_length(NEW.severity) + octet_length(NEW.kind)
        + octet_length(NEW.message) + octet_length(NEW.sandbox_id) + octet_length(NEW.session_id)
        + octet_length(coalesce(NEW.dedupe_key, '')) + 128)
    ON CONFLICT (account_id, kind) DO UPDATE SET records = records + 1, bytes = bytes + excluded.bytes;
END;

CREATE TRIGGER deliveries_stored_insert AFTER INSERT ON webhook_deliveries BEGIN
    INSERT INTO stored (account_id, kind, records, bytes) VALUES (NEW.owner, 'deliveries', 1,
        octet_length(NEW.webhook_id) + octet_length(NEW.event_type) + octet_length(NEW.error) + octet_length(NEW.owner) + 128)
    ON CONFLICT (account_id, kind) DO UPDATE SET records = records + 1, bytes = bytes + excluded.bytes;
END;
CREATE TRIGGER deliveries_stored_delete AFTER DELETE ON webhook_deliveries BEGIN
    UPDATE stored SET records = records - 1, bytes = bytes - (
        octet_length(OLD.webhook_id) + octet_length(OLD.event_type) + octet_length(OLD.error) + octet_length(OLD.owner) + 128)
    WHERE account_id = OLD.owner AND kind = 'deliveries';
END;
