//! The browser engine: everything that is Chromium's. How it is launched and
//! with which flags ([`browser`]), the preferences its profile starts with
//! ([`prefs`]), the DevTools client the agent drives it with ([`cdp`]), warm
//! browsers and launches ([`launcher`]), screenshots ([`capture`]),
//! extensions ([`extension`]), and the state a park reads from it and a
//! revive puts back ([`state`]).

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
