// The key comes from one place: a request field or the metadata.
include!("../grpc_service.rs");

#[tonic::async_trait]
impl Payments for Service {
    #[idempotent(grpc, scope = "tenant", step = "charge.v1", key = request_id)]
    async fn charge(&self, tenant: HeaderScope<XTenantId>, key: idem::IdempotencyKey, request: Request<ChargeRequest>, tx: &mut SqliteConnection) -> Result<Response<ChargeReply>, Status> {
        let _ = (tenant, key, request, tx);
        Ok(Response::new(ChargeReply::default()))
    }
}

fn main() {}
