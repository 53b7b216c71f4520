-- Instances and nodes. Portable SQL for SQLite and PostgreSQL: times are Unix
-- milliseconds (BIGINT), booleans 0/1 (BIGINT), lists JSON text.

CREATE TABLE nodes (
    id              TEXT PRIMARY KEY,
    address         TEXT NOT NULL,
    public_host     TEXT NOT NULL,
    status          TEXT NOT NULL,
    max_instances   BIGINT NOT NULL,
    cpu_cores       BIGINT NOT NULL,
    memory_gb       DOUBLE PRECISION NOT NULL,
    disk_gb         DOUBLE PRECISION NOT NULL,
    images          TEXT NOT NULL,
    cpu_percent     DOUBLE PRECISION NOT NULL DEFAULT 0,
    memory_percent  DOUBLE PRECISION NOT NULL DEFAULT 0,
    disk_percent    DOUBLE PRECISION NOT NULL DEFAULT 0,
    last_heartbeat  BIGINT NOT NULL,
    registered_at   BIGINT NOT NULL
);

CREATE TABLE instances (
    id                    TEXT PRIMARY KEY,
    node_id               TEXT NOT NULL,
    status                TEXT NOT NULL,
    status_reason         TEXT,
    subdomain             TEXT NOT NULL UNIQUE,
    image                 TEXT NOT NULL,
    memory_gb             DOUBLE PRECISION NOT NULL,
    cpu_cores             BIGINT NOT NULL,
    disk_gb               DOUBLE PRECISION NOT NULL,
    idle_timeout_minutes  BIGINT NOT NULL,
    auto_snapshot         BIGINT NOT NULL,
    debug_port            BIGINT,
    stream_port           BIGINT,
    http_port             BIGINT,
    created_at            BIGINT NOT NULL,
    updated_at            BIGINT NOT NULL,
    last_activity         BIGINT NOT NULL,
    cpu_percent           DOUBLE PRECISION NOT NULL DEFAULT 0,
    memory_mb             DOUBLE PRECISION NOT NULL DEFAULT 0,
    disk_mb               DOUBLE PRECISION NOT NULL DEFAULT 0,
    snapshot_id           TEXT,
    dormant_since         BIGINT
);

CREATE INDEX instances_by_created ON instances (created_at, id);
CREATE INDEX instances_by_status ON instances (status, created_at);
CREATE INDEX instances_by_node ON instances (node_id, status);
