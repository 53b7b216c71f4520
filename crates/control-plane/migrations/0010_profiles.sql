-- Persistent profiles: their saved state lives in the snapshot store
-- (profiles/<name>.tar.zst); `holder` is the instance that writes it back
-- (persist), at most one.
CREATE TABLE profiles (
    name        TEXT PRIMARY KEY,
    created_at  BIGINT NOT NULL,
    updated_at  BIGINT NOT NULL,
    size_bytes  BIGINT NOT NULL DEFAULT 0,
    holder      TEXT
);
ALTER TABLE instances ADD COLUMN profile_name TEXT;
ALTER TABLE instances ADD COLUMN profile_persist INTEGER NOT NULL DEFAULT 0;
