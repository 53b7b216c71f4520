//! The MCP endpoint's entries in the OpenAPI document: each function only
//! carries its `#[utoipa::path]`; `/mcp` is served by `crate::mcp::service`
//! (the Streamable HTTP transport of the MCP specification).

/// MCP messages (JSON-RPC 2.0) from a client: `initialize`, `tools/list`,
/// `tools/call` of the `browser_*` tools, … A session's id comes back in
/// `Mcp-Session-Id` and goes with every later request of the session.
#[utoipa::path(post, path = "/mcp", tag = "mcp",
    request_body(content = Object, content_type = "application/json", description = "A JSON-RPC message or batch"),
    params(("Mcp-Session-Id" = Option<String>, Header, description = "The session, after initialize"),
        ("MCP-Protocol-Version" = Option<String>, Header)),
    responses(
        (status = 200, description = "The answer: JSON, or a text/event-stream of messages ending with it", content_type = "text/event-stream"),
        (status = 202, description = "A notification or response was taken"),
        (status = 400, description = "Not a JSON-RPC message, or a wrong protocol version"),
        (status = 401, description = "No valid API key", body = flotilla_api_types::ErrorResponse),
        (status = 404, description = "The session ended, never was, or is another API key's; initialize again"),
        (status = 406, description = "Accept does not name application/json and text/event-stream"),
        (status = 413, description = "A body over 4 MiB"),
        (status = 429, description = "The key's tenant holds its tenants.max_sessions (a new session only)", body = flotilla_api_types::ErrorResponse),
        (status = 503, description = "mcp.max_sessions sessions are open, or the key's mcp.max_sessions_per_key (a new session only)", body = flotilla_api_types::ErrorResponse),
    ))]
pub fn mcp_post() {}

/// A stream of the server's messages to a session (text/event-stream).
#[utoipa::path(get, path = "/mcp", tag = "mcp",
    params(("Mcp-Session-Id" = String, Header)),
    responses(
        (status = 200, description = "Server-sent events", content_type = "text/event-stream"),
        (status = 400, description = "No Mcp-Session-Id header"),
        (status = 401, description = "No valid API key", body = flotilla_api_types::ErrorResponse),
        (status = 404, description = "No such session"),
        (status = 405, description = "Not offered to a client of the stateless protocol"),
        (status = 406, description = "Accept does not name text/event-stream"),
    ))]
pub fn mcp_stream() {}

/// Ends a session; the instances it created are deleted (or parked, or
/// kept: `[mcp] on_session_end`).
#[utoipa::path(delete, path = "/mcp", tag = "mcp",
    params(("Mcp-Session-Id" = String, Header)),
    responses(
        (status = 202, description = "The session ends"),
        (status = 400, description = "No Mcp-Session-Id header"),
        (status = 401, description = "No valid API key", body = flotilla_api_types::ErrorResponse),
        (status = 404, description = "No such session"),
    ))]
pub fn mcp_end() {}
