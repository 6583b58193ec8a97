//! The message a handler enqueues: where it goes, what it carries, its id.

use super::error::OutboxError;
use crate::scope::Scope;
use crate::IdempotencyKey;
use crate::Step;

/// How many delivery attempts a message gets before it goes to `dead`,
/// unless [`Message::max_attempts`] says otherwise.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 20;

/// The longest message id accepted, in bytes.
pub const MAX_ID_LEN: usize = 255;

/// One message to enqueue: where it goes, what it carries, and its id.
///
/// Built with [`Message::to`] (or [`Message::webhook`]), given a payload
/// ([`Message::json`] or [`Message::body`]) and an id: [`Message::for_step`]
/// inside a claim (the id is `child_key(parent_key, step)`), or
/// [`Message::with_id`] outside one.
///
/// ```
/// use idem_runtime::outbox::Message;
/// use idem_runtime::{child_key, Step, IdempotencyKey, Scope};
/// const NOTIFY: Step = Step::new("notify.v1");
/// let key = IdempotencyKey::new("order-1").unwrap();
/// let message = Message::to("events", "orders.created")
///     .json(&serde_json::json!({"order": 1}))
///     .unwrap()
///     .for_step(&key, NOTIFY)
///     .scope(&Scope::tenant("acme"));
/// assert_eq!(message.id(), Some(child_key("order-1", "notify.v1").as_str()));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    pub(crate) id: Option<String>,
    pub(crate) parent_key: Option<String>,
    pub(crate) step: Option<&'static str>,
    pub(crate) scope: String,
    pub(crate) sink: String,
    pub(crate) destination: String,
    pub(crate) ordering_key: Option<String>,
    pub(crate) headers: Vec<(String, String)>,
    pub(crate) content_type: String,
    pub(crate) payload: Vec<u8>,
    pub(crate) max_attempts: u32,
}

impl Message {
    /// A message for the sink named `sink` (see [`Sink::name`](super::Sink::name)), to
    /// `destination` within it (a subject, a URL). The payload starts empty.
    pub fn to(sink: impl Into<String>, destination: impl Into<String>) -> Self {
        Self {
            id: None,
            parent_key: None,
            step: None,
            scope: String::new(),
            sink: sink.into(),
            destination: destination.into(),
            ordering_key: None,
            headers: Vec::new(),
            content_type: "application/octet-stream".to_owned(),
            payload: Vec::new(),
            max_attempts: DEFAULT_MAX_ATTEMPTS,
        }
    }

    /// A message for the webhook sink, POSTed to `url`.
    pub fn webhook(url: impl Into<String>) -> Self {
        Self::to("webhook", url)
    }

    /// Serializes `value` as the JSON payload (`application/json`).
    pub fn json<T: serde::Serialize + ?Sized>(
        mut self,
        value: &T,
    ) -> Result<Self, serde_json::Error> {
        self.payload = serde_json::to_vec(value)?;
        self.content_type = "application/json".to_owned();
        Ok(self)
    }

    /// Sets the payload and its media type.
    pub fn body(mut self, content_type: impl Into<String>, payload: impl Into<Vec<u8>>) -> Self {
        self.content_type = content_type.into();
        self.payload = payload.into();
        self
    }

    /// Names the message as `step` on behalf of `parent`: its id becomes
    /// [`child_key`](crate::child_key)`(parent, step)`, so a retried or
    /// taken-over attempt enqueues the same id, which the store keeps once.
    pub fn for_step(mut self, parent: &IdempotencyKey, step: Step) -> Self {
        self.id = Some(parent.child(step).as_str().to_owned());
        self.parent_key = Some(parent.as_str().to_owned());
        self.step = Some(step.name());
        self
    }

    /// Gives the message an explicit id, for messages enqueued outside a
    /// claim. The caller keeps the id stable across retries.
    pub fn with_id(mut self, id: impl Into<String>, step: Step) -> Self {
        self.id = Some(id.into());
        self.parent_key = None;
        self.step = Some(step.name());
        self
    }

    /// The scope the message was enqueued under, for lookups.
    pub fn scope(mut self, scope: &Scope) -> Self {
        self.scope = scope.as_stored().to_owned();
        self
    }

    /// Messages with the same ordering key are published one at a time, in
    /// enqueue order; a dead one holds the rest back until it is requeued or
    /// skipped.
    pub fn ordering_key(mut self, key: impl Into<String>) -> Self {
        self.ordering_key = Some(key.into());
        self
    }

    /// Adds a header the sink sends with the message.
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// How many delivery attempts before the message goes to `dead`
    /// ([`DEFAULT_MAX_ATTEMPTS`] unless set; at least 1).
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = attempts;
        self
    }

    /// The message's id, once [`Message::for_step`] or [`Message::with_id`] set it.
    pub fn id(&self) -> Option<&str> {
        self.id.as_deref()
    }

    pub(crate) fn validate(&self) -> Result<(&str, &'static str), OutboxError> {
        let (Some(id), Some(step)) = (self.id.as_deref(), self.step) else {
            return Err(OutboxError::Invalid(
                "the message has no id: call `for_step(&key, STEP)` inside a claim or `with_id(id, STEP)` outside one".into(),
            ));
        };
        if id.is_empty() || id.len() > MAX_ID_LEN {
            return Err(OutboxError::Invalid(format!(
                "a message id is 1 to {MAX_ID_LEN} bytes; this one has {}",
                id.len()
            )));
        }
        if self.sink.is_empty() || self.destination.is_empty() {
            return Err(OutboxError::Invalid(
                "a message needs a sink and a destination".into(),
            ));
        }
        if self.max_attempts == 0 || self.max_attempts > i32::MAX as u32 {
            return Err(OutboxError::Invalid(
                "max_attempts must be at least 1".into(),
            ));
        }
        Ok((id, step))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOTIFY: Step = Step::new("notify.v1");

    #[test]
    fn a_message_needs_an_id_a_destination_and_attempts() {
        let key = IdempotencyKey::new("order-1").unwrap();
        let no_id = Message::webhook("http://127.0.0.1:1/hooks");
        assert!(matches!(no_id.validate(), Err(OutboxError::Invalid(_))));
        let ok = no_id.clone().for_step(&key, NOTIFY);
        assert_eq!(
            ok.validate().unwrap(),
            (
                crate::child_key("order-1", "notify.v1").as_str(),
                "notify.v1"
            )
        );
        let no_destination = Message::to("events", "").with_id("m-1", NOTIFY);
        assert!(matches!(
            no_destination.validate(),
            Err(OutboxError::Invalid(_))
        ));
        let no_attempts = ok.clone().max_attempts(0);
        assert!(matches!(
            no_attempts.validate(),
            Err(OutboxError::Invalid(_))
        ));
        let long_id = Message::to("events", "x").with_id("x".repeat(MAX_ID_LEN + 1), NOTIFY);
        assert!(matches!(long_id.validate(), Err(OutboxError::Invalid(_))));
    }

    #[test]
    fn an_explicit_id_has_no_parent() {
        let key = IdempotencyKey::new("order-1").unwrap();
        let message = Message::to("events", "x")
            .for_step(&key, NOTIFY)
            .with_id("m-1", NOTIFY);
        assert_eq!(message.id(), Some("m-1"));
        assert_eq!(message.parent_key, None);
    }

    #[test]
    fn json_sets_the_payload_and_its_type() {
        let message = Message::to("events", "x")
            .json(&serde_json::json!({"a": 1}))
            .unwrap();
        assert_eq!(message.payload, br#"{"a":1}"#);
        assert_eq!(message.content_type, "application/json");
    }
}
