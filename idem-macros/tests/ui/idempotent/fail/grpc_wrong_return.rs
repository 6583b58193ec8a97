// A gRPC method returns the trait's `Result<Response<Reply>, Status>`.
include!("../grpc_service.rs");

#[tonic::async_trait]
impl Payments for Service {
    #[idempotent(grpc, scope = "tenant", step = "charge.v1")]
    async fn charge(&self, tenant: HeaderScope<XTenantId>, request: Request<ChargeRequest>, tx: &mut SqliteConnection) -> Result<ChargeReply, Status> {
        let _ = (tenant, request, tx);
        Ok(ChargeReply::default())
    }
}

fn main() {}
