// A transient code is never stored.
include!("../grpc_service.rs");

#[tonic::async_trait]
impl Payments for Service {
    #[idempotent(grpc, scope = "tenant", step = "charge.v1", store = [UNAVAILABLE])]
    async fn charge(&self, tenant: HeaderScope<XTenantId>, request: Request<ChargeRequest>, tx: &mut SqliteConnection) -> Result<Response<ChargeReply>, Status> {
        let _ = (tenant, request, tx);
        Ok(Response::new(ChargeReply::default()))
    }
}

fn main() {}
