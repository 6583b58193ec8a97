// Without `#[tonic::async_trait]` on the impl: the trait is still declared
// with it, and the attribute writes the boxed method the trait expects.
// A method without the attribute is written in the boxed form by hand.
use idem::grpc::HasEngine;
use idem::http::{HeaderScope, XTenantId};
use idem::sqlx::{Sqlite, SqliteConnection};
use idem::{idempotent, Engine};
use std::future::Future;
use std::pin::Pin;
use tonic::{Request, Response, Status};

#[derive(Clone, PartialEq, prost::Message, idem::Fingerprint)]
pub struct ChargeRequest {
    #[prost(int64, tag = "1")]
    pub amount_cents: i64,
    #[prost(string, tag = "2")]
    pub request_id: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ChargeReply {
    #[prost(string, tag = "1")]
    pub charge_id: String,
}

#[tonic::async_trait]
pub trait Payments: Send + Sync + 'static {
    async fn charge(&self, request: Request<ChargeRequest>) -> Result<Response<ChargeReply>, Status>;
    async fn refund(&self, request: Request<ChargeRequest>) -> Result<Response<ChargeReply>, Status>;
}

struct Service {
    engine: Engine<Sqlite>,
}

impl HasEngine<Sqlite> for Service {
    fn engine(&self) -> &Engine<Sqlite> {
        &self.engine
    }
}

impl Payments for Service {
    #[idempotent(grpc, scope = "tenant", step = "charge.v1")]
    async fn charge(&self, tenant: HeaderScope<XTenantId>, request: Request<ChargeRequest>, tx: &mut SqliteConnection) -> Result<Response<ChargeReply>, Status> {
        let _ = (tenant, tx);
        Ok(Response::new(ChargeReply { charge_id: request.into_inner().request_id }))
    }

    fn refund<'life0, 'async_trait>(
        &'life0 self,
        _request: Request<ChargeRequest>,
    ) -> Pin<Box<dyn Future<Output = Result<Response<ChargeReply>, Status>> + Send + 'async_trait>>
    where
        'life0: 'async_trait,
        Self: 'async_trait,
    {
        Box::pin(async { Err(Status::unimplemented("no refunds")) })
    }
}

fn main() {
    fn served<S: Payments>() {}
    served::<Service>();
}
