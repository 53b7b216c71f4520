//! The MCP server at `/mcp` (Streamable HTTP, served by the official Rust
//! SDK `rmcp`): tools that let an AI agent do a whole browser task without
//! any other API. Lifecycle tools call the control plane's domain directly;
//! page tools become steps on the instance's node
//! (`flotilla_api_types::page`), which reads the page as an accessibility
//! snapshot whose references the action tools take.
//!
//! A session (protocol versions with `initialize`, up to 2025-11-25)
//! remembers its current instance and tab, so tools may leave
//! `instance_id` out, and ends the instances it created when it ends
//! (`[mcp] on_session_end`: delete, park or keep). Clients of the stateless
//! protocol name the instance on every call, and close what they create.
//!
//! Failures of a tool, bad arguments included, are tool errors (`isError`)
//! with a message an agent can act on; only an unknown tool is a protocol
//! error.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{
    CallToolResult, ContentBlock, Implementation, InitializeRequestParams, InitializeResult,
    ServerCapabilities, ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler, schemars, tool, tool_handler, tool_router};
use serde::Deserialize;

use flotilla_api_types::InstanceId;
use flotilla_api_types::instances::{
    CreateInstanceRequest, InstanceConfig, ListInstancesQuery, ReviveMethod, UpstreamProxy,
};
use flotilla_api_types::live::{CreateLiveLinkRequest, LiveMode};
use flotilla_api_types::page::{AgentPageRequest, PageOp};
use flotilla_api_types::profiles::ProfileUse;

use crate::app::keys::Principal;
use crate::app::mcp_sessions::StoredSessions;
use crate::app::{ControlPlane, Scope};
use crate::error::Error;

use rmcp::transport::streamable_http_server::SessionManager as _;
use rmcp::transport::streamable_http_server::session::SessionId;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};

/// The `/mcp` endpoint for the router: rmcp's service, its sessions in the
/// store, behind a cap on sessions (`mcp.max_sessions`; a new one past it
/// is 503).
pub fn router(control_plane: Arc<ControlPlane>) -> axum::Router<Arc<ControlPlane>> {
    let settings = &control_plane.config.mcp;
    let mut manager = LocalSessionManager::default();
    // A session lives while its agent works, or a person drives its browser
    // through a handoff link; an idle one ends (and its instances with it:
    // the "mcp session expiry" sweep, which sees the requests every replica
    // served). This replica forgets its copy then too.
    manager.session_config.keep_alive = Some(std::time::Duration::from_secs(
        settings.session_idle_timeout_sec,
    ));
    // Answers kept for a client that resumes a stream (screenshots too).
    manager.session_config.completed_cache_ttl = std::time::Duration::from_secs(10);
    let manager = Arc::new(manager);
    // The guard in front checks the API key; hosts are whatever the
    // operator serves the control plane as.
    // Every session's `initialize` in the store, so that any replica
    // restores a session another opened.
    let mut config = StreamableHttpServerConfig::default().disable_allowed_hosts();
    config.session_store = Some(Arc::new(StoredSessions(control_plane.clone())));
    let service = {
        let control_plane = control_plane.clone();
        StreamableHttpService::new(
            move || Ok(McpSession::new(control_plane.clone())),
            manager.clone(),
            config,
        )
    };
    axum::Router::new()
        .route_service("/mcp", service)
        .layer(axum::middleware::from_fn(
            move |request: axum::extract::Request, next: axum::middleware::Next| {
                let (manager, control_plane) = (manager.clone(), control_plane.clone());
                async move { admit(request, next, (&manager, &control_plane)).await }
            },
        ))
}

