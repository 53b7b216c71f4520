-- config.record: whether the instance's live view is recorded to video.
ALTER TABLE instances ADD COLUMN record BIGINT NOT NULL DEFAULT 0;
