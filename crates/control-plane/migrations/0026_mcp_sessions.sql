-- MCP sessions (`/mcp`), so that any control plane of a cluster serves a
-- session's next request and ends it: the client's `initialize` parameters
-- (JSON, to replay the handshake on another replica; NULL if they could not
-- be written), the key that opened it and its tenant (NULL until recorded:
-- nobody may use it), its current instance and tab, when it was last used
-- (milliseconds), and since when a control plane is ending it (NULL while it
-- lives; an end older than a minute is taken over).
CREATE TABLE mcp_sessions (
    id                 TEXT PRIMARY KEY,
    initialize_params  TEXT,
    principal          TEXT,
    tenant             TEXT,
    current_instance   TEXT,
    current_tab        TEXT,
    last_seen_at       BIGINT NOT NULL,
    ending_since       BIGINT
);
CREATE INDEX mcp_sessions_by_last_seen ON mcp_sessions (last_seen_at);

-- The instances each MCP session created, ended with it (`mcp.on_session_end`).
CREATE TABLE mcp_session_instances (
    session_id   TEXT NOT NULL,
    instance_id  TEXT NOT NULL,
    PRIMARY KEY (session_id, instance_id)
);
CREATE INDEX mcp_session_instances_by_instance ON mcp_session_instances (instance_id);
