-- The operation the control plane last asked the instance's node to carry
-- out (a create or a revive): a node's report of an operation's outcome is
-- applied only when it is this one.
ALTER TABLE instances ADD COLUMN operation_id TEXT;
