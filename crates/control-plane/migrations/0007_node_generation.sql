-- The process generation of the agent a node record belongs to: a second
-- agent that registers with the same node id while the first still answers is
-- refused instead of being taken for a restart.
ALTER TABLE nodes ADD COLUMN generation TEXT NOT NULL DEFAULT '';
