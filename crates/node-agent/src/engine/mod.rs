//! The browser engine: everything that is Chromium's. How it is launched and
//! with which flags ([`browser`]), the preferences its profile starts with
//! ([`prefs`]), the DevTools client the agent drives it with ([`cdp`]), warm
//! browsers and launches ([`launcher`]), screenshots ([`capture`]),
//! extensions ([`extension`]), and the state a park reads from it and a
//! revive puts back ([`state`]); the page layer every caller drives pages
//! through ([`page`]), the live view's frames and input ([`screencast`],
//! [`input`]), REST actions' request interception ([`intercept`]), and
//! chromedriver, its WebDriver server ([`chromedriver`]).
//!
//! This folder is where a second engine goes (Firefox, issue 47): what the
//! rest of the agent asks of an engine is what these modules answer —
//! launch and readiness, profile preferences, the page layer (tabs,
//! navigate and wait, evaluate, input, screenshots), state capture and
//! restore, frames for the live view, request interception, its WebDriver
//! server, and which client protocols its doors relay (CDP and Playwright
//! for Chromium; WebDriver BiDi for Firefox). The seam is made a trait when
//! the second engine comes, so that both implementations are tested by the
//! same suites.

pub mod browser;
pub mod capture;
pub mod cdp;
pub mod chromedriver;
pub mod extension;
pub mod input;
pub mod intercept;
pub mod launcher;
pub mod page;
pub mod prefs;
pub mod screencast;
pub mod state;
