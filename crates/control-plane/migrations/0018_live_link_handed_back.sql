-- A control link's person pressed "Done, hand back" (POST /live/{token}/done):
-- when, or NULL. An agent waiting on the handoff (MCP browser_handoff) reads it.
ALTER TABLE live_links ADD COLUMN handed_back_at BIGINT;
