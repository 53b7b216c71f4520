//! MCP's page steps on a Firefox instance, over WebDriver BiDi in a session
//! of the agent's own for each step (Firefox holds one session at a time,
//! so the step takes its turn like the agent's other work; a client's BiDi
//! session holds it off, a 409): Firefox's moves for the steps of
//! [`crate::protocols::page_steps`], which Chromium's share
//! ([`crate::protocols::page_ops`]).
//!
//! Firefox names its tabs anew in each session, so a tab is named by its
//! position (`1`, `2`, …, as `/tabs` names it), and has no accessibility
//! tree over BiDi: a snapshot is computed in the page
//! (`firefox_snapshot.js`), which keeps the references it hands out on the
//! document. A reference's number is new to the instance (the node counts
//! them in
//! [`crate::protocols::page_ops::References::handed_out`]), so one from a page that is
//! gone names nothing rather than another element. Input is BiDi's
//! `input.performActions` (trusted events); text is typed key by key.
//!
//! Console messages are not followed: that needs a session held between
//! steps, which would hold off every other client of the browser.

use std::sync::atomic::Ordering;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::time::Instant;

use flotilla_api_types::page::{AgentPageRequest, PageAnswer, PageOp, TabInfo};

use crate::engine::bidi::{BidiError, BidiSession};
use crate::engine::browser::CdpEndpoint;
use crate::engine::firefox::{by_position, read_tabs};
use crate::engine::firefox_view::key_value;
use crate::protocols::page_ops::{
    FOCUS_FOR_TYPING, MAX_NODES, MAX_TEXT, PageError, SELECT_OPTIONS, SETTLE_SCRIPT, SETTLE_WAIT,
    StepContext, WRITE_OUT, bounded_text, node_of, place_uploads, render_tree, selected,
    takes_text, text_wait_script, unknown_key, waiting_for,
};
use crate::protocols::page_steps::{PageDriver, Point, drag_moves, run_step};

/// The snapshot script (see the module).
const SNAPSHOT_SCRIPT: &str = include_str!("firefox_snapshot.js");

/// The element a reference number names in the page's registry (kept by
/// [`SNAPSHOT_SCRIPT`]), or `null` when it is gone or out of the document.
const FIND_ELEMENT: &str = "(number) => { const refs = document[Symbol.for('flotilla.refs')]; const held = refs && refs.byRef instanceof Map ? refs.byRef.get(number) : undefined; const element = held && held.deref(); return element && element.isConnected ? element : null; }";

/// Called on an element: scrolls it into view and answers its first box's
/// middle in the viewport (`null` when it has no box).
const CENTER_OF: &str = "function() { this.scrollIntoView({block: 'center', inline: 'center', behavior: 'instant'}); const box = this.getClientRects()[0]; return box && (box.width > 0 || box.height > 0) ? [box.left + box.width / 2, box.top + box.height / 2] : null; }";

/// Most characters `browser_type` types key by key.
const MAX_TYPED_CHARS: usize = 10_000;

/// Keys sent in one `input.performActions` (the step's time is checked
/// between two such runs).
const KEYS_PER_COMMAND: usize = 200;

/// Longest answer (JSON text) the page's snapshot may give: the page's own
/// script could answer anything, so what it answers is bounded before it
/// is read.
const MAX_SNAPSHOT_JSON: usize = 16 << 20;

/// Longest answer of a call on an element (a box, a count, a flag).
const MAX_ELEMENT_JSON: usize = 64 << 10;

/// What Firefox's steps do not take, named before the browser is touched.
fn refuse_what_firefox_lacks(op: &PageOp) -> Result<(), PageError> {
    match op {
        PageOp::ConsoleMessages => Err(console_refused()),
        _ => Ok(()),
    }
}

fn console_refused() -> PageError {
    PageError::NotInFirefox {
        step: "browser_console_messages",
        why: "its console is read over a WebDriver session held between steps, and Firefox holds one session at a time (a held one would keep every other client out)",
    }
}

