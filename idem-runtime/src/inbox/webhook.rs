//! The webhook receiver for axum (feature `axum`): an [`Inbox`] fed by signed
//! HTTP deliveries.
//!
//! Every request is checked against the [Standard Webhooks] signature
//! (`webhook-id`, `webhook-timestamp`, `webhook-signature`) **before** anything
//! is claimed: a missing, stale or wrong signature is a 401
//! `application/problem+json` and nothing is stored. A verified request runs
//! as an inbox claim keyed on `webhook-id`, with the body as fingerprint:
//!
//! | verdict | answer |
//! |---|---|
//! | processed | the handler's stored response (2xx) |
//! | duplicate | the same response, with `Idempotent-Replayed: true` |
//! | busy (a concurrent duplicate) | 409 + `Retry-After` |
//! | retry (a transient failure, rolled back) | 503 + `Retry-After` |
//! | poisoned (a permanent error; a poison row is committed) | the handler's 4xx |
//! | mismatch (`webhook-id` reused with another body) | 422 |
//!
//! [Standard Webhooks]: https://github.com/standard-webhooks/standard-webhooks/blob/main/spec/standard-webhooks.md

use axum::body::Bytes;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::{Consumer, Inbox, Incoming, Verdict};
use crate::engine::{Answer, Engine};
use crate::error::IdemError;
use crate::http::problem::{sentence, types, with_retry_after};
use crate::http::IDEMPOTENT_REPLAYED;
use crate::outcome::{ErrorStatus, StoredResponse};
use crate::problem::Problem;
use crate::signature::{
    unix_now, SignatureError, SigningSecret, ID_HEADER, SIGNATURE_HEADER, TIMESTAMP_HEADER,
};
use crate::store::Backend;
use crate::IdempotencyKey;

/// The problem type of a refused signature.
pub const BAD_SIGNATURE: &str = crate::http::problem::problem_type!("webhook-signature");
/// The problem type of a poisoned delivery without a stored answer.
pub const POISONED: &str = crate::http::problem::problem_type!("webhook-poisoned");

/// Receives signed webhooks into an [`Inbox`].
///
/// ```no_run
/// use std::sync::Arc;
/// use axum::{body::Bytes, extract::State, http::HeaderMap, response::Response, routing::post, Router};
/// use idem_runtime::inbox::{webhook::WebhookReceiver, Inbox};
/// use idem_runtime::signature::SigningSecret;
/// use idem_runtime::{Engine, Problem};
/// use sqlx::Sqlite;
///
/// async fn hook(State(receiver): State<Arc<WebhookReceiver<Sqlite>>>, headers: HeaderMap, body: Bytes) -> Response {
///     receiver
///         .receive(&headers, &body, async |tx, message| {
///             sqlx::query("INSERT INTO notifications (body) VALUES (?)")
///                 .bind(&message.payload)
///                 .execute(&mut *tx)
///                 .await?;
///             Ok::<_, Problem>(serde_json::json!({ "received": message.id }))
///         })
///         .await
/// }
///
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// let engine = Engine::<Sqlite>::open_sqlite("notifications.db").await?;
/// engine.migrate().await?;
/// let inbox = Inbox::new(engine, "orders-webhooks", "notify.v1")?;
/// let secret = SigningSecret::new("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")?;
/// let app: Router = Router::new()
///     .route("/webhooks/orders", post(hook))
///     .with_state(Arc::new(WebhookReceiver::new(inbox, secret)));
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct WebhookReceiver<DB: Backend> {
    inbox: Inbox<DB>,
    secrets: Vec<SigningSecret>,
}

impl<DB: Backend> Clone for WebhookReceiver<DB> {
    fn clone(&self) -> Self {
        Self {
            inbox: self.inbox.clone(),
            secrets: self.secrets.clone(),
        }
    }
}

impl<DB: Backend> WebhookReceiver<DB> {
    /// A receiver verifying against `secret`.
    pub fn new(inbox: Inbox<DB>, secret: SigningSecret) -> Self {
        Self {
            inbox,
            secrets: vec![secret],
        }
    }

    /// Also accepts signatures by `secret` (while a secret is rotated).
    pub fn also_accept(mut self, secret: SigningSecret) -> Self {
        self.secrets.push(secret);
        self
    }

    /// The inbox.
    pub fn inbox(&self) -> &Inbox<DB> {
        &self.inbox
    }