/// The `/mcp` middleware: a session is its opener's (another key's request
/// about it is a 404, as for a session that never was), and a new one is
/// refused past `mcp.max_sessions` or the key's `mcp.max_sessions_per_key`
/// (fleet-wide, through the store).
async fn admit(
    request: axum::extract::Request,
    next: axum::middleware::Next,
    (manager, control_plane): (&LocalSessionManager, &ControlPlane),
) -> axum::response::Response {
    use axum::response::IntoResponse as _;
    let scope = request
        .extensions()
        .get::<Scope>()
        .cloned()
        .unwrap_or(Scope::Admin);
    let principal = request
        .extensions()
        .get::<Principal>()
        .cloned()
        .unwrap_or_else(|| Principal("anonymous".into()));
    let session = request
        .headers()
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    if let Some(id) = &session
        && let Err(refusal) = control_plane.mcp_session_use(id, &principal).await
    {
        forget_if_ended(manager, control_plane, id).await;
        return refusal.into_response();
    }
    // Any request without a session may open one (whatever protocol
    // version it names, an `initialize` does): the caps apply to each, and
    // a session it opened is its key's.
    let opens_a_session = request.method() == axum::http::Method::POST && session.is_none();
    if opens_a_session {
        let may = match local_room(manager, control_plane).await {
            Ok(()) => control_plane.mcp_session_may_open(&principal, &scope).await,
            refused => refused,
        };
        if let Err(refusal) = may {
            return refusal.into_response();
        }
    }
    let response = next.run(request).await;
    if opens_a_session
        && let Some(id) = response
            .headers()
            .get("mcp-session-id")
            .and_then(|v| v.to_str().ok())
        && let Err(error) = control_plane
            .mcp_session_opened(id, &principal, scope.tenant())
            .await
    {
        // Nobody may use it: it goes at once.
        let id = id.to_owned();
        let _ = manager.close_session(&SessionId::from(id.as_str())).await;
        let _ = control_plane.mcp_session_end(&id).await;
        return error.into_response();
    }
    response
}

/// Forgets this replica's copy of session `id` when the session ended (on
/// another replica, or by the idle sweep): the client's request about it
/// is refused anyway.
async fn forget_if_ended(manager: &LocalSessionManager, control_plane: &ControlPlane, id: &str) {
    let ids = [id.to_owned()];
    if let Ok(live) = control_plane.mcp_sessions_live_among(&ids).await
        && live.is_empty()
    {
        let _ = manager.close_session(&SessionId::from(id)).await;
    }
}

/// Whether this replica may hold one more session: fewer than
/// `mcp.max_sessions` in its memory, once the copies of sessions that ended
/// elsewhere are forgotten.
async fn local_room(
    manager: &LocalSessionManager,
    control_plane: &ControlPlane,
) -> Result<(), Error> {
    let max = control_plane.config.mcp.max_sessions;
    let held: Vec<String> = manager
        .sessions
        .read()
        .await
        .keys()
        .map(|id| id.to_string())
        .collect();
    if held.len() < max {
        return Ok(());
    }
    let live = control_plane.mcp_sessions_live_among(&held).await?;
    for ended in held.iter().filter(|id| !live.contains(*id)) {
        let _ = manager
            .close_session(&SessionId::from(ended.as_str()))
            .await;
    }
    if live.len() >= max {
        return Err(Error::InsufficientCapacity(format!(
            "{max} MCP sessions are open, the most the fleet holds (mcp.max_sessions): end one, or retry later"
        )));
    }
    Ok(())
}

/// A page tool's refusal when it names no instance and there is no current one.
const NO_INSTANCE: &str =
    "no instance: create one with browser_create, or give instance_id (browser_list lists them)";

/// One MCP session's state and tools.
pub struct McpSession {
    control_plane: Arc<ControlPlane>,
    /// The instance and tab tools act on when they name none, for one
    /// request of the stateless protocol (a session keeps them in the store).
    current: Mutex<Current>,
    /// Whether this is a session (it began with `initialize`), not one
    /// request of the stateless protocol.
    in_session: AtomicBool,
    /// What the key of the call being served sees (`call_tool` sets it).
    scope: Mutex<Option<Scope>>,
    /// The session of the call being served (`call_tool` sets it).
    session_id: Mutex<Option<String>>,
}

#[derive(Default, Clone)]
struct Current {
    instance: Option<InstanceId>,
    tab: Option<String>,
}

/// A tool error an agent reads.
fn failed(message: impl Into<String>) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(message.into())])
}

fn done(text: impl Into<String>) -> CallToolResult {
    CallToolResult::success(vec![ContentBlock::text(text.into())])
}

fn failed_with(error: Error) -> CallToolResult {
    match error {
        Error::Internal(cause) => {
            tracing::error!(error = format!("{cause:#}"), "an MCP tool failed");
            failed("internal error; the cause is in the control plane's log")
        }
        other => failed(other.to_string()),
    }
}

#[derive(Debug, Deserialize, schemars::JsonSchema, Default)]
pub struct InstanceParam {
    /// The instance; the session's current one when left out.
    #[serde(default)]
    pub instance_id: Option<String>,
}

