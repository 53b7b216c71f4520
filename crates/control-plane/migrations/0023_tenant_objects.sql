-- API keys as tenants, second part: the tenant of an instance's event (its
-- instance's, written with it, so that the event proxy publishes it on the
-- tenant's topic after the instance is gone), and the tenant of an
-- instance's kept recordings (written with the instance; the recordings
-- themselves live in the snapshot store).
ALTER TABLE events ADD COLUMN tenant TEXT;
CREATE TABLE kept_recording_owners (
    instance_id TEXT PRIMARY KEY,
    tenant      TEXT NOT NULL
);
CREATE INDEX profiles_tenant ON profiles (tenant);
CREATE INDEX extensions_tenant ON extensions (tenant);