/// Runs `request` on the Firefox at `endpoint`, within its `timeout_ms`:
/// the step's session ends however the step ends.
pub async fn run(
    endpoint: &CdpEndpoint,
    request: &AgentPageRequest,
    context: StepContext<'_>,
) -> Result<PageAnswer, PageError> {
    refuse_what_firefox_lacks(&request.op)?;
    let deadline = Instant::now() + Duration::from_millis(request.timeout_ms.max(1));
    let session = open_within(endpoint, deadline).await?;
    let mut step = Step {
        session,
        deadline,
        context: &context,
    };
    let outcome = tokio::time::timeout_at(deadline, run_step(&mut step, request)).await;
    step.session.end().await;
    outcome.unwrap_or(Err(PageError::Timeout("the step")))
}

/// A session of the agent's own by `deadline`. One still starting then is
/// ended once it has started (Firefox would keep it, and with it the
/// browser's only session).
async fn open_within(endpoint: &CdpEndpoint, deadline: Instant) -> Result<BidiSession, PageError> {
    let endpoint = endpoint.clone();
    let mut opening = tokio::spawn(async move { BidiSession::open(&endpoint).await });
    match tokio::time::timeout_at(deadline, &mut opening).await {
        Ok(Ok(opened)) => Ok(opened?),
        Ok(Err(_)) => Err(PageError::Firefox(BidiError::Closed)),
        Err(_) => {
            tokio::spawn(async move {
                if let Ok(Ok(session)) = opening.await {
                    session.end().await;
                }
            });
            Err(PageError::Timeout(
                "waiting for the browser's WebDriver session",
            ))
        }
    }
}

struct Step<'a> {
    session: BidiSession,
    deadline: Instant,
    context: &'a StepContext<'a>,
}

/// A tab the step acts on: its position (its id for the agent) and its
/// context in this session.
struct Tab {
    id: String,
    context: String,
}

/// What a page script answered: its value (JSON), or what it threw.
enum Scripted {
    Value(Value),
    Threw(String),
}

