-- The engine whose browser last saved a profile (`chromium`, `firefox`):
-- a profile is per engine, and an instance of another engine's image may
-- not start from it. NULL before its first save (any engine may).
ALTER TABLE profiles ADD COLUMN engine TEXT;
