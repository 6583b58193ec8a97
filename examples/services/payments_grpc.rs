//! The payments service over gRPC: `idem.payments.v1.Payments` (see
//! `examples/proto/payments.proto`) on the same `payments` table as the HTTP
//! service.
//!
//! `Charge` takes its key from the `idempotency-key` metadata entry and its
//! tenant from `x-tenant-id`; `Refund` carries its key in the request's
//! `request_id` field (Google's AIP-155 convention). Both are fingerprinted
//! by the `#[derive(Fingerprint)]` the code generator put on the messages.
//!
//! Shared by the payments example (with `--grpc-listen`), the checkout demo
//! and the chaos run (whose order service charges through it), and the gRPC
//! tests.
#![allow(dead_code)]

use std::time::Duration;

use idem::grpc::HasEngine;
use idem::http::{HeaderScope, XTenantId};
use idem::{idempotent, Backend, Engine};
use tonic::{Request, Response, Status};

use crate::payments::{new_payment_id, Ledger, Payment, Store};

/// The generated messages, client and server (`examples/proto/payments.rs`).
#[path = "../proto/payments.rs"]
#[allow(clippy::all, missing_docs)]
#[rustfmt::skip]
pub mod proto;

// Not every program that includes this module is a client.
#[allow(unused_imports)]
pub use proto::payments_client::PaymentsClient;
pub use proto::payments_server::{Payments, PaymentsServer};
pub use proto::{ChargeReply, ChargeRequest, RefundReply, RefundRequest};

idem::steps! {
    /// Every gRPC charge is created under this step.
    pub const CHARGE_CARD = "charge-card.v1";
    /// Every gRPC refund.
    pub const REFUND_CHARGE = "refund-charge.v1";
}

/// The gRPC payments service on `store`'s engine, as routes a tonic server
/// adds with `add_routes` (the engine's backend is the store's).
pub fn routes(store: &Store) -> tonic::service::Routes {
    match store {
        Store::Sqlite(engine) => {
            tonic::service::Routes::new(GrpcPayments::new(engine.clone()).into_server())
        }
        Store::Postgres(engine) => {
            tonic::service::Routes::new(GrpcPayments::new(engine.clone()).into_server())
        }
        Store::MySql(engine) => {
            tonic::service::Routes::new(GrpcPayments::new(engine.clone()).into_server())
        }
    }
}

/// How long the card network takes to answer a charge, inside the charge's
/// claim: a request extension a server layer may insert (the checkout demo's
/// does, so that a retry meets a charge still running). Without one the
/// charge does not wait.
#[derive(Debug, Clone, Copy)]
pub struct CardNetworkDelay(pub Duration);

/// The gRPC payments service on `DB`.
pub struct GrpcPayments<DB: Backend> {
    engine: Engine<DB>,
}

impl<DB: Backend> GrpcPayments<DB> {
    /// The service claiming on `engine` (migrated, with the `payments` table).
    pub fn new(engine: Engine<DB>) -> Self {
        Self { engine }
    }

    /// The tonic service to add to a server.
    pub fn into_server(self) -> PaymentsServer<Self>
    where
        DB: Ledger,
    {
        PaymentsServer::new(self)
    }
}

impl<DB: Backend> HasEngine<DB> for GrpcPayments<DB> {
    fn engine(&self) -> &Engine<DB> {
        &self.engine
    }
}

#[tonic::async_trait]
impl<DB: Ledger> Payments for GrpcPayments<DB> {
    /// One charge per key. A request that breaks a rule is `INVALID_ARGUMENT`,
    /// stored and replayed; a database failure is `UNAVAILABLE`, rolled back.
    #[idempotent(grpc, scope = "tenant", step = CHARGE_CARD)]
    async fn charge(
        &self,
        tenant: HeaderScope<XTenantId>,
        request: Request<ChargeRequest>,
        tx: &mut DB::Connection,
    ) -> Result<Response<ChargeReply>, Status> {
        let delay = request.extensions().get::<CardNetworkDelay>().copied();
        let charge = request.into_inner();
        validate(&charge)?;
        let payment = Payment {
            payment_id: new_payment_id(),
            amount_cents: charge.amount_cents,
            currency: charge.currency,
            destination: charge.destination,
        };
        DB::insert(tx, &tenant, &payment)
            .await
            .map_err(store_failed)?;
        if let Some(CardNetworkDelay(delay)) = delay {
            tokio::time::sleep(delay).await;
        }
        Ok(Response::new(ChargeReply {
            charge_id: payment.payment_id,
            amount_cents: payment.amount_cents,
            currency: payment.currency,
        }))
    }

    /// One refund per `request_id`. Refunding a charge the tenant does not
    /// have is `NOT_FOUND`, and more than was charged `OUT_OF_RANGE`: both
    /// deterministic, stored and replayed.
    #[idempotent(grpc, scope = "tenant", step = REFUND_CHARGE, key = request_id)]
    async fn refund(
        &self,
        tenant: HeaderScope<XTenantId>,
        request: Request<RefundRequest>,
        tx: &mut DB::Connection,
    ) -> Result<Response<RefundReply>, Status> {
        let refund = request.get_ref();
        let Some(charge) = DB::find(tx, &tenant, &refund.charge_id)
            .await
            .map_err(store_failed)?
        else {
            return Err(Status::not_found(format!(
                "tenant has no charge {:?}",
                refund.charge_id
            )));
        };
        if refund.amount_cents <= 0 || refund.amount_cents > charge.amount_cents {
            return Err(Status::out_of_range(format!(
                "amount_cents must be between 1 and the charged {}, got {}",
                charge.amount_cents, refund.amount_cents
            )));
        }
        let payment = Payment {
            payment_id: new_payment_id(),
            amount_cents: -refund.amount_cents,
            currency: charge.currency,
            destination: refund.charge_id.clone(),
        };
        DB::insert(tx, &tenant, &payment)
            .await
            .map_err(store_failed)?;
        Ok(Response::new(RefundReply {
            refund_id: payment.payment_id,
            amount_cents: refund.amount_cents,
        }))
    }
}

/// The rules a charge must meet, as `POST /payments` checks them.
fn validate(charge: &ChargeRequest) -> Result<(), Status> {
    if charge.amount_cents <= 0 {
        return Err(Status::invalid_argument(format!(
            "amount_cents must be a positive integer, got {}; send a new request with a new idempotency-key",
            charge.amount_cents
        )));
    }
    if charge.currency.len() != 3 || !charge.currency.bytes().all(|b| b.is_ascii_uppercase()) {
        return Err(Status::invalid_argument(format!(
            "currency must be three uppercase letters (ISO 4217, e.g. EUR), got {:?}; send a new request with a new idempotency-key",
            charge.currency
        )));
    }
    if charge.destination.trim().is_empty() {
        return Err(Status::invalid_argument(
            "destination must not be empty; send a new request with a new idempotency-key",
        ));
    }
    Ok(())
}

/// A database error in the body: `UNAVAILABLE`, so the work rolls back and
/// the client's retry runs it again.
fn store_failed(error: sqlx::Error) -> Status {
    tracing::warn!(%error, "payment write failed; rolling back");
    Status::unavailable("the database failed while recording the payment; nothing was charged. Retry with the same key")
}
