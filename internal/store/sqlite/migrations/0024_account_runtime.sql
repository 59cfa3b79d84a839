-- An account's default runtime (runc, gvisor; '' the server's), which an
-- operator may lock: its sandboxes then run under it alone
-- (store.Account.Runtime, RuntimeLocked).
ALTER TABLE accounts ADD COLUMN runtime TEXT NOT NULL DEFAULT '';
ALTER TABLE accounts ADD COLUMN runtime_locked INTEGER NOT NULL DEFAULT 0;
