// `grpc` wraps a method of a tonic service impl, not a free function.
use idem::http::{HeaderScope, XTenantId};
use idem::idempotent;
use idem::sqlx::SqliteConnection;
use tonic::{Request, Response, Status};

#[idempotent(grpc, scope = "tenant", step = "charge.v1")]
async fn charge(tenant: HeaderScope<XTenantId>, request: Request<String>, tx: &mut SqliteConnection) -> Result<Response<String>, Status> {
    let _ = (tenant, tx);
    Ok(Response::new(request.into_inner()))
}

fn main() {}
