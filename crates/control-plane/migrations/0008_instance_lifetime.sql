-- config.max_duration_minutes: the instance is deleted this long after its
-- creation, whatever its activity (NULL: no limit).
ALTER TABLE instances ADD COLUMN max_duration_minutes DOUBLE PRECISION;
