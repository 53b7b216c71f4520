//! Tests of Flotilla's processes as `flotilla-server` assembles them
//! (`Serve` in-process, with real Chromium or the sim runtime): one binary,
//! a module per area.

mod api_contract;
mod browser_actions;
mod browser_dashboard;
mod browser_dormancy;
mod browser_files;
mod browser_firefox;
mod browser_front_door;
mod browser_lifecycle;
mod browser_live_control;
mod browser_mcp;
mod browser_playwright;
mod browser_recordings;
mod browser_runtime;
mod browser_security;
mod browser_sessions;
mod browser_webdriver;
mod deploy_manifests;
mod operations;
mod tenants;
