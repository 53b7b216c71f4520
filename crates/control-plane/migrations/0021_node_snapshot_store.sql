-- Which snapshot store a node's agent uses (`file://<host>/<path>` or
-- `s3://<bucket>/<prefix>[@<endpoint>]`; '' for agents from before the
-- field): an instance parked on one node revives on another only when both
-- use the same store.
ALTER TABLE nodes ADD COLUMN snapshot_store TEXT NOT NULL DEFAULT '';
