// The tonic service the `grpc_*` compile-fail cases implement a method of:
// its messages, its trait, and a service with an engine.
use idem::grpc::HasEngine;
use idem::http::{HeaderScope, XTenantId};
use idem::sqlx::{Sqlite, SqliteConnection};
use idem::{idempotent, Engine};
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
}

struct Service {
    engine: Engine<Sqlite>,
}

impl HasEngine<Sqlite> for Service {
    fn engine(&self) -> &Engine<Sqlite> {
        &self.engine
    }
}
