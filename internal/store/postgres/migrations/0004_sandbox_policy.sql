-- A sandbox's security policy (internal/policy JSON), null when none was given.
ALTER TABLE sandboxes ADD COLUMN policy text NOT NULL DEFAULT 'null';