#[derive(Deserialize, schemars::JsonSchema, Default)]
pub struct CreateParams {
    /// Image from the nodes' catalogs (default `ubuntu:22.04`, the system
    /// Chromium; `chromium-headless-shell` for a lighter one; `firefox`
    /// for Firefox, where every tool but browser_console_messages works).
    #[serde(default)]
    pub image: Option<String>,
    /// Start from this saved profile.
    #[serde(default)]
    pub profile: Option<String>,
    /// Write the profile back when the instance ends.
    #[serde(default)]
    pub persist_profile: bool,
    /// An upstream proxy: `http://host:port` or `socks5://host:port`.
    #[serde(default)]
    pub proxy: Option<String>,
    #[serde(default)]
    pub proxy_username: Option<String>,
    #[serde(default)]
    pub proxy_password: Option<String>,
    /// Ids of uploaded extensions to load.
    #[serde(default)]
    pub extensions: Vec<String>,
    /// Record the session's video.
    #[serde(default)]
    pub record: bool,
    /// Open this URL once the browser is ready.
    #[serde(default)]
    pub url: Option<String>,
}

/// Everything but the proxy's password (rmcp logs requests at debug level).
impl std::fmt::Debug for CreateParams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CreateParams")
            .field("image", &self.image)
            .field("profile", &self.profile)
            .field("proxy", &self.proxy)
            .field("url", &self.url)
            .finish_non_exhaustive()
    }
}

#[derive(Debug, Deserialize, schemars::JsonSchema, Default)]
pub struct ReviveParams {
    #[serde(default)]
    pub instance_id: Option<String>,
    /// Reopen every tab (default true), or only restore cookies and storage.
    #[serde(default)]
    pub restore_tabs: Option<bool>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema, Default)]
pub struct NavigateParams {
    #[serde(default)]
    pub instance_id: Option<String>,
    /// An http or https URL.
    pub url: String,
}

#[derive(Debug, Deserialize, schemars::JsonSchema, Default)]
pub struct ElementParams {
    #[serde(default)]
    pub instance_id: Option<String>,
    /// What the element is, in words (for the record).
    #[serde(default)]
    pub element: Option<String>,
    /// The element's reference from the latest snapshot (`e42`).
    #[serde(rename = "ref")]
    pub reference: String,
    /// Click twice.
    #[serde(default)]
    pub double_click: bool,
}

#[derive(Debug, Deserialize, schemars::JsonSchema, Default)]
pub struct DragParams {
    #[serde(default)]
    pub instance_id: Option<String>,
    /// Reference of the element to drag.
    pub start_ref: String,
    /// Reference of the element to drop onto.
    pub end_ref: String,
}

#[derive(Debug, Deserialize, schemars::JsonSchema, Default)]
pub struct TypeParams {
    #[serde(default)]
    pub instance_id: Option<String>,
    #[serde(default)]
    pub element: Option<String>,
    /// Reference of the field (`e42`).
    #[serde(rename = "ref")]
    pub reference: String,
    /// Text to type; replaces what the field holds.
    pub text: String,
    /// Press Enter afterwards.
    #[serde(default)]
    pub submit: bool,
}

#[derive(Debug, Deserialize, schemars::JsonSchema, Default)]
pub struct KeyParams {
    #[serde(default)]
    pub instance_id: Option<String>,
    /// `Enter`, `Tab`, `Escape`, `Backspace`, `ArrowDown`, … or one character.
    pub key: String,
}

#[derive(Debug, Deserialize, schemars::JsonSchema, Default)]
pub struct SelectParams {
    #[serde(default)]
    pub instance_id: Option<String>,
    #[serde(default)]
    pub element: Option<String>,
    /// Reference of the select (`e42`).
    #[serde(rename = "ref")]
    pub reference: String,
    /// Values or labels of the options to select.
    pub values: Vec<String>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema, Default)]
pub struct WaitParams {
    #[serde(default)]
    pub instance_id: Option<String>,
    /// Wait until this text is on the page.
    #[serde(default)]
    pub text: Option<String>,
    /// Wait until this text is no longer on the page.
    #[serde(default)]
    pub text_gone: Option<String>,
    /// Wait this many seconds (at most 60).
    #[serde(default)]
    pub time: Option<f64>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema, Default)]
pub struct EvaluateParams {
    #[serde(default)]
    pub instance_id: Option<String>,
    /// A JavaScript expression (a promise is awaited); its value as JSON.
    pub expression: String,
}

#[derive(Debug, Deserialize, schemars::JsonSchema, Default)]
pub struct TabsParams {
    #[serde(default)]
    pub instance_id: Option<String>,
    /// `list`, `new`, `select` or `close`.
    pub action: String,
    /// The tab for `select` and `close` (its id from `list`).
    #[serde(default)]
    pub tab: Option<String>,
    /// The URL for `new`.
    #[serde(default)]
    pub url: Option<String>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema, Default)]
