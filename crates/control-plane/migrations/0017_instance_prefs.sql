-- config.prefs: the Chromium preferences an instance starts with, as JSON,
-- or NULL for none.
ALTER TABLE instances ADD COLUMN prefs TEXT;
