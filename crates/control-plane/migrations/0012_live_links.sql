-- Shareable live links (POST /v2/instances/{id}/live): the URL carries the
-- link id and a signature; this row says what it opens and until when.
CREATE TABLE live_links (
    id           TEXT PRIMARY KEY,
    instance_id  TEXT NOT NULL,
    mode         TEXT NOT NULL,
    created_at   BIGINT NOT NULL,
    expires_at   BIGINT NOT NULL,
    revoked_at   BIGINT
);
CREATE INDEX live_links_instance ON live_links (instance_id);
