-- Uploaded browser extensions: their zips live in the snapshot store
-- (extensions/<id>.zip); name and version come from the manifest.
CREATE TABLE extensions (
    id          TEXT PRIMARY KEY,
    name        TEXT NOT NULL,
    version     TEXT NOT NULL,
    size_bytes  BIGINT NOT NULL,
    created_at  BIGINT NOT NULL
);
-- config.extensions: a JSON array of extension ids, or NULL for none.
ALTER TABLE instances ADD COLUMN extensions TEXT;
