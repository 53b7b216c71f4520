//! The instance's WebDriver server, made by its browser's authors:
//! Debian's `chromedriver` (the same version as the node's Chromium,
//! attached with `goog:chromeOptions.debuggerAddress`) or geckodriver for
//! Firefox (`--connect-existing`, attached to the browser's Marionette), in
//! the instance's own confinement (its sandbox, network namespace, cgroup
//! and the browser's process group, as the browser user; chromedriver
//! started beside a warm browser ahead of time, or for the instance's
//! first session). It can reach nothing but that browser, and it ends with
//! it.
//!
//! Besides passing commands on (one kept-alive connection), the routes read
//! what the driver would let reach past the instance: raw CDP commands get
//! the gateway's pins, geckodriver's chrome context and add-on installs are
//! refused, the BiDi socket (chromedriver's, or Firefox's own) is relayed
//! through [`crate::protocols::client_frames`], and Grid's file commands are
//! served by [`crate::protocols::se_files`] instead of the driver.
//!
//! The instance's HTTP port serves it at `/webdriver/…` (the control plane's
//! front door forwards `/session/{id}/…` there). The WebDriver session id
//! clients see is the instance's id: this module keeps the driver's own
//! session id, and attaches a new driver session (with the same
//! capabilities) when the browser is not the one it was made for — after a
//! park and revive, the next command finds the instance's new browser.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use serde_json::{Value, json};

use flotilla_api_types::credentials::constant_time_eq;

use crate::config::EngineKind;
use crate::confine::sandbox::Isolation;
use crate::engine::bidi::SessionClaim;
use crate::engine::browser::CdpEndpoint;
use crate::engine::driver::{Beside, Driver, Kept, WebDriverError, call, call_kept, start_driver};
use crate::instance::InstanceSlot;
use crate::protocols::access::Admission;
use crate::system::dirs::InstanceDirs;

/// One instance's WebDriver front: its chromedriver and session.
#[derive(Default)]
pub struct WebDriver {
    /// The driver and the session; a tokio mutex: commands of one session
    /// are answered in turn (as chromedriver does), and starting the driver
    /// or attaching a session awaits.
    state: tokio::sync::Mutex<State>,
    /// The running driver's process, readable without the lock: a park
    /// ends it when a command holds the lock too long.
    driver_pid: std::sync::atomic::AtomicU32,
    /// The path of Firefox's BiDi socket of the session while one is on
    /// (the live view attaches to it), readable without the lock.
    view_socket: std::sync::Mutex<Option<String>>,
}

/// How long a park waits for a session's command in progress before it
/// ends the driver (a script that never finishes would hold it forever).
const LET_GO_WAIT: Duration = Duration::from_secs(10);

/// The session let go of its browser for a park ([`WebDriver::let_go_of_browser`]):
/// its commands wait while this is held.
pub struct LetGo<'a> {
    _state: tokio::sync::MutexGuard<'a, State>,
}

#[derive(Default)]
struct State {
    driver: Option<Driver>,
    session: Option<Session>,
    /// The API key the session is for (its SHA-256): on the instance's own
    /// port only that key drives it ([`WebDriver::may_drive`]).
    owner: Option<[u8; 32]>,
    /// The connection commands go over, kept alive between them.
    connection: Option<Kept>,
}

/// The client's session, as the driver knows it.
struct Session {
    /// The driver's session id.
    id: String,
    /// The browser it is attached to.
    browser: CdpEndpoint,
    /// What the client asked for (to attach again after a revive).
    capabilities: Value,
    /// The path of Firefox's own BiDi socket of the session, when it asked
    /// for `webSocketUrl` (chromedriver serves its own at
    /// `/session/{id}`).
    firefox_bidi: Option<String>,
    /// The same socket, asked for by the agent whatever the client asked
    /// (the live view rides on it).
    view_socket: Option<String>,
    /// The session's claim on Firefox's only one (the live view holds none
    /// of its own meanwhile).
    claim: Option<SessionClaim>,
    /// The driver's session was ended while the client's goes on (a park
    /// of a Firefox): the next command attaches again.
    let_go: bool,
}

/// What is needed to start chromedriver beside a browser.
pub struct Confinement<'a> {
    pub isolation: &'a Isolation,
    pub dirs: &'a InstanceDirs,
    pub slot: &'a Arc<InstanceSlot>,
}

impl WebDriver {
    /// Starts a session on `browser` with the client's W3C `capabilities`
    /// (`alwaysMatch` merged by the control plane): chromedriver attaches to
    /// the browser; its answer's `value` (with the session id replaced by the
    /// instance's).
    pub async fn new_session(
        &self,
        confinement: &Confinement<'_>,
        browser: &CdpEndpoint,
        (capabilities, owner): (Value, Option<[u8; 32]>),
    ) -> Result<Value, WebDriverError> {
        let mut state = self.state.lock().await;
        if state.session.is_some() {
            return Err(WebDriverError::not_created(format!(
                "instance {} already has a WebDriver session: delete it first, or create another instance",
                confinement.slot.id
            )));
        }
        let attached = attach(&mut state, confinement, browser, &capabilities).await;
        self.remember_driver(&state);
        let mut answer = attached?;
        state.owner = owner;
        answer["sessionId"] = Value::String(confinement.slot.id.to_string());
        Ok(answer)
    }

