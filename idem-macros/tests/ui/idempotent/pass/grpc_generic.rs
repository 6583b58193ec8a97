// One service for both backends, generic over `DB: Backend`: the scope is
// the principal an interceptor authenticated, the key a request field
// (AIP-155), the fingerprint the message's protobuf encoding.
use idem::grpc::HasEngine;
use idem::http::PrincipalScope;
use idem::sqlx::{Postgres, Sqlite};
use idem::{idempotent, Backend, Engine};
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
    async fn refund(&self, request: Request<ChargeRequest>) -> Result<Response<ChargeReply>, Status>;
}

struct Service<DB: Backend> {
    engine: Engine<DB>,
}

impl<DB: Backend> HasEngine<DB> for Service<DB> {
    fn engine(&self) -> &Engine<DB> {
        &self.engine
    }
}

idem::steps! {
    const CHARGE = "charge.v1";
    const REFUND = "refund.v1";
}

#[tonic::async_trait]
impl<DB: Backend> Payments for Service<DB> {
    #[idempotent(grpc, scope = "caller", step = CHARGE, key = request_id, fingerprint = encoding)]
    async fn charge(&self, caller: PrincipalScope<String>, request: Request<ChargeRequest>, tx: &mut DB::Connection) -> Result<Response<ChargeReply>, Status> {
        let _ = (caller, tx);
        Ok(Response::new(ChargeReply { charge_id: request.into_inner().request_id }))
    }

    #[idempotent(grpc, scope = "caller", step = REFUND, fingerprint = encoding, durable)]
    async fn refund(&self, caller: PrincipalScope<String>, request: Request<ChargeRequest>, tx: &mut DB::Connection) -> Result<Response<ChargeReply>, Status> {
        let _ = (caller, request, tx);
        Err(Status::failed_precondition("nothing to refund"))
    }
}

fn main() {
    fn served<S: Payments>() {}
    served::<Service<Sqlite>>();
    served::<Service<Postgres>>();
}