pub struct UploadParams {
    #[serde(default)]
    pub instance_id: Option<String>,
    /// Reference of the file input (`e42`).
    #[serde(rename = "ref")]
    pub reference: String,
    /// The files: a plain name and the bytes in base64 each.
    pub files: Vec<UploadFileParam>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema, Default)]
pub struct UploadFileParam {
    pub name: String,
    pub content_base64: String,
}

#[derive(Debug, Deserialize, schemars::JsonSchema, Default)]
pub struct HandoffParams {
    #[serde(default)]
    pub instance_id: Option<String>,
    /// How long the link works, in seconds (default 1800).
    #[serde(default)]
    pub ttl_sec: Option<u64>,
    /// Instead of making a link: wait until the person of this link (its
    /// id, from an earlier browser_handoff) hands the browser back.
    #[serde(default)]
    pub wait_for_link: Option<String>,
    /// How long to wait, in seconds (default 300, at most 3600).
    #[serde(default)]
    pub timeout_sec: Option<u64>,
}

impl McpSession {
    fn new(control_plane: Arc<ControlPlane>) -> Self {
        Self {
            control_plane,
            current: Mutex::default(),
            in_session: AtomicBool::new(false),
            scope: Mutex::default(),
            session_id: Mutex::default(),
        }
    }

    /// The instance a tool acts on: the one named, else the current one;
    /// one the session's key does not see (another tenant's) is not found.
    async fn instance(&self, named: &Option<String>) -> Result<InstanceId, CallToolResult> {
        Ok(self.instance_and_tab(named).await?.0)
    }

    /// [`Self::instance`], and the session's current tab when that
    /// instance is its current one (one reading of the session).
    async fn instance_and_tab(
        &self,
        named: &Option<String>,
    ) -> Result<(InstanceId, Option<String>), CallToolResult> {
        let current = self.current().await?;
        let id = match named.as_deref().filter(|id| !id.is_empty()) {
            Some(id) => InstanceId::new(id),
            None => current
                .instance
                .clone()
                .ok_or_else(|| failed(NO_INSTANCE))?,
        };
        self.control_plane
            .instance_in_scope(&id, &self.scope()?)
            .await
            .map_err(failed_with)?;
        let tab = (current.instance.as_ref() == Some(&id))
            .then_some(current.tab)
            .flatten();
        Ok((id, tab))
    }

    /// What the session's key sees (set from each request, all of one
    /// key: `admit` lets only the opener's key use a session); a call that
    /// came without one is refused.
    fn scope(&self) -> Result<Scope, CallToolResult> {
        self.scope
            .lock()
            .expect("mcp lock")
            .clone()
            .ok_or_else(|| failed("this call carried no credential"))
    }

    /// The session of the call being served; `None` for a request of the
    /// stateless protocol.
    fn session_id(&self) -> Option<String> {
        if !self.in_session.load(Ordering::Acquire) {
            return None;
        }
        self.session_id.lock().expect("mcp lock").clone()
    }

    /// The current instance and tab: the session's, as stored.
    async fn current(&self) -> Result<Current, CallToolResult> {
        let Some(session) = self.session_id() else {
            return Ok(self.current.lock().expect("mcp lock").clone());
        };
        let stored = self
            .control_plane
            .mcp_session_state(&session)
            .await
            .map_err(failed_with)?;
        Ok(Current {
            instance: stored.current_instance,
            tab: stored.current_tab,
        })
    }

    /// Makes `id` the current instance, with tab `tab` (or, for the same
    /// instance, the tab it had).
    async fn make_current(&self, id: &InstanceId, tab: Option<String>) {
        let Some(session) = self.session_id() else {
            let mut current = self.current.lock().expect("mcp lock");
            if current.instance.as_ref() != Some(id) {
                current.tab = None;
            }
            current.instance = Some(id.clone());
            if tab.is_some() {
                current.tab = tab;
            }
            return;
        };
        let stored = self
            .control_plane
            .store
            .mcp_session_current(&session, id, tab.as_deref());
        if let Err(error) = stored.await {
            tracing::warn!(%error, instance = %id, "cannot record an MCP session's current instance");
        }
    }

    /// Records that the session created `id` (it ends with the session);
    /// a session that ended meanwhile ends it now, and the call fails.
    async fn remember_created(&self, id: &InstanceId) -> Result<(), CallToolResult> {
        let Some(session) = self.session_id() else {
            return Ok(());
        };
        self.control_plane
            .mcp_session_created(&session, id)
            .await
            .map_err(failed_with)
    }