    /// Passes a command of the session on to chromedriver: `method` on
    /// `rest` (what follows `/session/{id}`), with `body`. Answers its status
    /// and body as they are.
    pub async fn command(
        &self,
        confinement: &Confinement<'_>,
        browser: &CdpEndpoint,
        (method, rest, body): (hyper::Method, &str, Bytes),
    ) -> Result<(u16, Bytes), WebDriverError> {
        let mut state = self.state.lock().await;
        let attached = attached(&mut state, confinement, browser).await;
        self.remember_driver(&state);
        let (at, session) = attached?;
        let path = format!("/session/{session}{rest}");
        call_kept(&mut state.connection, &at, (method, &path, body)).await
    }

    /// Where the session's WebDriver BiDi socket is: chromedriver's address
    /// and the path of the session's socket there (`/session/{its id}`).
    pub async fn bidi_socket(
        &self,
        confinement: &Confinement<'_>,
        browser: &CdpEndpoint,
    ) -> Result<(CdpEndpoint, String), WebDriverError> {
        let mut state = self.state.lock().await;
        let attached = attached(&mut state, confinement, browser).await;
        self.remember_driver(&state);
        let (at, session) = attached?;
        match state.session.as_ref().map(|s| &s.firefox_bidi) {
            Some(Some(path)) => Ok((browser.clone(), path.clone())),
            Some(None) if browser.engine == EngineKind::Firefox => Err(WebDriverError::new(
                400,
                "invalid argument",
                "the session has no BiDi socket: create it with webSocketUrl: true",
            )),
            _ => Ok((at, format!("/session/{session}"))),
        }
    }

    /// Ends the session (chromedriver lets the browser be); `false` when
    /// there was none.
    pub async fn delete_session(&self) -> bool {
        let mut state = self.state.lock().await;
        let Some(session) = state.session.take() else {
            return false;
        };
        state.owner = None;
        self.remember_driver(&state);
        if let Some(driver) = &state.driver
            && driver.browser == session.browser
        {
            let path = format!("/session/{}", session.id);
            let _ = call(&driver.at, hyper::Method::DELETE, &path, Bytes::new()).await;
        }
        true
    }

    /// Ends the driver's session in the browser, keeping the client's (its
    /// next command attaches again): Firefox holds one WebDriver session,
    /// and a park reads the browser's state in one of its own. The session's
    /// commands wait until the guard is dropped (once the browser stopped:
    /// none attaches again to the browser being parked).
    pub async fn let_go_of_browser(&self) -> LetGo<'_> {
        let mut state = match tokio::time::timeout(LET_GO_WAIT, self.state.lock()).await {
            Ok(state) => state,
            Err(_) => {
                // A command holds the session (a script that never ends):
                // its driver is ended, which ends the command, and the
                // browser ends the session of a driver that went away.
                let pid = self.driver_pid.load(std::sync::atomic::Ordering::SeqCst);
                if let Ok(pid) = i32::try_from(pid)
                    && pid > 1
                {
                    // SAFETY: kill has no memory-safety preconditions; a
                    // process already gone only yields ESRCH.
                    unsafe {
                        libc::kill(pid, libc::SIGKILL);
                    }
                }
                let mut state = self.state.lock().await;
                state.driver = None;
                state.connection = None;
                if let Some(session) = &mut state.session {
                    session.let_go = true;
                    session.claim = None;
                }
                self.remember_driver(&state);
                return LetGo { _state: state };
            }
        };
        let State {
            driver, session, ..
        } = &mut *state;
        if let (Some(driver), Some(session)) = (driver, session)
            && driver.browser == session.browser
            && !session.let_go
        {
            session.let_go = true;
            let path = format!("/session/{}", session.id);
            if let Err(error) = call(&driver.at, hyper::Method::DELETE, &path, Bytes::new()).await {
                tracing::warn!(%error, "the WebDriver server did not end its session");
            }
            session.claim = None;
        }
        self.remember_driver(&state);
        LetGo { _state: state }
    }

    fn remember_driver(&self, state: &State) {
        let pid = state.driver.as_ref().and_then(Driver::pid).unwrap_or(0);
        self.driver_pid
            .store(pid, std::sync::atomic::Ordering::SeqCst);
        let socket = state
            .session
            .as_ref()
            .filter(|session| !session.let_go)
            .and_then(|session| session.view_socket.clone());
        *self.view_socket.lock().expect("view socket lock") = socket;
    }

    /// The path of Firefox's BiDi socket of the session, while one is on.
    pub fn view_socket(&self) -> Option<String> {
        self.view_socket.lock().expect("view socket lock").clone()
    }

    /// Whether the instance has a WebDriver session.
    pub async fn has_session(&self) -> bool {
        self.state.lock().await.session.is_some()
    }

    /// Whether a request let in as `admission` may drive the session: with
    /// the instance's token (the front door's way, which checks the key
    /// itself) or authentication off, yes; with an API key, only the
    /// session's own.
    pub async fn may_drive(&self, admission: Admission) -> bool {
        match admission {
            Admission::Open | Admission::InstanceToken => true,
            Admission::ApiKey(key) => self
                .state
                .lock()
                .await
                .owner
                .is_some_and(|owner| constant_time_eq(&owner, &key)),
        }
    }
}

