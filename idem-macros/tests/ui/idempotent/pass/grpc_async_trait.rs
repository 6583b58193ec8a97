// The natural spelling: the method in a `#[tonic::async_trait]` impl, as
// tonic's generated traits are implemented. The attribute expands first and
// gives the method the boxed signature `#[async_trait]` would.
use idem::grpc::HasEngine;
use idem::http::{HeaderScope, XTenantId};
use idem::sqlx::{Sqlite, SqliteConnection};
use idem::{idempotent, Engine, IdempotencyKey};
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

#[tonic::async_trait]
impl Payments for Service {
    #[idempotent(grpc, scope = "tenant", step = "charge.v1", store = [PERMISSION_DENIED], never_store = [NOT_FOUND], metadata = ["ledger-entry"], timeout = "5s")]
    async fn charge(&self, tenant: HeaderScope<XTenantId>, request: Request<ChargeRequest>, tx: &mut SqliteConnection) -> Result<Response<ChargeReply>, Status> {
        let _ = (tenant, tx);
        Ok(Response::new(ChargeReply { charge_id: request.into_inner().request_id }))
    }

    // The key as a parameter too, read from the metadata like the scope.
    #[idempotent(grpc, scope = "tenant", step = "refund.v1")]
    async fn refund(&self, tenant: HeaderScope<XTenantId>, key: IdempotencyKey, request: Request<ChargeRequest>, tx: &mut SqliteConnection) -> Result<Response<ChargeReply>, Status> {
        let _ = (tenant, request, tx);
        Ok(Response::new(ChargeReply { charge_id: key.as_str().to_owned() }))
    }
}

fn main() {
    fn served<S: Payments>() {}
    served::<Service>();
}
