//! The control plane: the `/v2` REST API of `spec/instance-service-api.md`.
//!
//! - [`app`] — the domain ([`ControlPlane`]): instances, nodes, health,
//!   metrics, alerts, subscriber tokens and the event outbox.
//! - [`http`] — the axum router, thin handlers, OpenAPI and Swagger UI.
//! - [`store`] — instance and node records in SQLite or PostgreSQL.
//! - [`scheduler`] — placement.
//! - [`artifacts`] — what it needs of the store of snapshots, profiles and
//!   extension zips (implemented by `flotilla-server`).
//! - [`nodes`] — connections to node agents.
//! - [`background`] — periodic reconcile tasks (node health, idle sweep,
//!   metrics samples and alerts, event delivery).
//! - [`telemetry`] — the control plane's own measurements for `GET /metrics`.
//! - [`error`] — the one error type and its mapping to HTTP.
//! - [`mcp`] — the MCP server at `/mcp` (tools for AI agents over the fleet).

pub mod app;
pub mod artifacts;
pub mod background;
pub mod config;
pub mod error;
pub mod http;
pub mod mcp;
pub mod nodes;
pub mod scheduler;
pub mod store;
pub mod telemetry;

pub use app::{Clock, ControlPlane, ManualClock, SystemClock};
pub use config::ControlPlaneConfig;
pub use error::Error;
pub use store::Store;
