-- The agent↔control plane protocol version a node's agent speaks
-- (`major.minor`; '' for agents from before the field, which speak 1.0).
ALTER TABLE nodes ADD COLUMN protocol_version TEXT NOT NULL DEFAULT '';
