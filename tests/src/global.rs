//! One `redis-server` per test binary behind the global client, for tests
//! of the attribute (which always uses the global client).

use std::sync::OnceLock;

use lock_runtime::LockClient;

use crate::RedisServer;

static SERVER: OnceLock<RedisServer> = OnceLock::new();
static INIT: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();

/// Start the binary's server (once) and point the global client at it.
pub async fn redis() -> &'static RedisServer {
    let server = SERVER.get_or_init(RedisServer::start);
    INIT.get_or_init(|| async {
        crate::init_tracing();
        let client = LockClient::connect(&server.url())
            .await
            .expect("connect global client");
        lock_runtime::init(client).expect("init global client");
    })
    .await;
    server
}

/// Point the global client at the in-memory backend (once).
pub async fn memory() {
    INIT.get_or_init(|| async {
        crate::init_tracing();
        lock_runtime::init(LockClient::memory()).expect("init global client");
    })
    .await;
}

/// Start the binary's PostgreSQL server (once, shared) and point the global
/// client at a database of its own.
pub async fn postgres() -> &'static crate::postgres::PostgresServer {
    let server = crate::postgres::PostgresServer::shared();
    INIT.get_or_init(|| async {
        crate::init_tracing();
        let db = server.fresh_database();
        let client = LockClient::connect(&server.url_for(&db))
            .await
            .expect("connect global client to PostgreSQL");
        lock_runtime::init(client).expect("init global client");
    })
    .await;
    server
}
