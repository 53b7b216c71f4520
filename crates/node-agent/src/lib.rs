//! The node agent: runs browser instances on one machine and reports them to the
//! control plane.
//!
//! - [`agent`] — the [`Agent`] handle (create, delete, report, shutdown).
//! - [`browser`] — one browser process tree (launch, readiness, stop);
//!   [`profile_prefs`] writes the preferences it starts with, and
//!   [`browser_files`] how the agent writes in folders the browser owns.
//! - [`gateway`], [`live_view`], [`instance_http`]: the servers on an instance's
//!   debug, stream and HTTP ports; [`access`] decides who may use them, and
//!   [`client_frames`] reads what CDP clients send.
//! - [`sandbox`], [`netns`], [`egress`]: how a browser is confined (user,
//!   filesystem, Chromium's sandbox, its own network behind the egress proxy).
//! - [`cdp`] — a small DevTools protocol client for the agent's own needs.
//! - [`actions`] — REST actions' jobs on a page; [`page_ops`] — MCP's steps
//!   on a page (snapshot, references, input, tabs, console).
//! - [`monitor`] — resource sampling from `/proc`.
//! - [`ports`], [`sweep`], [`config`], [`link`].

pub mod access;
pub mod actions;
pub mod agent;
pub mod agent_api;
pub mod browser;
pub mod browser_files;
pub mod capture;
pub mod cdp;
pub mod cgroups;
pub mod client_frames;
pub mod config;
pub mod downloads;
pub mod egress;
pub mod extension;
pub mod gateway;
pub mod instance;
pub mod instance_http;
pub mod instance_state;
pub mod launcher;
pub mod link;
pub mod live_control;
pub mod live_view;
pub mod monitor;
pub mod netns;
pub mod page_ops;
pub mod playwright;
pub mod ports;
pub mod profile_prefs;
pub mod reaper;
pub mod recording;
pub mod sandbox;
pub mod se_files;
pub mod snapshot;
pub mod sweep;
pub mod webdriver;

pub use agent::{Agent, AgentError, AgentSettings};
pub use config::{AgentConfig, RuntimeKind};
pub use flotilla_api_types::agent::RegistrationAck;
pub use link::{ControlPlaneLink, HttpLink, LinkError};
