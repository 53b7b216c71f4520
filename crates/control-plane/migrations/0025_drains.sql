-- Each node's latest drain (POST /v2/nodes/{id}/drain), so that every
-- control plane of a cluster shows it and one takes it over when the one
-- running it stops: its report (JSON, as the runner keeps it), whether it
-- lasts until the node's agent restarts, whether it finished (0 or 1), and
-- when it started (milliseconds; which drain a runner's writes belong to).
-- Who runs it is the holder of the lease 'drain:<node_id>': a report is
-- written only under that lease.
CREATE TABLE drains (
    node_id        TEXT PRIMARY KEY,
    report         TEXT NOT NULL,
    until_restart  INTEGER NOT NULL,
    finished       INTEGER NOT NULL DEFAULT 0,
    started_at     BIGINT NOT NULL
);