    /// The session holds `id` no more (it was closed).
    async fn let_go(&self, id: &InstanceId) {
        let Some(session) = self.session_id() else {
            let mut current = self.current.lock().expect("mcp lock");
            if current.instance.as_ref() == Some(id) {
                *current = Current::default();
            }
            return;
        };
        let stored = self.control_plane.store.mcp_session_let_go(&session, id);
        if let Err(error) = stored.await {
            tracing::warn!(%error, instance = %id, "cannot record that an MCP session let go of an instance");
        }
    }

    /// Carries out `op` on the page of the named (or current) instance.
    async fn step(&self, named: &Option<String>, op: PageOp) -> CallToolResult {
        let (id, tab) = match self.instance_and_tab(named).await {
            Ok(found) => found,
            Err(refusal) => return refusal,
        };
        let request = AgentPageRequest {
            tab,
            op,
            timeout_ms: self.control_plane.config.mcp.step_timeout_ms,
        };
        match self.control_plane.instance_page(&id, &request).await {
            Ok(answer) => {
                self.make_current(&id, Some(answer.tab.clone())).await;
                let mut content = vec![ContentBlock::text(answer.text)];
                if let Some(png) = answer.png_base64 {
                    content.push(ContentBlock::image(png, "image/png"));
                }
                CallToolResult::success(content)
            }
            Err(error) => failed_with(error),
        }
    }
}

