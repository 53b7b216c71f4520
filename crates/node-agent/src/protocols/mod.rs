//! What an instance's clients speak, and the servers on its ports: the CDP
//! gateway on its debug port ([`gateway`]), whose client frames are read by
//! [`client_frames`]; its HTTP port ([`instance_http`]) with WebDriver
//! ([`webdriver`], Grid's files in [`se_files`]), Playwright ([`playwright`]),
//! tabs and screenshots; MCP's page steps ([`page_steps`], once for
//! both engines, whose moves are in [`page_ops`] and in Firefox
//! [`firefox_page_ops`]) and REST actions
//! ([`actions`], in Firefox [`firefox_actions`]); the live view on its stream port ([`live_view`], input in
//! [`live_control`]) and its recordings ([`recording`]). [`access`] decides
//! who may use them.

pub mod access;
pub mod actions;
pub mod client_frames;
pub mod firefox_actions;
pub mod firefox_page_ops;
pub mod gateway;
pub mod instance_http;
pub mod live_control;
pub mod live_view;
pub mod page_ops;
pub mod page_steps;
pub mod playwright;
pub mod recording;
pub mod se_files;
pub mod webdriver;
