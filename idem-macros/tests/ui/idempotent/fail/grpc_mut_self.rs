// A tonic service method takes `&self`.
include!("../grpc_service.rs");

#[tonic::async_trait]
impl Payments for Service {
    #[idempotent(grpc, scope = "tenant", step = "charge.v1")]
    async fn charge(&mut self, tenant: HeaderScope<XTenantId>, request: Request<ChargeRequest>, tx: &mut SqliteConnection) -> Result<Response<ChargeReply>, Status> {
        let _ = (tenant, request, tx);
        Ok(Response::new(ChargeReply::default()))
    }
}

fn main() {}
