//! The node agent: runs browser instances on one machine and reports them to the
//! control plane. Its folders, from the bottom up: a folder imports only
//! from those below it and from [`config`] (which imports only `confine`'s
//! egress settings); no two folders import each other:
//!
//! - [`system`] — the machine: processes, cgroups, `/proc` sampling, the
//!   instance's folders and how the agent writes in those the browser owns.
//! - [`confine`] — how a browser is confined: its sandbox (user,
//!   filesystem), its own network namespace behind the egress proxy.
//! - [`snapshot`] — dormancy snapshots: archives and the store that keeps them.
//! - [`engine`] — the browser engine: the seam the agent launches and
//!   captures through ([`engine::Engine`]: Chromium, and the sim), and
//!   Chromium's launch and flags, profile preferences, the DevTools client,
//!   warm browsers, screenshots, extensions, the state a park captures and a
//!   revive restores.
//! - [`instance`] — one instance: its runner (the one task that owns its
//!   state and browser), its handle, and its lifecycle table.
//! - [`protocols`] — the servers on an instance's ports and what its
//!   clients speak: the CDP gateway, WebDriver, Playwright, MCP's page steps,
//!   REST actions, the live view and its recordings, who may use them.
//! - [`agent`] — the [`Agent`] (create, delete, park, revive, report, drain,
//!   shutdown), its API for the control plane and its link to it.

pub mod agent;
pub mod config;
pub mod confine;
pub mod engine;
pub mod instance;
pub mod protocols;
pub mod snapshot;
pub mod system;

pub use agent::link::{ControlPlaneLink, HttpLink, LinkError};
pub use agent::{Agent, AgentError, AgentSettings};
pub use config::{AgentConfig, RuntimeKind};
pub use flotilla_api_types::agent::RegistrationAck;