#[tool_router]
impl McpSession {
    #[tool(
        description = "Create a browser (a real, isolated Chromium, or Firefox with image \"firefox\") and make it the current one. Returns its id. Options: image, a saved profile, an upstream proxy, extensions, recording, and a URL to open."
    )]
    async fn browser_create(&self, Parameters(params): Parameters<CreateParams>) -> CallToolResult {
        let proxy = params.proxy.map(|server| UpstreamProxy {
            server,
            username: params.proxy_username,
            password: params
                .proxy_password
                .map(flotilla_api_types::credentials::Secret::new),
            bypass: Vec::new(),
        });
        let request = CreateInstanceRequest {
            image: params.image,
            config: Some(InstanceConfig {
                proxy,
                extensions: params.extensions,
                record: params.record,
                ..InstanceConfig::default()
            }),
            node_preference: None,
            profile: params.profile.map(|name| ProfileUse {
                name,
                persist: params.persist_profile,
            }),
        };
        let wait = self.control_plane.config.mcp.queue_wait_sec;
        let scope = match self.scope() {
            Ok(scope) => scope,
            Err(refusal) => return refusal,
        };
        let instance = match self
            .control_plane
            .instance_create_queued(request, wait, &scope)
            .await
        {
            Ok(instance) => instance,
            Err(error) => return failed_with(error),
        };
        if let Err(refusal) = self.remember_created(&instance.id).await {
            return refusal;
        }
        self.make_current(&instance.id, None).await;
        let mut text = format!("Created browser {} (now the current one).\n", instance.id);
        if let Some(url) = params.url {
            let opened = self
                .step(&Some(instance.id.to_string()), PageOp::Navigate { url })
                .await;
            if opened.is_error == Some(true) {
                let mut content = vec![ContentBlock::text(text)];
                content.extend(opened.content);
                return CallToolResult::error(content);
            }
            for block in opened.content {
                if let Some(part) = block.as_text() {
                    text.push_str(&part.text);
                }
            }
        }
        done(text)
    }

    #[tool(description = "List the fleet's browsers: id, status, node and creation time.")]
    async fn browser_list(&self) -> CallToolResult {
        let scope = match self.scope() {
            Ok(scope) => scope,
            Err(refusal) => return refusal,
        };
        let current = match self.current().await {
            Ok(current) => current.instance,
            Err(refusal) => return refusal,
        };
        match self
            .control_plane
            .instance_list(ListInstancesQuery::default(), &scope)
            .await
        {
            Ok(list) => {
                let mut text = format!("{} browser(s):\n", list.instances.len());
                for instance in list.instances {
                    let mark = if current.as_ref() == Some(&instance.id) {
                        " (current)"
                    } else {
                        ""
                    };
                    text.push_str(&format!("- {} {}{mark}\n", instance.id, instance.status));
                }
                done(text)
            }
            Err(error) => failed_with(error),
        }
    }

    #[tool(description = "Close (delete) a browser.")]
    async fn browser_close(&self, Parameters(params): Parameters<InstanceParam>) -> CallToolResult {
        let id = match self.instance(&params.instance_id).await {
            Ok(id) => id,
            Err(refusal) => return refusal,
        };
        match self.control_plane.instance_delete(&id, false).await {
            Ok(_) => {
                self.let_go(&id).await;
                done(format!("Closed browser {id}."))
            }
            Err(error) => failed_with(error),
        }
    }

    #[tool(
        description = "Park a browser: its cookies, storage and tabs are saved and the browser stops, using no memory until revived."
    )]
    async fn browser_park(&self, Parameters(params): Parameters<InstanceParam>) -> CallToolResult {
        let id = match self.instance(&params.instance_id).await {
            Ok(id) => id,
            Err(refusal) => return refusal,
        };
        match self.control_plane.instance_dormant(&id).await {
            Ok(instance) => done(format!("Browser {id} is {}.", instance.status)),
            Err(error) => failed_with(error),
        }
    }

    #[tool(
        description = "Revive a parked browser with its cookies, storage and (by default) its tabs."
    )]
    async fn browser_revive(&self, Parameters(params): Parameters<ReviveParams>) -> CallToolResult {
        let id = match self.instance(&params.instance_id).await {
            Ok(id) => id,
            Err(refusal) => return refusal,
        };
        let method = if params.restore_tabs.unwrap_or(true) {
            ReviveMethod::FullRestore
        } else {
            ReviveMethod::QuickStart
        };
        match self.control_plane.instance_revive(&id, method).await {
            Ok(instance) => {
                self.make_current(&id, None).await;
                done(format!(
                    "Browser {id} is {} (page tools wait until it runs).",
                    instance.status
                ))
            }
            Err(error) => failed_with(error),
        }
    }

    #[tool(description = "Open a URL in the current tab and wait for it to load.")]
    async fn browser_navigate(
        &self,
        Parameters(params): Parameters<NavigateParams>,
    ) -> CallToolResult {
        self.step(&params.instance_id, PageOp::Navigate { url: params.url })
            .await
    }

    #[tool(description = "Go back to the previous page of the current tab.")]
    async fn browser_back(&self, Parameters(params): Parameters<InstanceParam>) -> CallToolResult {
        self.step(&params.instance_id, PageOp::Back).await
    }

    #[tool(
        description = "Read the current page as an accessibility tree: one line per element, each actionable one with a reference ([ref=e42]) that the other tools take. Take a new one after the page changes."
    )]
    async fn browser_snapshot(
        &self,
        Parameters(params): Parameters<InstanceParam>,
    ) -> CallToolResult {
        self.step(&params.instance_id, PageOp::Snapshot).await
    }

    #[tool(description = "Click an element by its reference from the snapshot.")]
    async fn browser_click(&self, Parameters(params): Parameters<ElementParams>) -> CallToolResult {
        let op = PageOp::Click {
            element: params.reference,
            double: params.double_click,
        };
        self.step(&params.instance_id, op).await
    }

    #[tool(description = "Move the mouse over an element by its reference.")]
    async fn browser_hover(&self, Parameters(params): Parameters<ElementParams>) -> CallToolResult {
        let op = PageOp::Hover {
            element: params.reference,
        };
        self.step(&params.instance_id, op).await
    }

    #[tool(description = "Drag one element onto another, by their references.")]
    async fn browser_drag(&self, Parameters(params): Parameters<DragParams>) -> CallToolResult {
        let op = PageOp::Drag {
            from: params.start_ref,
            to: params.end_ref,
        };
        self.step(&params.instance_id, op).await
    }

    #[tool(
        description = "Type text into a field by its reference (replacing what it holds), optionally pressing Enter."
    )]
    async fn browser_type(&self, Parameters(params): Parameters<TypeParams>) -> CallToolResult {
        let op = PageOp::Type {
            element: params.reference,
            text: params.text,
            submit: params.submit,
        };
        self.step(&params.instance_id, op).await
    }

    #[tool(
        description = "Press a key in the current tab (Enter, Tab, Escape, an arrow, a character)."
    )]
    async fn browser_press_key(&self, Parameters(params): Parameters<KeyParams>) -> CallToolResult {
        self.step(&params.instance_id, PageOp::PressKey { key: params.key })
            .await
    }

    #[tool(description = "Select options of a drop-down list by their values or labels.")]
    async fn browser_select_option(
        &self,
        Parameters(params): Parameters<SelectParams>,
    ) -> CallToolResult {
        let op = PageOp::SelectOption {
            element: params.reference,
            values: params.values,
        };
        self.step(&params.instance_id, op).await
    }

    #[tool(
        description = "Wait until a text appears on the page, or goes, or for a number of seconds."
    )]
    async fn browser_wait_for(&self, Parameters(params): Parameters<WaitParams>) -> CallToolResult {
        if params.text.is_none() && params.text_gone.is_none() && params.time.is_none() {
            return failed("give text, text_gone or time");
        }
        let time_ms = params
            .time
            .filter(|t| t.is_finite() && *t >= 0.0)
            .map(|t| (t.min(60.0) * 1000.0) as u64);
        let op = PageOp::WaitFor {
            text: params.text,
            text_gone: params.text_gone,
            time_ms,
        };
        self.step(&params.instance_id, op).await
    }

    #[tool(
        description = "Evaluate a JavaScript expression in the current page; its value as JSON."
    )]
    async fn browser_evaluate(
        &self,
        Parameters(params): Parameters<EvaluateParams>,
    ) -> CallToolResult {
        let op = PageOp::Evaluate {
            expression: params.expression,
        };
        self.step(&params.instance_id, op).await
    }

    #[tool(description = "Take a screenshot of the current tab (a PNG image).")]
    async fn browser_screenshot(
        &self,
        Parameters(params): Parameters<InstanceParam>,
    ) -> CallToolResult {
        self.step(&params.instance_id, PageOp::Screenshot).await
    }

    #[tool(
        description = "Tabs of the browser: action list, new (with an optional url), select or close (with the tab's id)."
    )]
    async fn browser_tabs(&self, Parameters(params): Parameters<TabsParams>) -> CallToolResult {
        let tab = || {
            params
                .tab
                .clone()
                .ok_or_else(|| failed("give tab (its id from list)"))
        };
        let op = match params.action.as_str() {
            "list" => PageOp::TabList,
            "new" => PageOp::TabNew {
                url: params.url.clone(),
            },
            "select" => match tab() {
                Ok(tab) => PageOp::TabSelect { tab },
                Err(refusal) => return refusal,
            },
            "close" => match tab() {
                Ok(tab) => PageOp::TabClose { tab },
                Err(refusal) => return refusal,
            },
            other => {
                return failed(format!(
                    "unknown action {other:?}: use list, new, select or close"
                ));
            }
        };
        self.step(&params.instance_id, op).await
    }

    #[tool(
        description = "Console messages and uncaught errors of the browser's pages, from the first browser_ step on it."
    )]
    async fn browser_console_messages(
        &self,
        Parameters(params): Parameters<InstanceParam>,
    ) -> CallToolResult {
        self.step(&params.instance_id, PageOp::ConsoleMessages)
            .await
    }

    #[tool(description = "Requests the current page made since it loaded: status, kind and URL.")]
    async fn browser_network_requests(
        &self,
        Parameters(params): Parameters<InstanceParam>,
    ) -> CallToolResult {
        self.step(&params.instance_id, PageOp::NetworkRequests)
            .await
    }

    #[tool(
        description = "Set the files of a file input (by its reference) to files given here (name and base64 content each)."
    )]
    async fn browser_file_upload(
        &self,
        Parameters(params): Parameters<UploadParams>,
    ) -> CallToolResult {
        let files = params
            .files
            .into_iter()
            .map(|file| flotilla_api_types::page::UploadFile {
                name: file.name,
                content_base64: file.content_base64,
            })
            .collect();
        let op = PageOp::FileUpload {
            element: params.reference,
            files,
        };
        self.step(&params.instance_id, op).await
    }

    #[tool(description = "Files the browser downloaded: name, size, type and state.")]
    async fn browser_downloads(
        &self,
        Parameters(params): Parameters<InstanceParam>,
    ) -> CallToolResult {
        self.step(&params.instance_id, PageOp::Downloads).await
    }

    #[tool(
        description = "Hand the browser to a person: makes a live link with control (a page that shows the browser and lets them drive it, e.g. to solve a login or a CAPTCHA) and returns its URL and id. Give them the URL, then call browser_handoff again with wait_for_link set to the id: it answers when they press \"Done, hand back\" on the page (or after timeout_sec)."
    )]
    async fn browser_handoff(
        &self,
        Parameters(params): Parameters<HandoffParams>,
        context: RequestContext<RoleServer>,
    ) -> CallToolResult {
        let id = match self.instance(&params.instance_id).await {
            Ok(id) => id,
            Err(refusal) => return refusal,
        };
        if let Some(link) = params.wait_for_link {
            let wait = std::time::Duration::from_secs(params.timeout_sec.unwrap_or(300).min(3600));
            return match self
                .control_plane
                .live_link_handed_back(&id, &link, wait)
                .await
            {
                Ok(true) => done(format!(
                    "The person handed browser {id} back. Take a new snapshot: the page may have changed."
                )),
                Ok(false) => failed(format!(
                    "not handed back within {} s; the link still works: wait again, or go on without it",
                    wait.as_secs()
                )),
                Err(Error::NotFound(detail)) => failed(format!(
                    "{detail}; it was not handed back (make a new link with browser_handoff)"
                )),
                Err(error) => failed_with(error),
            };
        }
        let base = match self.control_plane.config.public_url.clone() {
            Some(url) => url.trim_end_matches('/').to_owned(),
            None => {
                let host = context
                    .extensions
                    .get::<axum::http::request::Parts>()
                    .and_then(|parts| parts.headers.get(axum::http::header::HOST))
                    .and_then(|host| host.to_str().ok())
                    .unwrap_or("localhost")
                    .to_owned();
                format!("http://{host}")
            }
        };
        let request = CreateLiveLinkRequest {
            mode: LiveMode::Control,
            ttl_sec: Some(params.ttl_sec.unwrap_or(1800)),
        };
        match self
            .control_plane
            .live_link_create(&id, request, &base)
            .await
        {
            Ok(link) => done(format!(
                "Give this link to the person: {}\nLink id: {}\nIt shows browser {id} and lets them drive it until {}. Then call browser_handoff with wait_for_link \"{}\" to wait until they hand it back.",
                link.url, link.id, link.expires_at, link.id
            )),
            Err(error) => failed_with(error),
        }
    }
}

