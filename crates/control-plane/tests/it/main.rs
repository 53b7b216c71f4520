//! The control plane's integration tests: one binary, a module per area.

mod nodes_and_health;
mod store_backends;
