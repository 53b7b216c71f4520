//! The node agent: runs browser instances on one machine and reports them to the
//! control plane.
//!
//! - [`agent`] — the [`Agent`] handle (create, delete, report, shutdown).
//! - [`browser`] — one browser process tree (launch, readiness, stop).
//! - [`gateway`], [`live_view`], [`instance_http`]: the servers on an instance's
//!   debug, stream and HTTP ports.
//! - [`cdp`] — a small DevTools protocol client for the agent's own needs.
//! - [`monitor`] — resource sampling from `/proc`.
//! - [`ports`], [`sweep`], [`config`], [`link`].

pub mod agent;
pub mod agent_api;
pub mod browser;
pub mod cdp;
pub mod cgroups;
pub mod config;
pub mod gateway;
pub mod instance;
pub mod instance_http;
pub mod launcher;
pub mod link;
pub mod live_view;
pub mod monitor;
pub mod ports;
pub mod snapshot;
pub mod sweep;

pub use agent::{Agent, AgentError, AgentSettings};
pub use config::{AgentConfig, RuntimeKind};
pub use link::{ControlPlaneLink, HttpLink, LinkError, RegistrationAck};