impl PageDriver for Step<'_> {
    type Tab = Tab;

    fn id_of(tab: &Tab) -> &str {
        &tab.id
    }

    fn remaining(&self) -> Duration {
        self.deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1))
    }

    fn dirs(&self) -> &crate::system::dirs::InstanceDirs {
        self.context.dirs
    }

    /// Refused before a session is opened ([`refuse_what_firefox_lacks`]).
    fn console(&self) -> Result<String, PageError> {
        Err(console_refused())
    }

    async fn tabs(&mut self) -> Result<Vec<TabInfo>, PageError> {
        Ok(self
            .tabs_with_contexts()
            .await?
            .into_iter()
            .map(|(_, tab)| tab)
            .collect())
    }

    async fn tab_for(&mut self, request: &AgentPageRequest) -> Result<Tab, PageError> {
        let tab = match &request.op {
            PageOp::TabSelect { tab } => {
                let tab = self.find_tab(tab).await?;
                let activate = json!({"context": tab.context});
                self.session
                    .call("browsingContext.activate", activate)
                    .await?;
                tab
            }
            _ => self.current_tab(request.tab.as_deref()).await?,
        };
        self.dismiss_dialog(&tab).await;
        Ok(tab)
    }

    async fn current_id(&mut self, wanted: Option<&str>) -> Result<String, PageError> {
        Ok(self.current_tab(wanted).await?.id)
    }

    async fn open_tab(&mut self) -> Result<Tab, PageError> {
        let created = self
            .session
            .call("browsingContext.create", json!({"type": "tab"}))
            .await?;
        let context = created["context"].as_str().unwrap_or_default().to_owned();
        let position = self
            .tabs_with_contexts()
            .await?
            .into_iter()
            .find(|(of, _)| *of == context)
            .map(|(_, tab)| tab.id)
            .unwrap_or_default();
        Ok(Tab {
            id: position,
            context,
        })
    }

    async fn close_tab(&mut self, id: &str) -> Result<Vec<TabInfo>, PageError> {
        let tabs = self.tabs_with_contexts().await?;
        let Some((context, _)) = tabs.iter().find(|(_, info)| info.id == id) else {
            return Err(PageError::NoTab(id.to_owned()));
        };
        if tabs.len() == 1 {
            return Err(PageError::BadInput(format!(
                "tab {id} is the browser's only tab, which Firefox keeps open: navigate it elsewhere instead"
            )));
        }
        let close = json!({"context": context});
        self.session.call("browsingContext.close", close).await?;
        self.tabs().await
    }

    async fn screenshot(&mut self, tab: &Tab) -> Result<Option<String>, PageError> {
        let shot = self
            .session
            .call(
                "browsingContext.captureScreenshot",
                json!({"context": tab.context, "origin": "viewport"}),
            )
            .await?;
        Ok(shot["data"].as_str().map(str::to_owned))
    }

    async fn navigate(&mut self, tab: &Tab, url: &str) -> Result<(), PageError> {
        let navigate = json!({"context": tab.context, "url": url, "wait": "complete"});
        let within = self.remaining();
        match self
            .session
            .call_within("browsingContext.navigate", navigate, within)
            .await
        {
            Ok(_) => Ok(()),
            Err(BidiError::Command { message, .. }) => Err(PageError::Navigation {
                url: url.to_owned(),
                reason: message,
            }),
            Err(other) => Err(other.into()),
        }
    }

    async fn back(&mut self, tab: &Tab) -> Result<(), PageError> {
        let back = json!({"context": tab.context, "delta": -1});
        match self
            .session
            .call("browsingContext.traverseHistory", back)
            .await
        {
            Err(BidiError::Command { error, .. }) if error == "no such history entry" => Err(
                PageError::BadInput("the tab has no earlier page to go back to".into()),
            ),
            other => other.map(|_| ()).map_err(PageError::from),
        }?;
        self.settle(tab).await;
        Ok(())
    }

    /// Waits (briefly, never failing) for what an action started: a
    /// navigation to commit and its document to load.
    async fn settle(&mut self, tab: &Tab) {
        for _ in 0..3 {
            let within = self.remaining().min(SETTLE_WAIT);
            let evaluate = json!({
                "expression": SETTLE_SCRIPT, "target": {"context": tab.context}, "awaitPromise": true,
            });
            let settled = self
                .session
                .call_within("script.evaluate", evaluate, within)
                .await;
            if settled.is_ok_and(|answer| answer["type"] == "success") {
                return;
            }
        }
    }

    /// URL and title of the tab.
    async fn describe_page(&mut self, tab: &Tab) -> Result<String, PageError> {
        let (url, title) = self
            .tabs_with_contexts()
            .await?
            .into_iter()
            .find(|(context, _)| *context == tab.context)
            .map(|(_, info)| (info.url, info.title))
            .unwrap_or_default();
        Ok(format!(
            "- Page URL: {url}\n- Page title: {title}\n- Tab: {}\n",
            tab.id
        ))
    }

    /// The page as an accessibility tree computed in the page, its
    /// references new ones counted on from the instance's next.
    async fn snapshot(&mut self, tab: &Tab) -> Result<String, PageError> {
        let handed_out = &self.context.references.handed_out;
        let next = handed_out.load(Ordering::SeqCst) + 1;
        let arguments = json!([
            {"type": "number", "value": next},
            {"type": "number", "value": MAX_NODES + 1},
        ]);
        let called = self
            .call_function(tab, SNAPSHOT_SCRIPT, arguments, MAX_SNAPSHOT_JSON)
            .await?;
        let snapshot = match called {
            Scripted::Value(value) => value,
            Scripted::Threw(text) => {
                return Err(PageError::Firefox(BidiError::Command {
                    method: "script.callFunction".into(),
                    error: "the snapshot failed in the page".into(),
                    message: text,
                }));
            }
        };
        // The page says how far it counted: at most one number a node.
        if let Some(counted) = snapshot["next"].as_u64() {
            let counted = counted.clamp(next, next + MAX_NODES as u64 + 1);
            handed_out.fetch_max(counted - 1, Ordering::SeqCst);
        }
        let mut text = self.describe_page(tab).await?;
        text.push_str("- Page snapshot:\n");
        text.push_str(&render_tree(
            snapshot["nodes"].as_array().map_or(&[][..], Vec::as_slice),
            &mut |number| number,
        ));
        Ok(bounded_text(text))
    }

    /// The middle of `element`'s first box, scrolled into view.
    async fn center_of(&mut self, tab: &Tab, element: &str) -> Result<(f64, f64), PageError> {
        let center = self.on_element(tab, element, CENTER_OF, json!([])).await?;
        match (center[0].as_f64(), center[1].as_f64()) {
            (Some(x), Some(y)) => Ok((x, y)),
            _ => Err(PageError::BadInput(format!(
                "element {element} is not visible (it has no box on the page)"
            ))),
        }
    }

    async fn click_at(&mut self, tab: &Tab, (x, y): Point, clicks: u32) -> Result<(), PageError> {
        let mut actions = vec![pointer_move(x, y)];
        for _ in 0..clicks {
            actions.push(json!({"type": "pointerDown", "button": 0}));
            actions.push(json!({"type": "pointerUp", "button": 0}));
        }
        self.pointer(tab, actions).await
    }

    async fn move_to(&mut self, tab: &Tab, (x, y): Point) -> Result<(), PageError> {
        self.pointer(tab, vec![pointer_move(x, y)]).await
    }

    async fn drag_between(&mut self, tab: &Tab, from: Point, to: Point) -> Result<(), PageError> {
        let mut actions = vec![
            pointer_move(from.0, from.1),
            json!({"type": "pointerDown", "button": 0}),
        ];
        actions.extend(drag_moves(from, to).map(|(x, y)| pointer_move(x, y)));
        actions.push(json!({"type": "pointerUp", "button": 0}));
        self.pointer(tab, actions).await
    }

    /// Focuses `element`, selects its text and types `text` over it key by
    /// key (then Enter when `submit`).
    async fn type_into(
        &mut self,
        tab: &Tab,
        element: &str,
        text: &str,
        submit: bool,
    ) -> Result<(), PageError> {
        let mut values = typed_keys(text)?;
        let editable = self
            .on_element(tab, element, FOCUS_FOR_TYPING, json!([]))
            .await?;
        takes_text(element, &editable)?;
        if submit {
            values.push('\u{E007}'.to_string());
        }
        self.keys(tab, &values).await
    }

    async fn press(&mut self, tab: &Tab, key: &str) -> Result<(), PageError> {
        let named = if key == "Space" { " " } else { key };
        let value = key_value(named).ok_or_else(|| unknown_key(key))?;
        self.keys(tab, &[value]).await
    }

    async fn select(
        &mut self,
        tab: &Tab,
        element: &str,
        values: &[String],
    ) -> Result<(), PageError> {
        let chosen = self
            .on_element(tab, element, SELECT_OPTIONS, json!([values]))
            .await?;
        selected(element, values, &chosen)
    }

    async fn wait_for_text(
        &mut self,
        tab: &Tab,
        wanted: &str,
        present: bool,
    ) -> Result<(), PageError> {
        let evaluate = json!({
            "expression": text_wait_script(wanted, present),
            "target": {"context": tab.context}, "awaitPromise": true,
        });
        let within = self.remaining();
        self.session
            .call_within("script.evaluate", evaluate, within)
            .await
            .map_err(|error| match error {
                BidiError::Timeout(_) => PageError::Timeout(waiting_for(present)),
                other => PageError::from(other),
            })?;
        Ok(())
    }

    /// `expression`'s value (a promise awaited) as JSON text, at most
    /// [`MAX_TEXT`] long: an object is written out by the page itself and
    /// cut there, as in Chromium.
    async fn evaluate_text(&mut self, tab: &Tab, expression: &str) -> Result<String, PageError> {
        let evaluate = json!({
            "expression": expression, "target": {"context": tab.context},
            "awaitPromise": true, "resultOwnership": "root",
            "serializationOptions": {"maxObjectDepth": 0, "maxDomDepth": 0},
        });
        let evaluated = self.session.call("script.evaluate", evaluate).await?;
        if evaluated["type"] == "exception" {
            return Err(PageError::BadInput(format!(
                "the expression threw: {}",
                evaluated["exceptionDetails"]["text"]
                    .as_str()
                    .unwrap_or_default()
            )));
        }
        let result = &evaluated["result"];
        let text = match result["handle"].as_str() {
            Some(handle) => self.write_out(tab, handle).await?,
            None => primitive_text(result),
        };
        Ok(bounded_text(text))
    }

    /// Sets `files` (placed in the instance's uploads first) on the file
    /// input `element` names.
    async fn upload(
        &mut self,
        tab: &Tab,
        element: &str,
        files: &[flotilla_api_types::page::UploadFile],
    ) -> Result<(), PageError> {
        let paths = place_uploads(self.context, files)?;
        let number = node_of(element)?;
        let call = json!({
            "functionDeclaration": FIND_ELEMENT,
            "arguments": [{"type": "number", "value": number}],
            "target": {"context": tab.context}, "awaitPromise": false,
        });
        let found = self.session.call("script.callFunction", call).await?;
        let Some(shared) = found["result"]["sharedId"].as_str() else {
            return Err(PageError::StaleElement(element.to_owned()));
        };
        let set = json!({"context": tab.context, "element": {"sharedId": shared}, "files": paths});
        self.session
            .call("input.setFiles", set)
            .await
            .map_err(|error| match error {
                BidiError::Command { message, .. } => PageError::BadInput(format!(
                    "element {element} takes no files: {message} (use a file input's reference)"
                )),
                other => PageError::from(other),
            })?;
        Ok(())
    }
}

