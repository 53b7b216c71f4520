//! A Playwright connection that gets an instance of its own
//! (`GET /v2/playwright`): its options read from the query and the
//! `flotilla-options` header into a create body ([`ConnectOptions`]), and
//! its instance's life ([`ControlPlane::playwright_connect`]): made through
//! the normal path (placement, wait queue, warm pool, sandbox, events),
//! handed to the relay, and deleted when the connection ends unless `keep`.
//! The relay itself (the WebSocket to the instance's Playwright server) is
//! the HTTP layer's.

use std::future::Future;
use std::sync::Arc;

use serde_json::{Map, Value};

use flotilla_api_types::InstanceId;
use flotilla_api_types::instances::CreateInstanceRequest;

use super::held_instances::HeldFor;
use super::{ControlPlane, DoorTarget, Scope};
use crate::error::{Error, Result};

/// The largest `flotilla-options` header, and the longest query.
const MAX_OPTIONS: usize = 64 << 10;
/// The deepest dotted name (`config.proxy.server` is three).
const MAX_NAME_DEPTH: usize = 4;

/// What a connection asks for.
#[derive(Debug, Clone)]
pub struct ConnectOptions {
    pub create: CreateInstanceRequest,
    /// Keep the instance after the client disconnects.
    pub keep: bool,
    /// Seconds to wait in the create queue for room.
    pub wait_sec: u64,
}

impl ConnectOptions {
    /// Reads the `flotilla-options` header (`header`) and the query.
    pub fn read(header: Option<&[u8]>, query: Option<&str>) -> Result<Self> {
        let invalid = |why: String| Error::InvalidRequest(why);
        let mut body = match header {
            Some(bytes) if bytes.len() > MAX_OPTIONS => {
                return Err(invalid(format!(
                    "the flotilla-options header is over {MAX_OPTIONS} bytes"
                )));
            }
            Some(bytes) => match serde_json::from_slice::<Value>(bytes) {
                Ok(Value::Object(body)) => body,
                Ok(_) => {
                    return Err(invalid(
                        "flotilla-options must be a JSON object (the create body)".into(),
                    ));
                }
                Err(error) => {
                    return Err(invalid(format!("flotilla-options is not JSON: {error}")));
                }
            },
            None => Map::new(),
        };
        let query = query.unwrap_or("");
        if query.len() > MAX_OPTIONS {
            return Err(invalid(format!("the query is over {MAX_OPTIONS} bytes")));
        }
        let (mut keep, mut wait_sec) = (false, 0);
        for (name, value) in form_urlencoded::parse(query.as_bytes()) {
            match name.as_ref() {
                "token" => {}
                "keep" => {
                    keep = value.parse().map_err(|_| {
                        invalid(format!("keep must be true or false (got {value:?})"))
                    })?;
                }
                "wait_sec" => {
                    wait_sec = value.parse().map_err(|_| {
                        invalid(format!("wait_sec must be an integer (got {value:?})"))
                    })?;
                }
                _ => set_option(&mut body, &name, &value)?,
            }
        }
        let create = serde_json::from_value(Value::Object(body))
            .map_err(|error| invalid(format!("the instance's options: {error}")))?;
        Ok(Self {
            create,
            keep,
            wait_sec,
        })
    }
}

/// Sets `name` (`image`, or a dotted path such as `config.record`) in the
/// create body to `value`, read as JSON where it parses, else as a string.
fn set_option(body: &mut Map<String, Value>, name: &str, value: &str) -> Result<()> {
    let invalid = |why: String| Error::InvalidRequest(why);
    if name.split('.').count() > MAX_NAME_DEPTH {
        return Err(invalid(format!(
            "{name:?} is not an option (at most {MAX_NAME_DEPTH} names deep)"
        )));
    }
    let parsed = serde_json::from_str(value).unwrap_or_else(|_| Value::String(value.to_owned()));
    let mut keys = name.split('.').peekable();
    let mut at = body;
    while let Some(key) = keys.next() {
        if key.is_empty() {
            return Err(invalid(format!("{name:?} is not an option")));
        }
        if keys.peek().is_none() {
            at.insert(key.to_owned(), parsed);
            return Ok(());
        }
        let next = at
            .entry(key.to_owned())
            .or_insert_with(|| Value::Object(Map::new()));
        at = next.as_object_mut().ok_or_else(|| {
            invalid(format!(
                "{name:?}: {key} is given as a value and as an object"
            ))
        })?;
    }
    Err(invalid(format!("{name:?} is not an option")))
}

/// What the relay made of a connection: its answer to the client, whether
/// the connection was upgraded, and what resolves when it ends (at once
/// when it was not upgraded).
pub struct Relayed<R> {
    pub answer: R,
    pub upgraded: bool,
    pub ended: tokio::sync::oneshot::Receiver<()>,
}

