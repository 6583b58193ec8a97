//! The notifications service: `POST /notifications`, a Standard Webhooks
//! receiver fed by the order service's outbox relay.
//!
//! Shared by the checkout demo (in process, on SQLite) and the chaos run (a
//! process of its own, on SQLite or Postgres).
#![allow(dead_code)]

use std::future::Future;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use axum::routing::post;
use axum::Router;
use idem::inbox::webhook::WebhookReceiver;
use idem::inbox::Inbox;
use idem::signature::SigningSecret;
use idem::Backend;
use idem::{Engine, Problem};
use serde_json::json;
use sqlx::{MySql, MySqlConnection, PgConnection, Pool, Postgres, Sqlite, SqliteConnection};

idem::steps! {
    /// A notification recorded by the notifications service's inbox.
    pub const RECORD_NOTIFICATION = "record-notification.v1";
}

/// The secret the order service's relay signs its webhooks with and the
/// notifications service verifies them with (Standard Webhooks).
pub const WEBHOOK_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

/// The `notifications` table, on either backend.
pub trait NotificationLog: Backend {
    /// Creates the `notifications` table if missing.
    fn create_table(pool: &Pool<Self>) -> impl Future<Output = sqlx::Result<()>> + Send;
    /// Records a notification in the inbox claim's transaction.
    fn insert(
        conn: &mut Self::Connection,
        message_id: &str,
        order_id: &str,
    ) -> impl Future<Output = sqlx::Result<()>> + Send;
    /// Every notification: `(message_id, order_id)`.
    fn all(pool: &Pool<Self>) -> impl Future<Output = sqlx::Result<Vec<(String, String)>>> + Send;
}

/// One implementation per backend, with its dialect's insert.
macro_rules! notification_log {
    ($db:ty, $connection:ty, $insert:literal) => {
        impl NotificationLog for $db {
            async fn create_table(pool: &Pool<Self>) -> sqlx::Result<()> {
                sqlx::query("CREATE TABLE IF NOT EXISTS notifications (message_id TEXT NOT NULL, order_id TEXT NOT NULL)")
                    .execute(pool)
                    .await
                    .map(drop)
            }

            async fn insert(conn: &mut $connection, message_id: &str, order_id: &str) -> sqlx::Result<()> {
                sqlx::query($insert)
                    .bind(message_id)
                    .bind(order_id)
                    .execute(conn)
                    .await
                    .map(drop)
            }

            async fn all(pool: &Pool<Self>) -> sqlx::Result<Vec<(String, String)>> {
                sqlx::query_as("SELECT message_id, order_id FROM notifications")
                    .fetch_all(pool)
                    .await
            }
        }
    };
}

notification_log!(
    Sqlite,
    SqliteConnection,
    "INSERT INTO notifications (message_id, order_id) VALUES ($1, $2)"
);
notification_log!(
    Postgres,
    PgConnection,
    "INSERT INTO notifications (message_id, order_id) VALUES ($1, $2)"
);
notification_log!(
    MySql,
    MySqlConnection,
    "INSERT INTO notifications (message_id, order_id) VALUES (?, ?)"
);

/// Migrates the notifications service's store, validates the step registry
/// against it, creates the `notifications` table, and returns the service's
/// routes (`POST /notifications`).
pub async fn service<DB: NotificationLog>(
    engine: &Engine<DB>,
) -> Result<Router, Box<dyn std::error::Error + Send + Sync>> {
    engine.migrate().await?;
    idem::registry::validate(engine).await?;
    DB::create_table(engine.pool()).await?;
    let inbox = Inbox::new(engine.clone(), "notifications", RECORD_NOTIFICATION.name())?;
    let receiver = WebhookReceiver::new(inbox, SigningSecret::new(WEBHOOK_SECRET)?);
    Ok(Router::new()
        .route("/notifications", post(notify::<DB>))
        .with_state(Arc::new(receiver)))
}

/// `POST /notifications`: a Standard Webhooks receiver. The signature is
/// verified before anything else (401, nothing stored); the notification is
/// recorded under an inbox claim keyed on `webhook-id` (the outbox message
/// id), so a redelivered message is answered from the stored record and
/// recorded once.
async fn notify<DB: NotificationLog>(
    State(receiver): State<Arc<WebhookReceiver<DB>>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    receiver
        .receive(&headers, &body, async |tx, message| {
            let event: serde_json::Value = message
                .json()
                .map_err(|error| Problem::new(400, "Not JSON").with_detail(error.to_string()))?;
            let Some(order_id) = event["order_id"].as_str() else {
                return Err(Problem::new(422, "No order_id"));
            };
            DB::insert(tx, &message.id, order_id).await?;
            Ok(json!({"notified": order_id}))
        })
        .await
}
