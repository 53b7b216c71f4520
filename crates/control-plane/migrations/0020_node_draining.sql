-- A node being drained (POST /v2/nodes/{id}/drain) takes no new instance
-- until it is uncordoned (0 or 1), or, for a drain until restart, until an
-- agent of another generation than this one registers ('' otherwise).
ALTER TABLE nodes ADD COLUMN draining INTEGER NOT NULL DEFAULT 0;
ALTER TABLE nodes ADD COLUMN drain_ends_with_generation TEXT NOT NULL DEFAULT '';