impl ControlPlane {
    /// Makes the connection's instance for `scope` and hands it to `relay`;
    /// answers the relay's answer. The instance is made, reached and
    /// deleted by a task of its own: a client that leaves while it is made
    /// (the caller's future dropped) leaves no instance behind.
    pub async fn playwright_connect<R, F, Relay>(
        self: &Arc<Self>,
        options: ConnectOptions,
        scope: Scope,
        relay: F,
    ) -> Result<R>
    where
        R: Send + 'static,
        F: FnOnce(DoorTarget) -> Relay + Send + 'static,
        Relay: Future<Output = Relayed<R>> + Send,
    {
        let (answer, answered) = tokio::sync::oneshot::channel();
        let connection = self.clone();
        self.tasks().spawn("playwright connection", async move {
            let (id, target) = match connection.playwright_instance(&options, &scope).await {
                Ok(made) => made,
                Err(error) => {
                    let _ = answer.send(Err(error));
                    return;
                }
            };
            let relayed = relay(target).await;
            let delivered = answer.send(Ok(relayed.answer)).is_ok();
            if delivered && relayed.upgraded {
                if options.keep {
                    connection.instance_let_go(&id).await;
                    return;
                }
                // Sent never: resolves when the relay ends.
                let _ = relayed.ended.await;
            }
            if let Err(error) = connection.held_instance_delete(&id).await {
                tracing::warn!(instance = %id, %error, "cannot delete a Playwright connection's instance; the held instance takeover tries again");
            }
        });
        answered
            .await
            .map_err(|_| Error::InsufficientCapacity("the control plane is stopping".into()))?
    }

    /// The connection's new instance (held by this control plane until
    /// the connection ends: another deletes it if this one stops), and
    /// where its ports are; deleted again when it cannot be reached.
    async fn playwright_instance(
        &self,
        options: &ConnectOptions,
        scope: &Scope,
    ) -> Result<(InstanceId, DoorTarget)> {
        let instance = self
            .instance_create_waiting(options.create.clone(), options.wait_sec, scope)
            .await?;
        let id = instance.id;
        self.instance_hold(&id, HeldFor::Playwright).await;
        match self.door_open(&id, Some((scope, None)), &[]).await {
            Ok(target) => Ok((id, target)),
            Err(error) => {
                let _ = self.held_instance_delete(&id).await;
                Err(error)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_come_from_the_query_and_the_header() {
        let options = ConnectOptions::read(
            Some(br#"{"image": "chromium", "config": {"record": true}}"#),
            Some("token=k&keep=true&wait_sec=5&image=chromium-headless-shell&config.max_duration_minutes=5&config.proxy=%7B%22server%22%3A%22http%3A%2F%2Fp%3A1%22%7D"),
        )
        .unwrap();
        assert!(options.keep);
        assert_eq!(options.wait_sec, 5);
        assert_eq!(
            options.create.image.as_deref(),
            Some("chromium-headless-shell")
        );
        let config = options.create.config.unwrap();
        assert!(config.record);
        assert_eq!(config.max_duration_minutes, Some(5.0));
        assert!(config.proxy.is_some());
        let none = ConnectOptions::read(None, None).unwrap();
        assert!(none.create.image.is_none() && none.create.config.is_none());
        assert!(!none.keep);
    }

    #[test]
    fn bad_options_are_refused_naming_them() {
        let refused =
            |header: Option<&[u8]>, query: &str| match ConnectOptions::read(header, Some(query)) {
                Err(Error::InvalidRequest(why)) => why,
                other => panic!("{query}: {other:?}"),
            };
        assert!(refused(None, "colour=blue").contains("colour"));
        assert!(refused(None, "config.no_such=1").contains("no_such"));
        assert!(refused(None, "keep=perhaps").contains("keep"));
        assert!(refused(None, "wait_sec=-1").contains("wait_sec"));
        assert!(refused(None, "image=a&image.b=c").contains("image"));
        assert!(refused(None, ".=1").contains("not an option"));
        assert!(refused(Some(b"[1]"), "").contains("JSON object"));
        assert!(refused(Some(b"{"), "").contains("not JSON"));
        assert!(refused(Some(&vec![b' '; MAX_OPTIONS + 1]), "").contains("over"));
        assert!(refused(None, &"a=".repeat(MAX_OPTIONS)).contains("over"));
        // A name deep enough to nest thousands of objects (whose drop would
        // recurse as deep) is refused before anything is built.
        let deep = format!("{}=1", vec!["a"; 30_000].join("."));
        assert!(refused(None, &deep).contains("deep"));
        assert!(refused(None, "config.proxy.server.x.y=1").contains("deep"));
    }
}
