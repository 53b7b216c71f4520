-- The clients an instance's node serves it now, as of the node's last
-- heartbeat: open DevTools and Playwright connections, REST actions running
-- (what drives the instance, in list and get responses).
ALTER TABLE instances ADD COLUMN cdp_clients BIGINT NOT NULL DEFAULT 0;
ALTER TABLE instances ADD COLUMN playwright_clients BIGINT NOT NULL DEFAULT 0;
ALTER TABLE instances ADD COLUMN actions_running BIGINT NOT NULL DEFAULT 0;
