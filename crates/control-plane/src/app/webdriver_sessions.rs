//! A WebDriver session's start and end on the control plane: the new
//! session's instance created, its node's chromedriver attached to its
//! browser, the capabilities the client gets pointed through the front door
//! (nothing is left behind a session that did not start); at its end,
//! chromedriver lets the browser go and the instance is deleted.
//!
//! The node is reached on the instance's HTTP port through an
//! [`InstancePort`], which the HTTP layer provides (the front door's
//! connections).

use serde_json::{Value, json};

use flotilla_api_types::InstanceId;

use super::webdriver::{NewSession, WebDriverRefusal};
use super::{ControlPlane, DoorTarget, Scope};

/// A request of the control plane's own to an instance's HTTP port.
pub struct PortCall {
    /// `POST`, `DELETE`, ….
    pub method: &'static str,
    pub path: String,
    /// JSON.
    pub body: String,
    /// `x-flotilla-…` header lines the node reads.
    pub headers: Vec<(&'static str, String)>,
}

impl PortCall {
    fn new(method: &'static str, path: String, body: String) -> Self {
        Self {
            method,
            path,
            body,
            headers: Vec::new(),
        }
    }
}

/// How the control plane reaches an instance's HTTP port: the status and
/// JSON (`null` when it is none) of what the node answered.
#[async_trait::async_trait]
pub trait InstancePort: Send + Sync {
    async fn call(&self, target: &DoorTarget, call: PortCall) -> std::io::Result<(u16, Value)>;
}

/// Who opens a session, and where they reached the control plane.
pub struct SessionCaller {
    /// The principal (checked on the front door).
    pub principal: String,
    pub scope: Scope,
    /// The hex SHA-256 of its API key (checked by the node on the
    /// instance's own port).
    pub key: Option<String>,
    /// `ws(s)://host[:port]` of the front door as the client reached it.
    pub door: String,
}

/// A failure to reach the instance's node, as WebDriver says it.
fn unreachable_node(error: std::io::Error) -> WebDriverRefusal {
    WebDriverRefusal::unknown(format!("the instance's node did not answer: {error}"))
}

impl ControlPlane {
    /// Starts a session asked for by `body` (the W3C new-session JSON):
    /// the new session's answer, as a client expects it.
    pub async fn webdriver_session_start(
        &self,
        body: &[u8],
        caller: SessionCaller,
        port: &dyn InstancePort,
    ) -> Result<Value, WebDriverRefusal> {
        let body: Value = serde_json::from_slice(body).map_err(|e| {
            WebDriverRefusal::invalid_argument(format!("the body is not JSON: {e}"))
        })?;
        let installed = self
            .webdriver_browser_version()
            .await
            .map_err(|e| WebDriverRefusal::unknown(e.to_string()))?;
        let session = super::webdriver::new_session(&body, &installed)?;
        let instance = self
            .webdriver_instance_create(&session, (&caller.principal, &caller.scope))
            .await?;
        match self.attach(&instance.id, &session, &caller, port).await {
            Ok(value) => Ok(value),
            Err(refusal) => {
                // Nothing is left behind a session that did not start.
                let _ = self.instance_delete(&instance.id, true).await;
                Err(refusal)
            }
        }
    }

    /// Ends session `id`: chromedriver lets the browser go, the instance is
    /// deleted (gracefully: a persistent profile is written back).
    pub async fn webdriver_session_end(
        &self,
        target: &DoorTarget,
        id: &InstanceId,
        port: &dyn InstancePort,
    ) -> Result<(), WebDriverRefusal> {
        let path = format!("/webdriver/session/{id}");
        let _ = port
            .call(target, PortCall::new("DELETE", path, String::new()))
            .await;
        self.instance_delete(id, false)
            .await
            .map(drop)
            .map_err(|error| WebDriverRefusal::unknown(error.to_string()))
    }

    /// Asks the instance's node to attach chromedriver to its browser; the
    /// new session's answer, its capabilities pointed through the door.
    async fn attach(
        &self,
        id: &InstanceId,
        session: &NewSession,
        caller: &SessionCaller,
        port: &dyn InstancePort,
    ) -> Result<Value, WebDriverRefusal> {
        let target = self.webdriver_target(id, &caller.principal).await?;
        let body = json!({"capabilities": session.capabilities}).to_string();
        let mut call = PortCall::new("POST", "/webdriver/session".into(), body);
        if let Some(key) = &caller.key {
            call.headers
                .push(("x-flotilla-webdriver-owner", key.clone()));
        }
        let (status, answer) = port.call(&target, call).await.map_err(unreachable_node)?;
        let mut value = answer.get("value").cloned().unwrap_or(Value::Null);
        if !(200..300).contains(&status) || value.get("sessionId").is_none() {
            let message = value["message"]
                .as_str()
                .unwrap_or("the node did not start the session");
            return Err(WebDriverRefusal::not_created(message.to_owned()));
        }
        if let Some((width, height)) = session.window_size {
            let rect = json!({"width": width, "height": height}).to_string();
            let path = format!("/webdriver/session/{id}/window/rect");
            port.call(&target, PortCall::new("POST", path, rect))
                .await
                .map_err(unreachable_node)?;
        }
        point_through_the_door(&mut value, session, (id, &target), &caller.door);
        Ok(value)
    }
}

/// Rewrites chromedriver's answer for a client of the door: its sockets
/// (BiDi, `se:cdp`) are inside the instance's network, so the client gets
/// the door's, which relay to them; the session id is the instance's.
fn point_through_the_door(
    value: &mut Value,
    session: &NewSession,
    (id, target): (&InstanceId, &DoorTarget),
    door: &str,
) {
    let capabilities = &mut value["capabilities"];
    if let Some(chrome) = capabilities
        .get_mut("goog:chromeOptions")
        .and_then(Value::as_object_mut)
    {
        chrome.remove("debuggerAddress");
    }
    let query = target
        .token
        .as_deref()
        .map(|t| format!("?token={t}"))
        .unwrap_or_default();
    if capabilities
        .get("webSocketUrl")
        .is_some_and(Value::is_string)
    {
        capabilities["webSocketUrl"] =
            json!(format!("{door}/v2/instances/{id}/webdriver/bidi{query}"));
    }
    if session.downloads_enabled {
        capabilities["se:downloadsEnabled"] = json!(true);
    }
    capabilities["platformName"] = json!("linux");
    // Firefox speaks no CDP: its clients use BiDi (webSocketUrl).
    if capabilities["browserName"] != "firefox" {
        let version = capabilities["browserVersion"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        capabilities["se:cdp"] = json!(format!("{door}/v2/instances/{id}/se/cdp{query}"));
        capabilities["se:cdpVersion"] = json!(version);
    } else if let Some(moz) = capabilities.as_object_mut() {
        // Paths and a process of the node's, not the client's.
        moz.remove("moz:profile");
        moz.remove("moz:processID");
        // How a client knows a Selenium server without `se:cdp` (WebdriverIO
        // offers Grid's file upload and managed downloads only then).
        moz.insert("webdriver.remote.sessionid".into(), json!(id));
    }
    capabilities["flotilla:instance"] = json!(id);
    value["sessionId"] = json!(id);
}
