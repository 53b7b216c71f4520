//! The event proxy's integration tests: one binary, a module per area (real
//! proxies on 127.0.0.1:0, real SSE clients).

mod event_proxy;
