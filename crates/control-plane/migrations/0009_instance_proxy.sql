-- config.proxy: the instance's upstream proxy (JSON: server, username,
-- password, bypass), or NULL.
ALTER TABLE instances ADD COLUMN proxy TEXT;