impl McpSession {
    /// Runs `call`, marking the session used while it runs (a handoff may
    /// wait for its person longer than the session's idle timeout).
    async fn keeping_alive<T>(&self, call: impl std::future::Future<Output = T>) -> T {
        let Some(session) = self.session_id() else {
            return call.await;
        };
        let idle = self.control_plane.config.mcp.session_idle_timeout_sec;
        let every = std::time::Duration::from_secs((idle / 3).clamp(1, 60));
        let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        tokio::pin!(call);
        loop {
            tokio::select! {
                done = &mut call => return done,
                _ = ticker.tick() => {
                    if let Err(error) = self.control_plane.mcp_session_touch(&session).await {
                        tracing::warn!(%error, "cannot mark an MCP session used");
                    }
                }
            }
        }
    }
}

#[tool_handler]
impl ServerHandler for McpSession {
    fn get_info(&self) -> ServerConfig {
        InitializeResult::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("flotilla", env!("CARGO_PKG_VERSION")))
            .with_instructions(
                "Real browsers on demand. browser_create makes one; browser_navigate opens a page; browser_snapshot reads it with element references that browser_click, browser_type and the others take; browser_close ends it.",
            )
    }

    /// Calls a tool; arguments that do not fit its schema are a tool error
    /// an agent reads and corrects, like every other failure of a tool (an
    /// unknown tool stays the protocol's error).
    async fn call_tool(
        &self,
        request: rmcp::model::CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::CallToolResponse, ErrorData> {
        let scope = context
            .extensions
            .get::<axum::http::request::Parts>()
            .and_then(|parts| parts.extensions.get::<Scope>())
            .cloned();
        *self.scope.lock().expect("mcp lock") = scope;
        *self.session_id.lock().expect("mcp lock") = context
            .extensions
            .get::<axum::http::request::Parts>()
            .and_then(|parts| parts.headers.get("mcp-session-id"))
            .and_then(|id| id.to_str().ok())
            .map(str::to_owned);
        let router = Self::tool_router();
        let known = router.has_route(&request.name);
        let name = request.name.clone();
        let call = rmcp::handler::server::tool::ToolCallContext::new(self, request, context);
        match self.keeping_alive(router.call(call)).await {
            Err(error) if known && error.code == rmcp::model::ErrorCode::INVALID_PARAMS => {
                Ok(failed(format!(
                    "{name}: {} (see the tool's input schema)",
                    error.message
                ))
                .into())
            }
            other => other,
        }
    }

    async fn initialize(
        &self,
        request: InitializeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<InitializeResult, ErrorData> {
        self.in_session.store(true, Ordering::Release);
        context.peer.set_peer_info(request.clone());
        self.negotiate_initialize(&request)
    }
}
