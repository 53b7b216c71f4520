//! The node agent's integration tests: one binary, a module per area.

mod browser_snapshot_refill;
mod lifecycle;