impl Step<'_> {
    /// The browser's tabs by position, each with its context.
    async fn tabs_with_contexts(&mut self) -> Result<Vec<(String, TabInfo)>, PageError> {
        let tabs = read_tabs(&mut self.session).await?;
        Ok(by_position(tabs)
            .into_iter()
            .map(|(context, tab)| {
                let info = TabInfo {
                    id: tab.id,
                    url: tab.url,
                    title: tab.title,
                };
                (context, info)
            })
            .collect())
    }

    async fn find_tab(&mut self, id: &str) -> Result<Tab, PageError> {
        self.tabs_with_contexts()
            .await?
            .into_iter()
            .find(|(_, tab)| tab.id == id)
            .map(|(context, tab)| Tab {
                id: tab.id,
                context,
            })
            .ok_or_else(|| PageError::NoTab(id.to_owned()))
    }

    /// `wanted` if there is such a tab, else the first (a new one when the
    /// browser has none).
    async fn current_tab(&mut self, wanted: Option<&str>) -> Result<Tab, PageError> {
        let tabs = self.tabs_with_contexts().await?;
        let chosen = wanted
            .and_then(|wanted| tabs.iter().find(|(_, tab)| tab.id == wanted))
            .or(tabs.first());
        if let Some((context, tab)) = chosen {
            return Ok(Tab {
                id: tab.id.clone(),
                context: context.clone(),
            });
        }
        let created = self
            .session
            .call("browsingContext.create", json!({"type": "tab"}))
            .await?;
        Ok(Tab {
            id: "1".into(),
            context: created["context"].as_str().unwrap_or_default().to_owned(),
        })
    }

    /// Dismisses a dialog the page left open (one opened while a step runs
    /// is dismissed by Firefox itself).
    async fn dismiss_dialog(&mut self, tab: &Tab) {
        let dismiss = json!({"context": tab.context, "accept": false});
        let _ = self
            .session
            .call("browsingContext.handleUserPrompt", dismiss)
            .await;
    }

    /// Calls `declaration` in the page with `arguments` (BiDi values): its
    /// value (awaited) as JSON, of at most `limit` bytes.
    async fn call_function(
        &mut self,
        tab: &Tab,
        declaration: &str,
        arguments: Value,
        limit: usize,
    ) -> Result<Scripted, PageError> {
        let wrapped = format!("async (...args) => JSON.stringify(await ({declaration})(...args))");
        let call = json!({
            "functionDeclaration": wrapped, "arguments": arguments,
            "target": {"context": tab.context}, "awaitPromise": true,
        });
        let called = self.session.call("script.callFunction", call).await?;
        scripted(&called, limit)
    }

    /// Calls `function` on the element `element` names with `arguments` (a
    /// JSON array): its value.
    async fn on_element(
        &mut self,
        tab: &Tab,
        element: &str,
        function: &str,
        arguments: Value,
    ) -> Result<Value, PageError> {
        let number = node_of(element)?;
        let declaration = format!(
            "(number, args) => {{ const element = ({FIND_ELEMENT})(number); return element ? {{value: ({function}).apply(element, JSON.parse(args))}} : {{gone: true}}; }}"
        );
        let arguments = json!([
            {"type": "number", "value": number},
            {"type": "string", "value": arguments.to_string()},
        ]);
        let called = self
            .call_function(tab, &declaration, arguments, MAX_ELEMENT_JSON)
            .await?;
        match called {
            Scripted::Value(answer) if answer["gone"] == true => {
                Err(PageError::StaleElement(element.to_owned()))
            }
            Scripted::Value(answer) => Ok(answer["value"].clone()),
            Scripted::Threw(text) => Err(PageError::BadInput(text)),
        }
    }

    /// Performs a mouse's `actions` in the tab.
    async fn pointer(&mut self, tab: &Tab, actions: Vec<Value>) -> Result<(), PageError> {
        let source = json!({
            "type": "pointer", "id": "flotilla-mcp-mouse",
            "parameters": {"pointerType": "mouse"}, "actions": actions,
        });
        self.perform(tab, source).await
    }

    /// Presses and releases each of `values` (WebDriver key values), a run
    /// of [`KEYS_PER_COMMAND`] at a time while the step has time.
    async fn keys(&mut self, tab: &Tab, values: &[String]) -> Result<(), PageError> {
        for run in values.chunks(KEYS_PER_COMMAND) {
            if Instant::now() >= self.deadline {
                return Err(PageError::Timeout("typing"));
            }
            let actions: Vec<Value> = run
                .iter()
                .flat_map(|value| {
                    [
                        json!({"type": "keyDown", "value": value}),
                        json!({"type": "keyUp", "value": value}),
                    ]
                })
                .collect();
            let source = json!({"type": "key", "id": "flotilla-mcp-keys", "actions": actions});
            self.perform(tab, source).await?;
        }
        Ok(())
    }

    async fn perform(&mut self, tab: &Tab, source: Value) -> Result<(), PageError> {
        let perform = json!({"context": tab.context, "actions": [source]});
        let within = self.remaining();
        let performed = self
            .session
            .call_within("input.performActions", perform, within)
            .await;
        match performed {
            Err(BidiError::Command { error, .. }) if error == "move target out of bounds" => {
                Err(PageError::BadInput(
                    "the element's middle is outside the viewport (in a scrolled or clipped box): take a new snapshot, or scroll it into view".into(),
                ))
            }
            other => other.map(drop).map_err(PageError::from),
        }
    }

    /// The object behind `handle` as the page writes it out ([`WRITE_OUT`]),
    /// the handle let go of after.
    async fn write_out(&mut self, tab: &Tab, handle: &str) -> Result<String, PageError> {
        let call = json!({
            "functionDeclaration": WRITE_OUT, "this": {"handle": handle},
            "arguments": [{"type": "number", "value": MAX_TEXT + 1}],
            "target": {"context": tab.context}, "awaitPromise": false,
        });
        let written = self.session.call("script.callFunction", call).await;
        let disown = json!({"handles": [handle], "target": {"context": tab.context}});
        let _ = self.session.call("script.disown", disown).await;
        Ok(written?["result"]["value"]
            .as_str()
            .unwrap_or("undefined")
            .to_owned())
    }
}

