//! The claim's transaction, handed from [`IdempotencyLayer`](super::IdempotencyLayer)
//! to the service it wraps through the request's extensions.

use std::sync::Arc;

use tokio::sync::{Mutex, OwnedMutexGuard};

use crate::engine::ClaimGuard;
use crate::store::Backend;

/// The open claim of one request, shared by the layer and the [`Tx`] its
/// handler extracts.
pub(crate) struct TxSlot<DB: Backend>(Arc<Mutex<Option<ClaimGuard<DB>>>>);

impl<DB: Backend> Clone for TxSlot<DB> {
    fn clone(&self) -> Self {
        Self(self.0.clone())
    }
}

impl<DB: Backend> TxSlot<DB> {
    pub(crate) fn new(guard: ClaimGuard<DB>) -> Self {
        Self(Arc::new(Mutex::new(Some(guard))))
    }

    /// The claim back from the handler, once it has dropped its [`Tx`];
    /// `None` if the handler still holds it (it kept the [`Tx`] past its
    /// answer: the claim rolls back when the [`Tx`] goes).
    pub(crate) fn take(self) -> Option<ClaimGuard<DB>> {
        self.0.try_lock().ok().and_then(|mut slot| slot.take())
    }
}

/// The claim's transaction in a service behind
/// [`IdempotencyLayer`](super::IdempotencyLayer): derefs to the connection,
/// so the business writes go where the layer commits the stored answer.
/// Drop it before answering (axum handlers do when they return).
///
/// An axum extractor, and in a tonic method
/// [`Tx::from_extensions`]`(request.extensions())` (tonic passes the HTTP
/// request's extensions on). A request the layer did not claim (no step for
/// its path) has no transaction: 500, or `INTERNAL` in gRPC.
///
/// ```
/// use idem_runtime::tower::Tx;
/// use sqlx::Sqlite;
///
/// async fn create_order(mut tx: Tx<Sqlite>) -> &'static str {
///     sqlx::query("INSERT INTO orders (sku) VALUES ('sku-1')")
///         .execute(&mut *tx)
///         .await
///         .unwrap();
///     "created"
/// }
/// ```
pub struct Tx<DB: Backend>(OwnedMutexGuard<Option<ClaimGuard<DB>>>);

/// A [`Tx`] asked for on a request the layer did not claim, or twice.
#[derive(Debug, thiserror::Error)]
#[error("this request has no idempotency claim: add `IdempotencyLayer` with a step for this route, and extract `Tx` once per request")]
pub struct NoTransaction;

impl<DB: Backend> Tx<DB> {
    /// The transaction the layer put in `extensions`.
    pub fn from_extensions(extensions: &http::Extensions) -> Result<Self, NoTransaction> {
        Self::from_slot(extensions.get::<TxSlot<DB>>())
    }

    fn from_slot(slot: Option<&TxSlot<DB>>) -> Result<Self, NoTransaction> {
        let guard = slot
            .ok_or(NoTransaction)?
            .0
            .clone()
            .try_lock_owned()
            .map_err(|_| NoTransaction)?;
        guard.is_some().then_some(Self(guard)).ok_or(NoTransaction)
    }
}

impl<DB: Backend> std::ops::Deref for Tx<DB> {
    type Target = DB::Connection;

    fn deref(&self) -> &DB::Connection {
        self.0.as_ref().expect("checked when extracted")
    }
}

impl<DB: Backend> std::ops::DerefMut for Tx<DB> {
    fn deref_mut(&mut self) -> &mut DB::Connection {
        self.0.as_mut().expect("checked when extracted")
    }
}

impl<DB: Backend, S: Send + Sync> axum::extract::FromRequestParts<S> for Tx<DB> {
    type Rejection = crate::Problem;

    async fn from_request_parts(
        parts: &mut http::request::Parts,
        _: &S,
    ) -> Result<Self, Self::Rejection> {
        Self::from_extensions(&parts.extensions).map_err(|error| {
            tracing::error!(%error, "Tx extracted outside IdempotencyLayer");
            crate::Problem::new(500, "No idempotency claim").with_detail(error.to_string())
        })
    }
}

#[cfg(feature = "tonic")]
impl<DB: Backend> crate::grpc::FromRequestMetadata for Tx<DB> {
    fn from_request_metadata(
        _: &tonic::metadata::MetadataMap,
        extensions: &tonic::Extensions,
    ) -> Result<Self, tonic::Status> {
        Self::from_slot(extensions.get::<TxSlot<DB>>())
            .map_err(|error| tonic::Status::internal(error.to_string()))
    }
}
