// Without `fingerprint = encoding`, the request message derives `Fingerprint`.
use idem::grpc::HasEngine;
use idem::http::{HeaderScope, XTenantId};
use idem::sqlx::{Sqlite, SqliteConnection};
use idem::{idempotent, Engine};
use tonic::{Request, Response, Status};

#[derive(Clone, PartialEq, prost::Message)]
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
    #[idempotent(grpc, scope = "tenant", step = "charge.v1")]
    async fn charge(&self, tenant: HeaderScope<XTenantId>, request: Request<ChargeRequest>, tx: &mut SqliteConnection) -> Result<Response<ChargeReply>, Status> {
        let _ = (tenant, request, tx);
        Ok(Response::new(ChargeReply::default()))
    }
}

fn main() {}