/// A pointer move to `(x, y)` in the viewport's CSS pixels.
fn pointer_move(x: f64, y: f64) -> Value {
    json!({"type": "pointerMove", "x": x, "y": y})
}

/// What `script.callFunction` answered for a function whose value is JSON
/// text.
fn scripted(called: &Value, limit: usize) -> Result<Scripted, PageError> {
    if called["type"] == "exception" {
        let text = called["exceptionDetails"]["text"]
            .as_str()
            .unwrap_or_default();
        return Ok(Scripted::Threw(text.to_owned()));
    }
    let json = called["result"]["value"].as_str().unwrap_or("null");
    if json.len() > limit {
        return Err(PageError::BadInput(format!(
            "the page answered more than {limit} bytes where a script of the node's expected less (the page's own script changed what it reads)"
        )));
    }
    serde_json::from_str(json)
        .map(Scripted::Value)
        .map_err(|error| PageError::BadInput(format!("the page answered no JSON: {error}")))
}

/// The keys that type `text`: each character itself, a line break as Enter
/// and a tab as Tab. Characters of the private-use range (WebDriver names
/// its keys with them) are refused, and so is a text past
/// [`MAX_TYPED_CHARS`].
fn typed_keys(text: &str) -> Result<Vec<String>, PageError> {
    if text.chars().count() > MAX_TYPED_CHARS {
        return Err(PageError::BadInput(format!(
            "text is longer than the {MAX_TYPED_CHARS} characters Firefox types key by key: type it in parts"
        )));
    }
    text.chars()
        .filter(|c| *c != '\r')
        .map(|c| match c {
            '\n' => Ok('\u{E007}'.to_string()),
            '\t' => Ok('\u{E004}'.to_string()),
            c if ('\u{E000}'..='\u{F8FF}').contains(&c) => Err(PageError::BadInput(format!(
                "text holds U+{:04X}, of the private-use range that WebDriver names keys with: Firefox cannot type it",
                u32::from(c)
            ))),
            c => Ok(c.to_string()),
        })
        .collect()
}

