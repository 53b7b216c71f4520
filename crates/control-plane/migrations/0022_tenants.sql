-- API keys as tenants: the tenant that made an instance, a profile or an
-- extension (NULL: an admin key, or authentication off). A tenant's key
-- sees only rows of its tenant.
ALTER TABLE instances ADD COLUMN tenant TEXT;
ALTER TABLE profiles ADD COLUMN tenant TEXT;
ALTER TABLE extensions ADD COLUMN tenant TEXT;
-- A tenant's list and its quota's count read by tenant and status.
CREATE INDEX instances_tenant ON instances (tenant, status);