    /// Checks the request's signature and builds the inbox's message (key:
    /// `webhook-id`, payload: the body), or the 401 to answer.
    pub fn verify(&self, headers: &HeaderMap, body: &[u8]) -> Result<Incoming, Box<Response>> {
        let text = |name: &'static str| {
            headers
                .get(name)
                .and_then(|value| value.to_str().ok())
                .ok_or(SignatureError::MissingHeader(name))
        };
        let checked = (|| {
            let id = text(ID_HEADER)?;
            let timestamp = text(TIMESTAMP_HEADER)?
                .trim()
                .parse::<i64>()
                .map_err(|_| SignatureError::MissingHeader(TIMESTAMP_HEADER))?;
            let signatures = text(SIGNATURE_HEADER)?;
            let now = unix_now();
            let mut outcome = Err(SignatureError::Mismatch);
            for secret in &self.secrets {
                outcome = secret.verify(id, timestamp, body, signatures, now);
                if outcome.is_ok() || matches!(outcome, Err(SignatureError::Stale { .. })) {
                    break;
                }
            }
            outcome.map(|()| id.to_owned())
        })();
        match checked {
            Ok(id) => Ok(Incoming::new(id, body.to_vec()).source(self.inbox.consumer().name())),
            Err(error) => Err(Box::new(
                Problem::new(401, "Webhook signature refused")
                    .with_type(BAD_SIGNATURE)
                    .with_detail(sentence(&format!(
                        "{error}; nothing was processed or stored. Sign the request per the Standard Webhooks specification"
                    )))
                    .into_response(),
            )),
        }
    }

    /// Verifies the request, then runs `work` for it under the inbox's claim
    /// ([`Inbox::handle`]) and renders the verdict.
    pub async fn receive<T, E, F>(&self, headers: &HeaderMap, body: &Bytes, work: F) -> Response
    where
        T: Serialize + DeserializeOwned + Send,
        E: ErrorStatus + Send,
        F: AsyncFnOnce(&mut DB::Connection, &Incoming) -> Result<T, E>,
    {
        let message = match self.verify(headers, body) {
            Ok(message) => message,
            Err(refused) => return *refused,
        };
        render(self.inbox.handle(&message, work).await)
    }

    /// Verifies the request, then runs an `#[idempotent]` function for it
    /// ([`Inbox::handle_idempotent`]) and renders the verdict.
    pub async fn receive_idempotent<T, E, F>(
        &self,
        headers: &HeaderMap,
        body: &Bytes,
        call: F,
    ) -> Response
    where
        T: Serialize + DeserializeOwned + Send,
        E: ErrorStatus + Send,
        F: AsyncFnOnce(
            &Engine<DB>,
            Consumer,
            IdempotencyKey,
            Incoming,
        ) -> Result<Answer<Result<T, E>>, IdemError>,
    {
        let message = match self.verify(headers, body) {
            Ok(message) => message,
            Err(refused) => return *refused,
        };
        render(self.inbox.handle_idempotent(&message, call).await)
    }
}

/// The HTTP answer for a verdict.
pub fn render(verdict: Verdict) -> Response {
    match verdict {
        Verdict::Processed(stored) => stored_response(stored),
        Verdict::Duplicate(stored) => {
            let mut response = stored_response(stored);
            response
                .headers_mut()
                .insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
            response
        }
        Verdict::Busy { retry_after } => with_retry_after(
            Problem::new(409, "Webhook delivery in progress")
                .with_type(types::IN_PROGRESS)
                .with_detail("Another delivery of this webhook-id is being processed; retry later.")
                .into_response(),
            retry_after,
        ),
        Verdict::Retry { error, retry_after } => with_retry_after(
            Problem::new(503, "Webhook delivery failed")
                .with_type(types::STORE_UNAVAILABLE)
                .with_detail(sentence(&format!("{error}; nothing was kept, retry later")))
                .into_response(),
            retry_after,
        ),
        Verdict::Poisoned {
            response: Some(stored),
            ..
        } => stored_response(stored),
        Verdict::Poisoned {
            error,
            response: None,
        } => Problem::new(422, "Webhook delivery rejected")
            .with_type(POISONED)
            .with_detail(sentence(&error))
            .into_response(),
        Verdict::Mismatch => Problem::new(422, "Webhook-id reused")
            .with_type(types::KEY_REUSED)
            .with_detail(
                "This webhook-id was already delivered with a different body; send a new id for a new event.",
            )
            .into_response(),
    }
}

fn stored_response(stored: StoredResponse) -> Response {
    let status = StatusCode::from_u16(stored.status).unwrap_or(StatusCode::OK);
    let mut response = (status, stored.body).into_response();
    if let Ok(value) = HeaderValue::from_str(&stored.content_type) {
        response.headers_mut().insert(header::CONTENT_TYPE, value);
    }
    response
}