/// A BiDi primitive value as the agent reads it (JSON, as Chromium's step
/// answers it).
fn primitive_text(result: &Value) -> String {
    let value = &result["value"];
    match result["type"].as_str().unwrap_or_default() {
        "undefined" => "undefined".into(),
        "null" => "null".into(),
        "bigint" => format!("{}n", value.as_str().unwrap_or_default()),
        // NaN, -0 and the infinities come as their names.
        "number" if value.is_string() => value.as_str().unwrap_or_default().to_owned(),
        _ => serde_json::to_string_pretty(value).unwrap_or_default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_typed_key_by_key_and_keys_of_webdriver_are_refused() {
        assert_eq!(
            typed_keys("a b\r\nc\t").unwrap(),
            ["a", " ", "b", "\u{E007}", "c", "\u{E004}"]
        );
        let refused = typed_keys("x\u{E007}").unwrap_err().to_string();
        assert!(refused.contains("U+E007"), "{refused}");
        let long = "a".repeat(MAX_TYPED_CHARS + 1);
        assert!(typed_keys(&long).unwrap_err().to_string().contains("parts"));
        assert_eq!(
            typed_keys(&"é".repeat(MAX_TYPED_CHARS)).unwrap().len(),
            MAX_TYPED_CHARS
        );
    }

    #[test]
    fn primitives_read_as_chromium_answers_them() {
        for (value, text) in [
            (json!({"type": "string", "value": "Hello"}), "\"Hello\""),
            (json!({"type": "number", "value": 42}), "42"),
            (json!({"type": "number", "value": "NaN"}), "NaN"),
            (json!({"type": "boolean", "value": true}), "true"),
            (json!({"type": "undefined"}), "undefined"),
            (json!({"type": "null"}), "null"),
            (json!({"type": "bigint", "value": "12"}), "12n"),
        ] {
            assert_eq!(primitive_text(&value), text, "{value}");
        }
    }

    #[test]
    fn the_console_is_refused_by_name() {
        let refused = refuse_what_firefox_lacks(&PageOp::ConsoleMessages).unwrap_err();
        assert!(refused.to_string().contains("browser_console_messages"));
        assert!(refuse_what_firefox_lacks(&PageOp::Snapshot).is_ok());
    }

    #[test]
    fn a_page_scripts_answer_is_its_json_or_what_it_threw() {
        let value = json!({"type": "success", "result": {"type": "string", "value": "{\"a\":1}"}});
        assert!(
            matches!(scripted(&value, 100).unwrap(), Scripted::Value(v) if v == json!({"a": 1}))
        );
        assert!(
            scripted(&value, 3).is_err(),
            "an answer past its bound is not read"
        );
        let threw = json!({"type": "exception", "exceptionDetails": {"text": "Error: no"}});
        assert!(matches!(scripted(&threw, 100).unwrap(), Scripted::Threw(t) if t == "Error: no"));
        let undefined = json!({"type": "success", "result": {"type": "undefined"}});
        assert!(matches!(
            scripted(&undefined, 100).unwrap(),
            Scripted::Value(Value::Null)
        ));
    }
}