/// The session's chromedriver and chromedriver's session id, attached to
/// `browser` first when the session was made for another one (the instance
/// was parked and revived: the same session goes on in the new browser).
async fn attached(
    state: &mut State,
    confinement: &Confinement<'_>,
    browser: &CdpEndpoint,
) -> Result<(CdpEndpoint, String), WebDriverError> {
    let Some(session) = &state.session else {
        return Err(WebDriverError::no_session(confinement.slot.id.as_str()));
    };
    if session.browser != *browser || session.let_go {
        let capabilities = session.capabilities.clone();
        state.session = None;
        attach(state, confinement, browser, &capabilities).await?;
    }
    match (&state.driver, &state.session) {
        (Some(driver), Some(session)) => Ok((driver.at.clone(), session.id.clone())),
        _ => Err(WebDriverError::no_session(confinement.slot.id.as_str())),
    }
}

/// A chromedriver session on `browser` with `capabilities`, the driver
/// started (or started again, for a new browser) first. On Firefox the
/// session claims the browser's only one first (the live view lets go of
/// its own), and always has a BiDi socket, which the live view rides on
/// (the client is told of it only if it asked for `webSocketUrl`).
async fn attach(
    state: &mut State,
    confinement: &Confinement<'_>,
    browser: &CdpEndpoint,
    capabilities: &Value,
) -> Result<Value, WebDriverError> {
    let claim = match browser.engine {
        EngineKind::Firefox => Some(browser.session_turns.claim().await),
        EngineKind::Chromium => None,
    };
    if confinement.slot.endpoint().as_ref() != Some(browser) {
        return Err(WebDriverError::not_created(
            "the browser stopped meanwhile (the instance is being parked or deleted): send the command again",
        ));
    }
    let driver = driver_beside(state, confinement, browser).await?;
    let mut always = allowed_capabilities(capabilities, browser.engine)?;
    match claim.is_some() {
        true => always["webSocketUrl"] = Value::Bool(true),
        false => {
            always["goog:chromeOptions"]["debuggerAddress"] = Value::String(browser.authority())
        }
    }
    let (id, mut value) = start_session(&driver, always).await?;
    let socket = value["capabilities"]["webSocketUrl"]
        .as_str()
        .and_then(socket_path);
    let asked_bidi = capabilities.get("webSocketUrl") == Some(&Value::Bool(true));
    if claim.is_some()
        && !asked_bidi
        && let Some(answered) = value["capabilities"].as_object_mut()
    {
        answered.remove("webSocketUrl");
    }
    state.session = Some(Session {
        id,
        browser: browser.clone(),
        capabilities: capabilities.clone(),
        firefox_bidi: socket.clone().filter(|_| claim.is_some() && asked_bidi),
        view_socket: socket,
        claim,
        let_go: false,
    });
    Ok(value)
}

/// The driver beside `browser`: the one running, the one a warm browser
/// came with, or a new one.
async fn driver_beside(
    state: &mut State,
    confinement: &Confinement<'_>,
    browser: &CdpEndpoint,
) -> Result<CdpEndpoint, WebDriverError> {
    if state.driver.as_ref().is_none_or(|d| d.browser != *browser) {
        state.driver = match confinement.slot.take_prestarted_driver().await {
            Some(driver) if driver.browser == *browser => Some(driver),
            _ => {
                let cgroup = confinement.slot.cgroup();
                let group = confinement
                    .slot
                    .process()
                    .and_then(|process| process.pid())
                    .ok_or_else(|| WebDriverError::not_created("the browser is not running"))?;
                let beside = Beside {
                    isolation: confinement.isolation,
                    dirs: confinement.dirs,
                    cgroup: cgroup.as_ref(),
                    group,
                };
                Some(start_driver(&beside, browser).await?)
            }
        };
    }
    Ok(state.driver.as_ref().expect("just started").at.clone())
}

/// Starts a session of the driver at `at` with `always` as its
/// `alwaysMatch`: its id and the answer's `value`.
async fn start_session(at: &CdpEndpoint, always: Value) -> Result<(String, Value), WebDriverError> {
    let request = json!({"capabilities": {"alwaysMatch": always}});
    let (status, body) = call(
        at,
        hyper::Method::POST,
        "/session",
        Bytes::from(request.to_string()),
    )
    .await?;
    let answer: Value = serde_json::from_slice(&body).map_err(|e| {
        WebDriverError::not_created(format!(
            "the WebDriver server answered what is not JSON: {e}"
        ))
    })?;
    let value = answer.get("value").cloned().unwrap_or(Value::Null);
    let Some(id) = value
        .get("sessionId")
        .and_then(Value::as_str)
        .map(str::to_owned)
    else {
        let message = value["message"].as_str().unwrap_or("no session id");
        return Err(WebDriverError::not_created(format!(
            "the WebDriver server refused the session ({status}): {message}"
        )));
    };
    Ok((id, value))
}

