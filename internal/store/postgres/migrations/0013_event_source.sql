-- Who recorded an event (internal/events Source*): the host, the egress
-- gateway, the agent, or the code in the sandbox, whose reports are its
-- word. Events kept before have none.
ALTER TABLE events ADD COLUMN source text NOT NULL DEFAULT '';
