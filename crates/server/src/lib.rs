//! Assembles Flotilla's processes from configuration: [`serve::Serve`] (control
//! plane + local node agent + event proxy), [`control::Control`] (control plane
//! alone), [`agent::AgentNode`] (node agent alone), and the configuration
//! loader [`config`], and the in-process pairing of control plane and agent
//! ([`local`]), and the owner-only file policy ([`files`]). The CLI
//! parses arguments and calls these; the test harness starts the same things
//! in-process.

pub mod agent;
pub mod config;
pub mod control;
pub mod files;
pub mod local;
pub mod serve;

pub use agent::AgentNode;
pub use config::FlotillaConfig;
pub use control::Control;
pub use serve::Serve;
