//! Wire types of every Flotilla API, shared by the control plane, the node agent,
//! the CLI and the tests.
//!
//! - [`ids`] — typed identifiers (`InstanceId`, `NodeId`).
//! - [`instances`], [`nodes`], [`health`]: the public `/v2` REST API of
//!   `spec/instance-service-api.md`, with `utoipa` schemas for the OpenAPI document.
//! - [`agent`] — the internal API between the control plane and node agents.
//! - [`actions`] — REST actions' bodies and checks; [`page`] — MCP's page
//!   steps as the control plane asks them of a node.
//! - [`error`] — the `{detail, code}` error body and its codes.
//! - [`prometheus`] — the metrics text format both services expose.
//! - [`events`] — lifecycle event names and payloads (webhooks, event proxy).
//! - [`credentials`] — bearer parsing, digests and constant-time comparison.
//! - [`origin`] — whether a browser's WebSocket comes from the same origin.
//! - [`profiles`], [`extensions`] — saved browser profiles and uploaded extensions.
//! - [`prefs`] — the Chromium preferences an instance starts with.
//! - [`live`] — shareable live links to an instance's live view.
//! - [`names`] — the error of a name none of a closed set's.
//! - [`tasks`] — running an operation to its end whatever its caller does.
//! - [`faults`] — fault points of the crash tests (test builds only).
//! - [`webdriver_path`] — a WebDriver command's path, checked the same way on
//!   every door.
//!
//! Request types reject unknown fields; validation of values (ranges, catalogs)
//! belongs to the service that owns the rule, not to these types.

pub mod actions;
pub mod agent;
pub mod alerts;
pub mod clock;
pub mod credentials;
pub mod error;
pub mod events;
pub mod extensions;
pub mod faults;
pub mod firefox_prefs;
pub mod health;
pub mod ids;
pub mod instances;
pub mod integers;
pub mod live;
pub mod metrics;
pub mod names;
pub mod nodes;
pub mod origin;
pub mod page;
pub mod playwright;
pub mod prefs;
pub mod profiles;
pub mod prometheus;
pub mod runs;
pub mod tasks;
pub mod token_bucket;
pub mod tokens;
pub mod webdriver_path;

pub use error::{ErrorCode, ErrorResponse, MessageResponse};
pub use ids::{InstanceId, NodeId};
