//! The payments service, on its own.
//!
//! ```text
//! cargo run --release --example payments -- --listen 127.0.0.1:8080 [--grpc-listen ADDR]
//!     [--database-url URL] [--max-body-bytes N] [--allow-faults]
//! ```
//!
//! - `POST /payments` (headers `Idempotency-Key`, `X-Tenant-Id`; body
//!   `{"amount_cents", "currency", "destination", "requested_at"?}`) → 201.
//! - `GET /payments` (header `X-Tenant-Id`) → 200 `{"count", "payments"}`.
//! - `GET /healthz` → 200, or 503 when the store does not answer.
//! - `GET /metrics` → idem's metrics (`idem_runtime::metrics`) as Prometheus
//!   text, through `metrics-exporter-prometheus`: the example installs the
//!   exporter; the library only records through the `metrics` facade.
//! - With `--grpc-listen ADDR`, the gRPC service `idem.payments.v1.Payments`
//!   (`Charge`, `Refund`; `examples/services/payments_grpc.rs`) on `ADDR` too,
//!   from the same store and the same `payments` table, each transport under
//!   its own step.
//!
//! The store is the SQLite file `idem-payments.db` in the working directory
//! unless `--database-url` names another file or a `postgres://` database.
//! At start the service migrates the store, creates its table and validates
//! the step registry against it (`idem::registry::validate`): if the store
//! holds live keys for a step this build no longer declares, or a step is
//! malformed, declared twice or used undeclared, it exits non-zero listing
//! every problem. When ready it prints one line, `listening on http://ADDR`
//! (with `--grpc-listen`, after a line `grpc on http://ADDR`).
//! `--allow-faults` (in a build with idem's `faults` feature, which the
//! examples get through the dev-dependencies) honours the
//! `X-Idem-Fault: after-claim | after-business-write | after-commit` header by
//! aborting the process at that point.

#[path = "services/payments.rs"]
mod payments;
#[path = "services/payments_grpc.rs"]
mod payments_grpc;

use std::net::SocketAddr;
use std::process::ExitCode;

use payments::{Config, Store};

struct Args {
    listen: SocketAddr,
    grpc_listen: Option<SocketAddr>,
    database_url: Option<String>,
    config: Config,
}

const USAGE: &str = "usage: payments --listen ADDR [--grpc-listen ADDR] [--database-url URL] [--max-body-bytes N] [--allow-faults]";

fn parse_args() -> Result<Args, String> {
    let mut listen = None;
    let mut grpc_listen = None;
    let mut database_url = None;
    let mut config = Config::default();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = |name: &str| args.next().ok_or(format!("{name} needs a value"));
        match arg.as_str() {
            "--listen" => {
                listen = Some(
                    value("--listen")?
                        .parse()
                        .map_err(|e| format!("--listen: {e}"))?,
                )
            }
            "--grpc-listen" => {
                grpc_listen = Some(
                    value("--grpc-listen")?
                        .parse()
                        .map_err(|e| format!("--grpc-listen: {e}"))?,
                )
            }
            "--database-url" => database_url = Some(value("--database-url")?),
            "--max-body-bytes" => {
                config.body_limit = value("--max-body-bytes")?
                    .parse()
                    .map_err(|e| format!("--max-body-bytes: {e}"))?
            }
            "--allow-faults" if payments::FAULTS_COMPILED => config.allow_faults = true,
            "--allow-faults" => {
                return Err("--allow-faults needs a build with idem's `faults` feature".into())
            }
            "-h" | "--help" => return Err(USAGE.into()),
            other => return Err(format!("unknown argument {other:?}\n{USAGE}")),
        }
    }
    let listen = listen.ok_or(format!("--listen is required\n{USAGE}"))?;
    Ok(Args {
        listen,
        grpc_listen,
        database_url,
        config,
    })
}

#[tokio::main]
async fn main() -> ExitCode {
    use std::io::IsTerminal;
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_target(false)
        .init();
    // With IDEM_PRINT_STEPS set this prints the declared steps and exits
    // (`idem steps --declared-by`); otherwise it checks them.
    if let Err(problems) = idem::registry::check() {
        eprintln!("{problems}");
        return ExitCode::FAILURE;
    }
    let args = match parse_args() {
        Ok(args) => args,
        Err(message) => {
            eprintln!("{message}");
            return ExitCode::from(2);
        }
    };
    match run(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("payments: {error}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let prometheus = metrics_exporter_prometheus::PrometheusBuilder::new().install_recorder()?;
    let store = Store::open(args.database_url.as_deref()).await?;
    let app = store.router(args.config).route(
        "/metrics",
        axum::routing::get(move || std::future::ready(prometheus.render())),
    );
    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    let addr = listener.local_addr()?;
    let grpc = match args.grpc_listen {
        Some(grpc_listen) => Some(tokio::net::TcpListener::bind(grpc_listen).await?),
        None => None,
    };
    tracing::info!(
        backend = store.backend(),
        allow_faults = args.config.allow_faults,
        grpc = grpc.is_some(),
        "payments service ready"
    );
    if let Some(grpc) = &grpc {
        println!("grpc on http://{}", grpc.local_addr()?);
    }
    println!("listening on http://{addr}");
    // One shutdown signal stops both servers.
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let until_stopped = |mut stopped: tokio::sync::watch::Receiver<bool>| async move {
        let _ = stopped.wait_for(|stop| *stop).await;
    };
    let http = axum::serve(listener, app).with_graceful_shutdown(until_stopped(stopped.clone()));
    let grpc = async {
        match grpc {
            Some(grpc) => {
                tonic::transport::Server::builder()
                    .add_routes(payments_grpc::routes(&store))
                    .serve_with_incoming_shutdown(
                        tonic::transport::server::TcpIncoming::from(grpc),
                        until_stopped(stopped),
                    )
                    .await
            }
            None => Ok(()),
        }
    };
    let signal = async move {
        shutdown_signal().await;
        let _ = stop.send(true);
    };
    let (http, grpc, ()) = tokio::join!(async { http.await }, grpc, signal);
    http?;
    grpc?;
    tracing::info!("payments service stopped");
    Ok(())
}

/// Resolves on Ctrl-C or SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = terminate => {}
    }
}
