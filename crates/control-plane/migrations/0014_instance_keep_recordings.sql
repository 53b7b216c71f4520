-- config.keep_recordings: whether the instance's recordings outlive it.
ALTER TABLE instances ADD COLUMN keep_recordings BIGINT NOT NULL DEFAULT 0;
