//! Redis unreachable, killed, paused or restarted: clear errors in bounded
//! time, never a hang, never a lock believed held that Redis does not have.

use std::time::{Duration, Instant};

use lock_runtime::{LockClient, LockError};
use tests::{free_port, unique, RedisServer};

fn is_backend(e: &LockError) -> bool {
    matches!(e, LockError::Backend(_))
}

#[tokio::test]
async fn unreachable_redis_is_a_backend_error_within_five_seconds() {
    let port = free_port();
    let started = Instant::now();
    let err = LockClient::connect(&format!("redis://127.0.0.1:{port}"))
        .await
        .unwrap_err();
    assert!(is_backend(&err), "{err:?}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "took {:?}",
        started.elapsed()
    );
    // The message says where it tried.
    assert!(err.to_string().contains(&port.to_string()), "{err}");
}

#[tokio::test]
async fn malformed_url_is_a_config_error() {
    let err = LockClient::connect("not a url").await.unwrap_err();
    assert!(matches!(err, LockError::Config(_)), "{err:?}");
}

#[tokio::test]
async fn redis_gone_after_connect_fails_lock_calls_in_bounded_time() {
    tests::init_tracing();
    let mut server = RedisServer::start();
    let client = LockClient::connect(&server.url()).await.unwrap();
    server.kill();
    let started = Instant::now();
    // The default wait (5 s): a server that refuses every connection ends
    // the call within two operation timeouts, well within 5 s.
    let err = client.lock(unique("gone")).await.unwrap_err();
    assert!(is_backend(&err), "{err:?}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "took {:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn paused_redis_times_out_instead_of_hanging() {
    let server = RedisServer::start();
    let client = LockClient::connect(&server.url()).await.unwrap();
    server.pause();
    let started = Instant::now();
    // The default wait (5 s): a server that takes commands but never
    // answers is tried until the wait's deadline, and no attempt runs past
    // it (margin for a loaded machine).
    let err = client.lock(unique("paused")).await.unwrap_err();
    let took = started.elapsed();
    server.resume();
    assert!(is_backend(&err), "{err:?}");
    assert!(took < Duration::from_millis(5500), "took {took:?}");
}

#[test]
fn client_outlives_the_runtime_that_made_it() {
    let server = RedisServer::start();
    let url = server.url();
    let client = tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(async { LockClient::connect(&url).await.unwrap() });
    // That runtime is gone; a new one (as in the next #[tokio::test]) uses it.
    for _ in 0..2 {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let g = tokio::time::timeout(Duration::from_secs(5), client.lock(unique("rt")))
                .await
                .expect("lock call hung in a second runtime")
                .expect("lock in a second runtime");
            g.release().await.unwrap();
        });
    }
}

#[tokio::test]
async fn restart_without_persistence_reports_lost_not_held() {
    let mut server = RedisServer::start();
    let client = LockClient::connect(&server.url()).await.unwrap();
    let key = unique("restart");
    let guard = client
        .lock(&key)
        .lease(Duration::from_secs(1))
        .await
        .unwrap();
    server.restart();
    // Redis came back empty: the next successful renewal hears "not owner".
    tokio::time::timeout(Duration::from_secs(5), guard.lost())
        .await
        .expect("the holder was never told its lock vanished");
    assert!(matches!(guard.release().await, Err(LockError::Lost { .. })));
    // The client reconnected: new locks work.
    let g = client.lock(&key).await.expect("lock after restart");
    g.release().await.unwrap();
}

#[tokio::test]
async fn restart_with_persistence_keeps_renewing() {
    let mut server = RedisServer::start_with(&[
        "--appendonly",
        "yes",
        "--appendfsync",
        "always",
        "--save",
        "",
    ]);
    let client = LockClient::connect(&server.url()).await.unwrap();
    let key = unique("persist");
    let guard = client
        .lock(&key)
        .lease(Duration::from_secs(3))
        .await
        .unwrap();
    let fence = guard.fence();
    server.restart();
    // Past the lease: only renewals after the restart can have kept it.
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(!guard.is_lost(), "lock lost although Redis kept it");
    assert!(server.exists(&format!("lock:{{{key}}}")));
    guard.release().await.expect("still ours after the restart");
    // The fence counter persisted too: tokens keep increasing.
    let g = client.lock(&key).await.unwrap();
    assert!(g.fence() > fence);
    g.release().await.unwrap();
}

#[tokio::test]
async fn paused_redis_past_the_lease_is_lost() {
    let server = RedisServer::start();
    let client = LockClient::connect(&server.url()).await.unwrap();
    let guard = client
        .lock(unique("stall"))
        .lease(Duration::from_millis(1500))
        .await
        .unwrap();
    server.pause();
    let started = Instant::now();
    tokio::time::timeout(Duration::from_secs(5), guard.lost())
        .await
        .expect("loss not reported while Redis was unreachable");
    server.resume();
    // Declared lost no later than the lease deadline allows (plus slack).
    assert!(
        started.elapsed() < Duration::from_millis(1500 + 1000),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn round_trips_per_operation() {
    let server = RedisServer::start();
    let client = LockClient::connect(&server.url()).await.unwrap();
    let key = unique("rt");

    server.reset_stats();
    let g = client.lock(&key).await.unwrap();
    assert_eq!(server.calls("evalsha"), 1, "lock = one EVALSHA");
    g.release().await.unwrap();
    assert_eq!(server.calls("evalsha"), 2, "unlock = one EVALSHA");
    assert_eq!(server.calls("eval"), 0);
    assert_eq!(
        server.calls("script|load"),
        0,
        "scripts are loaded once, at connect"
    );

    // Renewal: 200 held locks, one pipelined EVALSHA per tick.
    let guards: Vec<_> = futures_join(&client, &key, 200, Duration::from_millis(900)).await;
    server.reset_stats();
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let calls = server.calls("evalsha");
    // 1000 ms at a 300 ms renew interval: about 3 ticks, never 200 per tick.
    assert!(
        (1..=6).contains(&calls),
        "{calls} renew calls for 200 locks in 1 s"
    );
    for g in guards {
        g.release().await.unwrap();
    }
    // Nothing held: nothing sent.
    server.reset_stats();
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(
        server.calls("evalsha"),
        0,
        "an idle client sent lock commands"
    );
}

async fn futures_join(
    client: &LockClient,
    key: &str,
    n: usize,
    lease: Duration,
) -> Vec<lock_runtime::LockGuard> {
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        out.push(
            client
                .lock(format!("{key}-{i}"))
                .lease(lease)
                .await
                .unwrap(),
        );
    }
    out
}

#[tokio::test]
async fn flushed_scripts_are_reloaded() {
    let server = RedisServer::start();
    let client = LockClient::connect(&server.url()).await.unwrap();
    let _: String = server.cmd(&["SCRIPT", "FLUSH"]);
    let g = client
        .lock(unique("flush"))
        .await
        .expect("lock after SCRIPT FLUSH");
    g.release().await.expect("release after SCRIPT FLUSH");
}

#[tokio::test]
async fn wrong_password_is_a_backend_error() {
    let server = RedisServer::start_with(&["--requirepass", "secret", "--save", ""]);
    let url = format!("redis://:wrong@127.0.0.1:{}", server.port());
    let started = Instant::now();
    let err = LockClient::connect(&url).await.unwrap_err();
    assert!(is_backend(&err), "{err:?}");
    assert!(started.elapsed() < Duration::from_secs(5));
    let ok = LockClient::connect(&format!("redis://:secret@127.0.0.1:{}", server.port())).await;
    assert!(ok.is_ok(), "{ok:?}");
}
