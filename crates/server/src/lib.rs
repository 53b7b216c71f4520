//! Assembles Flotilla's processes from configuration: [`serve::Serve`] (control
//! plane + local node agent), and the configuration loader [`config`]. The CLI
//! parses arguments and calls these; the test harness starts the same things
//! in-process.

pub mod config;
pub mod serve;

pub use config::FlotillaConfig;
pub use serve::Serve;
