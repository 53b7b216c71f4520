-- A node being drained (POST /v2/nodes/{id}/drain) takes no new instance
-- until it is uncordoned; 0 or 1.
ALTER TABLE nodes ADD COLUMN draining INTEGER NOT NULL DEFAULT 0;
