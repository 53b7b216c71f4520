//! The machine the agent runs on: cgroups ([`cgroups`]), resource sampling
//! from `/proc` ([`monitor`]), the agent as its browsers' subreaper
//! ([`reaper`]), files an instance downloaded ([`downloads`]), and how the
//! agent writes in folders the browser owns ([`files`]).

pub mod cgroups;
pub mod dirs;
pub mod downloads;
pub mod files;
pub mod monitor;
pub mod process;
pub mod reaper;
