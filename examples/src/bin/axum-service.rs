//! An axum service that takes its lock client from the handler's state
//! (`client = app.locks`: no global client, nothing to `init`), connects
//! lazily (it starts even while Redis is down) and closes the client after
//! its graceful shutdown, so a redeploy hands its locks on at once.
//!
//! `cargo run -p examples --bin axum-service` (uses `REDIS_URL`, or the
//! in-memory backend when it is unset), then
//! `curl -X POST localhost:3000/orders/42/pay`.

use std::time::Duration;

use axum::extract::{Path, State};
use axum::routing::post;
use axum::Router;
use lock_runtime::{distributed_lock, LockClient, LockError};

#[derive(Clone)]
struct App {
    locks: LockClient,
}

/// One payment per order at a time, across every instance. A busy order
/// answers 503 with `Retry-After` (the runtime's `axum` feature).
#[distributed_lock(key = "order:{id}", lease = "10s", wait = "2s", client = app.locks)]
async fn pay(State(app): State<App>, Path(id): Path<u64>) -> Result<String, LockError> {
    let fence = lock_runtime::current_fence().unwrap_or_default();
    // … charge once, sending `fence` along with the write …
    tokio::time::sleep(Duration::from_millis(50)).await;
    let _ = &app;
    Ok(format!("order {id} paid under token {fence}\n"))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt().init();
    let locks = match std::env::var("REDIS_URL") {
        // No I/O here: the service starts even if Redis is not up yet.
        Ok(url) => LockClient::connect_lazy(&url)?,
        Err(_) => LockClient::memory(),
    };
    let app = App {
        locks: locks.clone(),
    };
    let router = Router::new()
        .route("/orders/{id}/pay", post(pay))
        .with_state(app);
    let port = std::env::var("PORT").unwrap_or_else(|_| "3000".into());
    let listener = tokio::net::TcpListener::bind(format!("127.0.0.1:{port}")).await?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(listener, router)
        .with_graceful_shutdown(examples::flash_sale::service::shutdown_signal())
        .await?;
    // Requests in flight are done; a lock still held goes to the next
    // instance now rather than after its lease.
    locks.close(Duration::from_secs(5)).await;
    Ok(())
}
