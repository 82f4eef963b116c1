//! The attribute's `client = <expr>`: axum handlers take the client from
//! their `State`, with no global client and no `with_client` scope, under
//! `axum::serve` (which spawns every request on a task of its own).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, State};
use axum::routing::post;
use axum::Router;
use lock_runtime::{distributed_lock, LockClient, LockError};
use tests::RedisServer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[derive(Clone)]
struct App {
    locks: LockClient,
    /// Handlers inside the locked body now, and the most ever seen at once.
    inside: Arc<AtomicUsize>,
    most: Arc<AtomicUsize>,
}

#[distributed_lock(key = "order:{id}", wait = "30s", client = app.locks)]
async fn pay(State(app): State<App>, Path(id): Path<u64>) -> Result<String, LockError> {
    let now = app.inside.fetch_add(1, Ordering::SeqCst) + 1;
    app.most.fetch_max(now, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(30)).await;
    app.inside.fetch_sub(1, Ordering::SeqCst);
    Ok(format!(
        "paid {id} under token {}",
        lock_runtime::current_fence().unwrap_or(0)
    ))
}

/// Without `client =`: under `axum::serve` no scope reaches the handler,
/// and this test binary installs no global client.
#[distributed_lock(key = "order:{id}")]
async fn pay_without_client(Path(id): Path<u64>) -> Result<String, LockError> {
    Ok(format!("paid {id}"))
}

/// One HTTP/1.1 POST, answered with (status, body).
async fn post_to(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
    let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: test\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    );
    conn.write_all(request.as_bytes()).await.unwrap();
    let mut response = String::new();
    conn.read_to_string(&mut response).await.unwrap();
    let status = response
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}

/// 12 concurrent requests for one order through `axum::serve`: each is
/// answered 200 by the locked handler, and no two ran the body at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handlers_lock_with_the_client_from_their_state() {
    tests::init_tracing();
    let server = RedisServer::start();
    let app = App {
        locks: LockClient::connect(&server.url()).await.unwrap(),
        inside: Arc::default(),
        most: Arc::default(),
    };
    let router = Router::new()
        .route("/pay/{id}", post(pay))
        .route("/unscoped/{id}", post(pay_without_client))
        .with_state(app.clone());
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", tests::free_port()))
        .await
        .unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await });

    let requests: Vec<_> = (0..12)
        .map(|_| tokio::spawn(post_to(addr, "/pay/7")))
        .collect();
    for r in requests {
        let (status, body) = r.await.unwrap();
        assert_eq!(status, 200, "{body}");
        assert!(body.starts_with("paid 7 under token "), "{body}");
        assert!(!body.ends_with("token 0"), "{body}");
    }
    assert_eq!(
        app.most.load(Ordering::SeqCst),
        1,
        "the lock excluded: one body at a time"
    );
    assert_eq!(app.locks.held_count(), 0);

    // The same handler without `client =` finds no client to lock with.
    let (status, body) = post_to(addr, "/unscoped/7").await;
    assert_eq!(status, 500, "{body}");
    assert!(body.contains("lock_unavailable"), "{body}");
}
