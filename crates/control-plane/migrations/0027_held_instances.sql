-- Instances that a control plane's work holds and must end: a
-- `/v2/playwright` connection's (deleted when its client leaves) and a REST
-- action's (deleted when the action ends). The holder (a control plane's
-- name, random per start) renews `expires_at` (milliseconds) while it runs;
-- once it lapses, the holder is taken to have stopped and another control
-- plane deletes the instance.
CREATE TABLE held_instances (
    instance_id  TEXT PRIMARY KEY,
    holder       TEXT NOT NULL,
    work         TEXT NOT NULL,
    expires_at   BIGINT NOT NULL
);
CREATE INDEX held_instances_by_holder ON held_instances (holder);
CREATE INDEX held_instances_by_expiry ON held_instances (expires_at);
