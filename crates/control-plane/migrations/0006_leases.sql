-- Leases: which control plane runs a cluster-wide background task (a periodic
-- sweep, one outbox target's deliveries) until when.
CREATE TABLE leases (
    name        TEXT PRIMARY KEY,
    holder      TEXT NOT NULL,
    expires_at  BIGINT NOT NULL
);