/// The path of a `ws://host:port/session/{id}` URL (Firefox's BiDi socket
/// of a session, as geckodriver answers it).
fn socket_path(url: &str) -> Option<String> {
    let after_scheme = url.strip_prefix("ws://")?;
    let path = &after_scheme[after_scheme.find('/')?..];
    let id = path.strip_prefix("/session/")?;
    let valid = !id.is_empty() && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
    valid.then(|| path.to_owned())
}

/// The standard capabilities a session may set on an attached browser (what
/// the control plane passes on; this port is reachable with the instance's
/// token too, so the node checks again).
const ALLOWED_CAPABILITIES: &[&str] = &[
    "acceptInsecureCerts",
    "pageLoadStrategy",
    "setWindowRect",
    "strictFileInteractability",
    "timeouts",
    "unhandledPromptBehavior",
    "webSocketUrl",
    "browserName",
    "browserVersion",
    "goog:chromeOptions",
];

/// `capabilities` as the driver of `engine` gets them: only
/// [`ALLOWED_CAPABILITIES`]; `browserName` must name the engine (it and
/// `browserVersion` go on to geckodriver, which checks the version against
/// its Firefox, and are left out for chromedriver, which attaches); of
/// `goog:chromeOptions` only `mobileEmulation`, and only on Chromium
/// (arguments, `prefs` and the rest apply to a browser the driver launches,
/// or reach past the instance: `prefs` can set a download directory);
/// anything else is `invalid argument`.
fn allowed_capabilities(capabilities: &Value, engine: EngineKind) -> Result<Value, WebDriverError> {
    let mut allowed = allowed_chrome_capabilities(capabilities)?;
    let names = |name: &str| match engine {
        EngineKind::Chromium => matches!(name, "chrome" | "chromium"),
        EngineKind::Firefox => name == "firefox",
    };
    if let Some(name) = allowed.get("browserName").and_then(Value::as_str)
        && !names(name)
    {
        return Err(WebDriverError::not_created(format!(
            "browserName {name:?}: this instance runs {} (its image's engine)",
            engine.label()
        )));
    }
    if engine == EngineKind::Chromium {
        allowed.remove("browserName");
        allowed.remove("browserVersion");
    } else if allowed.remove("goog:chromeOptions").is_some() {
        return Err(WebDriverError::new(
            400,
            "invalid argument",
            "goog:chromeOptions: this instance runs Firefox",
        ));
    }
    Ok(Value::Object(allowed))
}

