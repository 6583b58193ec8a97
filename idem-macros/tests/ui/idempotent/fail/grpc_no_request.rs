// A gRPC method receives its `tonic::Request`. (The compiler adds that the
// parameters do not match the trait's: the method is left as written.)
include!("../grpc_service.rs");

#[tonic::async_trait]
impl Payments for Service {
    #[idempotent(grpc, scope = "tenant", step = "charge.v1")]
    async fn charge(&self, tenant: HeaderScope<XTenantId>, tx: &mut SqliteConnection) -> Result<Response<ChargeReply>, Status> {
        let _ = (tenant, tx);
        Ok(Response::new(ChargeReply::default()))
    }
}

fn main() {}
