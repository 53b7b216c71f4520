//! Tests of the `flotilla` binary itself (its commands, processes killed and
//! restarted, clusters of processes): one binary, a module per area.

mod browser_restart;
mod client_commands;
mod cluster;
mod crash_rounds;
mod proxy_command;
mod proxy_peers;
mod readme;
mod replicas;
mod slow_clients;