fn allowed_chrome_capabilities(
    capabilities: &Value,
) -> Result<serde_json::Map<String, Value>, WebDriverError> {
    let invalid = |what: String| WebDriverError::new(400, "invalid argument", what);
    let empty = serde_json::Map::new();
    let fields = match capabilities {
        Value::Null => &empty,
        Value::Object(fields) => fields,
        _ => return Err(invalid("capabilities must be an object".into())),
    };
    let mut allowed = serde_json::Map::new();
    for (key, value) in fields {
        if !ALLOWED_CAPABILITIES.contains(&key.as_str()) {
            return Err(invalid(format!(
                "capability {key:?} is not taken here: create sessions with POST /session on the control plane"
            )));
        }
        if key == "goog:chromeOptions" {
            let mut chrome = serde_json::Map::new();
            for (option, value) in value.as_object().into_iter().flatten() {
                if option != "mobileEmulation" {
                    return Err(invalid(format!(
                        "goog:chromeOptions.{option} is not taken here: create sessions with POST /session on the control plane"
                    )));
                }
                chrome.insert(option.clone(), value.clone());
            }
            allowed.insert(key.clone(), Value::Object(chrome));
        } else {
            allowed.insert(key.clone(), value.clone());
        }
    }
    Ok(allowed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_made_on_the_node_takes_only_what_the_control_plane_passes_on() {
        let passed = allowed_capabilities(
            &json!({
                "acceptInsecureCerts": true,
                "webSocketUrl": true,
                "browserName": "chrome",
                "goog:chromeOptions": {"mobileEmulation": {"deviceName": "Pixel 7"}},
            }),
            EngineKind::Chromium,
        )
        .unwrap();
        assert!(passed.get("browserName").is_none(), "chromedriver attaches");
        assert_eq!(
            passed["goog:chromeOptions"]["mobileEmulation"]["deviceName"],
            "Pixel 7"
        );
        for refused in [
            json!({"goog:chromeOptions": {"prefs": {"download.default_directory": "/instance/home"}}}),
            json!({"goog:chromeOptions": {"args": ["--no-sandbox"]}}),
            json!({"goog:chromeOptions": {"binary": "/bin/sh"}}),
            json!({"goog:loggingPrefs": {"performance": "ALL"}}),
            json!({"moz:firefoxOptions": {"binary": "/bin/sh"}}),
            json!("nope"),
        ] {
            let error = allowed_capabilities(&refused, EngineKind::Chromium).unwrap_err();
            assert_eq!(error.code, "invalid argument", "{refused}");
        }
        assert_eq!(
            allowed_capabilities(&Value::Null, EngineKind::Chromium).unwrap(),
            json!({})
        );
    }

    #[test]
    fn a_firefox_session_names_its_engine_and_takes_nothing_of_chromes() {
        let passed = allowed_capabilities(
            &json!({"browserName": "firefox", "browserVersion": "153", "webSocketUrl": true}),
            EngineKind::Firefox,
        )
        .unwrap();
        assert_eq!(passed["browserName"], "firefox", "geckodriver checks it");
        assert_eq!(passed["browserVersion"], "153");
        let other = allowed_capabilities(&json!({"browserName": "chrome"}), EngineKind::Firefox)
            .unwrap_err();
        assert_eq!(other.code, "session not created");
        assert!(other.message.contains("Firefox"), "{}", other.message);
        let firefox =
            allowed_capabilities(&json!({"browserName": "firefox"}), EngineKind::Chromium)
                .unwrap_err();
        assert!(firefox.message.contains("Chromium"), "{}", firefox.message);
        let chrome_options = allowed_capabilities(
            &json!({"goog:chromeOptions": {"mobileEmulation": {}}}),
            EngineKind::Firefox,
        )
        .unwrap_err();
        assert_eq!(chrome_options.code, "invalid argument");
    }

    #[test]
    fn only_a_session_socket_of_firefoxs_own_is_relayed_to() {
        assert_eq!(
            socket_path("ws://127.0.0.1:40123/session/0b1c-77ad").as_deref(),
            Some("/session/0b1c-77ad")
        );
        for hostile in [
            "ws://127.0.0.1:40123/other",
            "ws://127.0.0.1:40123/session/",
            "ws://127.0.0.1:40123/session/../../json",
            "ws://127.0.0.1:40123/session/a?b",
            "http://127.0.0.1:40123/session/a",
            "ws://127.0.0.1:40123",
        ] {
            assert_eq!(socket_path(hostile), None, "{hostile}");
        }
    }

    #[test]
    fn errors_have_the_w3c_shape() {
        let error = WebDriverError::no_session("i-1");
        assert_eq!(error.status, 404);
        let body = error.body();
        assert_eq!(body["value"]["error"], "invalid session id");
        assert!(body["value"]["message"].as_str().unwrap().contains("i-1"));
        assert_eq!(body["value"]["stacktrace"], "");
    }
}

/// The `/webdriver/…` routes of the instance's HTTP port.
pub mod routes {
    use axum::Router;
    use axum::body::Bytes;
    use axum::extract::{DefaultBodyLimit, Path, State};
    use axum::http::{Method, StatusCode, header};
    use axum::response::{IntoResponse, Response};
    use axum::routing::{any, get, post};

    use super::*;
    use flotilla_api_types::webdriver_path::CommandPath;

    /// What the routes share: the instance, its front and its confinement.
    #[derive(Clone)]
    pub struct WebDriverState {
        pub slot: Arc<InstanceSlot>,
        pub webdriver: Arc<WebDriver>,
        pub isolation: Isolation,
        /// How long a command waits for the browser (a launch, or the wake
        /// of a parked instance).
        pub ready_timeout: Duration,
    }

    /// How the request was let in (`access::require_credential` puts it
    /// on every request of the instance's ports); a request without it is
    /// refused.
    #[derive(Clone, Copy)]
    struct Caller(Admission);

    impl<S: Send + Sync> axum::extract::FromRequestParts<S> for Caller {
        type Rejection = WebDriverError;

        async fn from_request_parts(
            parts: &mut axum::http::request::Parts,
            _: &S,
        ) -> Result<Self, Self::Rejection> {
            parts
                .extensions
                .get::<Admission>()
                .copied()
                .map(Caller)
                .ok_or_else(|| {
                    WebDriverError::new(500, "unknown error", "the request was not admitted")
                })
        }
    }

    /// The header by which the front door names the API key a session it
    /// starts is for (its SHA-256, hex); taken only from a request let in
    /// with the instance's token, which only the door holds besides the
    /// session's own client.
    const OWNER_HEADER: &str = "x-flotilla-webdriver-owner";

    /// The key a new session is for: the one that asked, or the one the
    /// door names.
    fn owner_of(Caller(admission): Caller, headers: &axum::http::HeaderMap) -> Option<[u8; 32]> {
        match admission {
            Admission::ApiKey(key) => Some(key),
            Admission::InstanceToken => headers
                .get(OWNER_HEADER)
                .and_then(|value| value.to_str().ok())
                .and_then(crate::protocols::access::parse_digest),
            Admission::Open => None,
        }
    }

    /// A request's body, or why it could not be read (too large: over the
    /// route's limit), answered as a W3C error.
    type Body = Result<Bytes, axum::extract::rejection::BytesRejection>;

    fn read(body: Body) -> Result<Bytes, WebDriverError> {
        body.map_err(|rejection| {
            WebDriverError::new(
                400,
                "invalid argument",
                format!(
                    "the request's body cannot be read: {}",
                    rejection.body_text()
                ),
            )
        })
    }

    /// The largest command body (a script with its arguments, keys to type).
    const MAX_COMMAND_BODY: usize = 16 << 20;

    pub fn router(state: WebDriverState) -> Router {
        Router::new()
            .route("/webdriver/session", post(new_session))
            .route("/webdriver/session/{id}", any(session))
            // Bounded while it arrives (`se_files::UploadReceiver`).
            .route("/webdriver/session/{id}/se/file", post(upload))
            // chromedriver's older name of the same (WebdriverIO uses it).
            .route("/webdriver/session/{id}/file", post(upload))
            .route(
                "/webdriver/session/{id}/se/files",
                get(downloads_list).post(download).delete(downloads_delete),
            )
            .route("/webdriver/session/{id}/se/bidi", get(bidi))
            .route("/webdriver/session/{id}/{*rest}", any(command))
            .layer(DefaultBodyLimit::max(MAX_COMMAND_BODY))
            .with_state(state)
    }

    /// The session `id` names this instance's, and it has one.
    async fn own_session(
        state: &WebDriverState,
        id: &str,
        Caller(admission): Caller,
    ) -> Result<(), WebDriverError> {
        if id == state.slot.id.as_str()
            && state.webdriver.has_session().await
            && state.webdriver.may_drive(admission).await
        {
            Ok(())
        } else {
            Err(WebDriverError::no_session(id))
        }
    }

    /// Runs one of [`crate::protocols::se_files`]'s file operations for session `id`
    /// off the async threads; its value as the W3C answer.
    async fn file_operation(
        state: &WebDriverState,
        (id, caller): (&str, Caller),
        operation: impl FnOnce(&InstanceDirs, &Isolation) -> Result<Value, WebDriverError>
        + Send
        + 'static,
    ) -> Response {
        if let Err(error) = own_session(state, id, caller).await {
            return error.into_response();
        }
        state.slot.touch();
        let Ok(_turn) = crate::protocols::se_files::RUNNING.acquire().await else {
            return WebDriverError::new(500, "unknown error", "the node is stopping")
                .into_response();
        };
        let (dirs, isolation) = (state.slot.dirs.clone(), state.isolation.clone());
        match tokio::task::spawn_blocking(move || operation(&dirs, &isolation)).await {
            Ok(Ok(value)) => axum::Json(json!({"value": value})).into_response(),
            Ok(Err(error)) => error.into_response(),
            Err(error) => {
                WebDriverError::new(500, "unknown error", error.to_string()).into_response()
            }
        }
    }

    /// [`file_operation`] on the request's `body`.
    async fn file_operation_on(
        state: &WebDriverState,
        (id, caller): (&str, Caller),
        body: Body,
        operation: impl FnOnce(&InstanceDirs, &Isolation, &[u8]) -> Result<Value, WebDriverError>
        + Send
        + 'static,
    ) -> Response {
        match read(body) {
            Ok(body) => {
                file_operation(state, (id, caller), move |dirs, isolation| {
                    operation(dirs, isolation, &body)
                })
                .await
            }
            Err(error) => error.into_response(),
        }
    }

    /// Grid's upload: the body is decoded as it arrives, never held whole
    /// ([`crate::protocols::se_files::UploadReceiver`]), then unpacked off the async
    /// threads.
    async fn upload(
        State(state): State<WebDriverState>,
        Path(id): Path<String>,
        caller: Caller,
        body: axum::body::Body,
    ) -> Response {
        if let Err(error) = own_session(&state, &id, caller).await {
            return error.into_response();
        }
        let zipped = match receive_upload(&state, body).await {
            Ok(zipped) => zipped,
            Err(error) => return error.into_response(),
        };
        file_operation(&state, (&id, caller), move |dirs, isolation| {
            crate::protocols::se_files::upload(dirs, isolation, zipped)
        })
        .await
    }

    async fn receive_upload(
        state: &WebDriverState,
        body: axum::body::Body,
    ) -> Result<std::fs::File, WebDriverError> {
        let mut receiver = crate::protocols::se_files::UploadReceiver::new(&state.slot.dirs)?;
        let mut body = body.into_data_stream();
        while let Some(piece) = futures_util::StreamExt::next(&mut body).await {
            let piece = piece.map_err(|e| {
                WebDriverError::new(
                    400,
                    "invalid argument",
                    format!("the request's body cannot be read: {e}"),
                )
            })?;
            state.slot.touch();
            receiver.feed(&piece)?;
        }
        receiver.finish()
    }

    async fn downloads_list(
        State(state): State<WebDriverState>,
        Path(id): Path<String>,
        caller: Caller,
    ) -> Response {
        file_operation(&state, (&id, caller), |dirs, _| {
            crate::protocols::se_files::list(dirs)
        })
        .await
    }

    async fn download(
        State(state): State<WebDriverState>,
        Path(id): Path<String>,
        caller: Caller,
        body: Body,
    ) -> Response {
        file_operation_on(&state, (&id, caller), body, |dirs, _, body| {
            crate::protocols::se_files::download(dirs, body)
        })
        .await
    }

    async fn downloads_delete(
        State(state): State<WebDriverState>,
        Path(id): Path<String>,
        caller: Caller,
    ) -> Response {
        file_operation(&state, (&id, caller), |dirs, _| {
            crate::protocols::se_files::delete_all(dirs)
        })
        .await
    }

    /// The session's WebDriver BiDi socket (the session asked for
    /// `webSocketUrl`): relayed to chromedriver's, the client's commands
    /// checked on the way (see [`crate::protocols::client_frames`]).
    async fn bidi(
        State(state): State<WebDriverState>,
        Path(id): Path<String>,
        caller: Caller,
        request: axum::extract::Request,
    ) -> Response {
        let relayed = async {
            own_session(&state, &id, caller).await?;
            let endpoint = browser(&state).await?;
            let (at, path) = state
                .webdriver
                .bidi_socket(&confinement(&state), &endpoint)
                .await?;
            let unreachable = |e: std::io::Error| {
                WebDriverError::new(500, "unknown error", format!("chromedriver: {e}"))
            };
            let upstream = at.connect().await.map_err(unreachable)?;
            let pins = crate::protocols::client_frames::Pins::new(
                crate::protocols::client_frames::Protocol::Bidi,
                state
                    .isolation
                    .browser_paths(&state.slot.dirs)
                    .downloads
                    .to_string_lossy()
                    .into_owned(),
            );
            crate::protocols::gateway::relay_websocket(
                request,
                (upstream, &at.authority(), &path),
                (state.slot.clone(), pins),
                tokio_util::sync::CancellationToken::new(),
            )
            .await
            .map_err(unreachable)
        };
        match relayed.await {
            Ok(response) => response.into_response(),
            Err(error) => error.into_response(),
        }
    }

    impl IntoResponse for WebDriverError {
        fn into_response(self) -> Response {
            let status =
                StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            (status, axum::Json(self.body())).into_response()
        }
    }

    /// The browser now (waking a parked instance with its windows back: a
    /// full restore), counting as activity.
    async fn browser(state: &WebDriverState) -> Result<CdpEndpoint, WebDriverError> {
        state.slot.touch();
        let full_restore = Some(flotilla_api_types::instances::ReviveMethod::FullRestore);
        match state
            .slot
            .wait_ready_reviving(state.ready_timeout, full_restore)
            .await
        {
            Ok(Some(endpoint)) => Ok(endpoint),
            Ok(None) => Err(WebDriverError::new(
                500,
                "unknown error",
                "a sim instance has no browser",
            )),
            Err(reason) => Err(WebDriverError::new(
                500,
                "unknown error",
                reason.to_string(),
            )),
        }
    }

    fn confinement(state: &WebDriverState) -> Confinement<'_> {
        Confinement {
            isolation: &state.isolation,
            dirs: &state.slot.dirs,
            slot: &state.slot,
        }
    }

    async fn new_session(
        State(state): State<WebDriverState>,
        caller: Caller,
        headers: axum::http::HeaderMap,
        body: Body,
    ) -> Response {
        let owner = owner_of(caller, &headers);
        let created = async {
            let body = read(body)?;
            let request: Value = serde_json::from_slice(&body).map_err(|e| {
                WebDriverError::new(
                    400,
                    "invalid argument",
                    format!("the body is not JSON: {e}"),
                )
            })?;
            let capabilities = request.get("capabilities").cloned().unwrap_or(json!({}));
            let endpoint = browser(&state).await?;
            state
                .webdriver
                .new_session(&confinement(&state), &endpoint, (capabilities, owner))
                .await
        };
        match created.await {
            Ok(value) => axum::Json(json!({"value": value})).into_response(),
            Err(error) => error.into_response(),
        }
    }

    /// `DELETE /session/{id}` ends it; anything else on the bare path is a
    /// command chromedriver answers.
    async fn session(
        State(state): State<WebDriverState>,
        Path(id): Path<String>,
        caller: Caller,
        method: Method,
        body: Body,
    ) -> Response {
        if id != state.slot.id.as_str() || !state.webdriver.may_drive(caller.0).await {
            return WebDriverError::no_session(&id).into_response();
        }
        if method == Method::DELETE {
            return if state.webdriver.delete_session().await {
                axum::Json(json!({"value": null})).into_response()
            } else {
                WebDriverError::no_session(&id).into_response()
            };
        }
        let session = CommandPath::parse("").expect("the session's own path");
        match read(body) {
            Ok(body) => pass_on(&state, (method, session, body)).await,
            Err(error) => error.into_response(),
        }
    }

    /// A command: its path checked as sent (see [`CommandPath`]), and sent
    /// on as it came.
    async fn command(
        State(state): State<WebDriverState>,
        Path((id, _)): Path<(String, String)>,
        caller: Caller,
        method: Method,
        uri: axum::http::Uri,
        body: Body,
    ) -> Response {
        if id != state.slot.id.as_str() || !state.webdriver.may_drive(caller.0).await {
            return WebDriverError::no_session(&id).into_response();
        }
        let rest = match command_path(&uri) {
            Ok(rest) => rest,
            Err(error) => return error.into_response(),
        };
        match read(body) {
            Ok(body) => pass_on(&state, (method, rest, body)).await,
            Err(error) => error.into_response(),
        }
    }

    /// What follows `/webdriver/session/{id}` in the request's path, as sent.
    fn command_path(uri: &axum::http::Uri) -> Result<CommandPath, WebDriverError> {
        let after_prefix = uri
            .path()
            .strip_prefix("/webdriver/session/")
            .unwrap_or_default();
        let raw = after_prefix.find('/').map_or("", |at| &after_prefix[at..]);
        CommandPath::parse(raw)
            .map_err(|error| WebDriverError::new(404, "unknown command", error.to_string()))
    }

    /// chromedriver's commands that send the browser any CDP command in
    /// another shape (`{"method", "params", "id"}`): refused.
    const REFUSED_COMMANDS: &[&str] = &["/chromium/send_command_from_websocket"];

    /// geckodriver's commands that reach past the pages: the chrome context
    /// (scripts with the browser's own privileges, which could unlock its
    /// preferences) and add-on installs. Refused, with why.
    const REFUSED_FIREFOX_COMMANDS: &[(&str, &str)] = &[
        (
            "/moz/context",
            "the chrome context runs scripts with the browser's own privileges; scripts run in pages",
        ),
        (
            "/moz/addon/install",
            "the browser takes no add-ons from sessions",
        ),
        (
            "/moz/addon/uninstall",
            "the browser takes no add-ons from sessions",
        ),
    ];

    /// chromedriver's commands that send the browser any CDP command
    /// (`{"cmd", "params"}`): Selenium's `execute_cdp_cmd` and its older forms.
    const RAW_CDP_COMMANDS: &[&str] = &[
        "/goog/cdp/execute",
        "/chromium/send_command",
        "/chromium/send_command_and_get_result",
    ];

    /// A raw CDP command's body with the gateway's pins applied (chromedriver
    /// reaches the browser directly, so the pins are applied here): as sent
    /// when they leave it alone, else written again from what was checked.
    fn pin_raw_cdp(body: Bytes, state: &WebDriverState) -> Result<Bytes, WebDriverError> {
        let downloads = state.isolation.browser_paths(&state.slot.dirs).downloads;
        match crate::protocols::client_frames::pin_carried_cdp_body(
            &body,
            &downloads.to_string_lossy(),
        ) {
            Ok(None) => Ok(body),
            Ok(Some(pinned)) => Ok(Bytes::from(pinned)),
            Err(error) => Err(WebDriverError::new(
                400,
                "invalid argument",
                format!("the body must be one JSON object {{\"cmd\", \"params\"}}: {error}"),
            )),
        }
    }

    async fn pass_on(
        state: &WebDriverState,
        (method, rest, body): (Method, CommandPath, Bytes),
    ) -> Response {
        if !state.webdriver.has_session().await {
            return WebDriverError::no_session(state.slot.id.as_str()).into_response();
        }
        // WebDriver has these three; chromedriver also reads PUT as POST
        // (and methods in any case), which would pass its raw CDP commands
        // by the pins below.
        if ![Method::GET, Method::POST, Method::DELETE].contains(&method) {
            return WebDriverError::new(
                405,
                "unknown method",
                format!("{method} is not a WebDriver method (GET, POST, DELETE)"),
            )
            .into_response();
        }
        if REFUSED_COMMANDS.iter().any(|refused| rest.is(refused)) {
            return WebDriverError::new(
                404,
                "unknown command",
                format!("{} is refused by Flotilla: use goog/cdp/execute (its commands get the front door's pins)", rest.raw()),
            )
            .into_response();
        }
        if let Some((_, why)) = REFUSED_FIREFOX_COMMANDS
            .iter()
            .find(|(refused, _)| rest.is(refused))
        {
            return WebDriverError::new(
                404,
                "unknown command",
                format!("{} is refused by Flotilla: {why}", rest.raw()),
            )
            .into_response();
        }
        let raw_cdp = RAW_CDP_COMMANDS.iter().any(|command| rest.is(command));
        let body = if method == Method::POST && raw_cdp {
            match pin_raw_cdp(body, state) {
                Ok(pinned) => pinned,
                Err(error) => return error.into_response(),
            }
        } else {
            body
        };
        let answered = async {
            let endpoint = browser(state).await?;
            state
                .webdriver
                .command(&confinement(state), &endpoint, (method, rest.raw(), body))
                .await
        };
        match answered.await {
            Ok((status, body)) => {
                let status = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY);
                (
                    status,
                    [(header::CONTENT_TYPE, "application/json; charset=utf-8")],
                    body,
                )
                    .into_response()
            }
            Err(error) => error.into_response(),
        }
    }
}
