-- Lifecycle events and their outbox, metric samples, alerts and settings.
-- Portable SQL for SQLite and PostgreSQL (see 0001).

-- Every lifecycle event, in order per subject (an instance, node or alert).
CREATE TABLE events (
    id          TEXT PRIMARY KEY,
    name        TEXT NOT NULL,
    subject     TEXT NOT NULL,
    seq         BIGINT NOT NULL,
    payload     TEXT NOT NULL,
    created_at  BIGINT NOT NULL
);
CREATE UNIQUE INDEX events_by_subject ON events (subject, seq);
CREATE INDEX events_by_time ON events (created_at);

-- The outbox: one row per event and delivery target (a webhook URL or the
-- event proxy) until delivered; written in the transaction of the change.
CREATE TABLE deliveries (
    target           TEXT NOT NULL,
    subject          TEXT NOT NULL,
    seq              BIGINT NOT NULL,
    event_id         TEXT NOT NULL,
    attempts         BIGINT NOT NULL DEFAULT 0,
    next_attempt_at  BIGINT NOT NULL,
    last_error       TEXT,
    created_at       BIGINT NOT NULL,
    PRIMARY KEY (target, subject, seq)
);
CREATE INDEX deliveries_due ON deliveries (target, next_attempt_at);

-- Resource samples per node, and for the cluster (node_id = '').
CREATE TABLE metric_samples (
    node_id         TEXT NOT NULL,
    at              BIGINT NOT NULL,
    cpu_percent     DOUBLE PRECISION NOT NULL,
    memory_percent  DOUBLE PRECISION NOT NULL,
    disk_percent    DOUBLE PRECISION NOT NULL,
    instances       BIGINT NOT NULL,
    PRIMARY KEY (node_id, at)
);

-- Alerts: one row per raise; cleared_at is set when the condition ends.
CREATE TABLE alerts (
    id          TEXT PRIMARY KEY,
    scope       TEXT NOT NULL,
    metric      TEXT NOT NULL,
    level       TEXT NOT NULL,
    value       DOUBLE PRECISION NOT NULL,
    threshold   DOUBLE PRECISION NOT NULL,
    message     TEXT NOT NULL,
    raised_at   BIGINT NOT NULL,
    cleared_at  BIGINT
);
CREATE INDEX alerts_active ON alerts (scope, metric, cleared_at);

-- Values the control planes of one cluster share (the subscriber-token key).
CREATE TABLE settings (
    name   TEXT PRIMARY KEY,
    value  TEXT NOT NULL
);
