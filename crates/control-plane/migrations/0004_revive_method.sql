-- The method of the revive in progress (or last), to learn revive times per method.
ALTER TABLE instances ADD COLUMN revive_method TEXT;
