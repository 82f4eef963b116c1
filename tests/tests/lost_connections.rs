//! Dropped connections, lost holds and per-body fencing against one real
//! `redis-server`: what a service sees after a quiet period, under
//! `CLIENT KILL`, when a lock vanishes under a nested call, and across a
//! restart that loses the fence counter.

use std::time::{Duration, Instant};

use lock_runtime::{distributed_lock, LockClient, LockError};
use tests::proxy::{Mode, Proxy};
use tests::semantics::AppError;
use tests::{eventually, global, unique, RedisServer};

fn kill(server: &RedisServer, kind: &str) -> i64 {
    server.cmd(&["CLIENT", "KILL", "TYPE", kind])
}

/// A client that has taken and released one lock, so its connection is up.
async fn used_client(server: &RedisServer) -> LockClient {
    let client = LockClient::connect(&server.url()).await.unwrap();
    let g = client.lock(unique("warm")).await.unwrap();
    g.release().await.unwrap();
    client
}

/// A client idle while its connection was cut must not fail its next call.
///
/// Many rounds: now and then the send right after the cut is taken by the
/// dead connection and never answered (the Redis client has not yet seen
/// the close); it must be sent again on the new connection within the
/// operation timeout, not reported as a timeout. About one round in 30
/// hits that.
#[tokio::test]
async fn the_first_call_after_an_idle_connection_was_cut_succeeds() {
    let server = RedisServer::start();
    let client = used_client(&server).await;
    for round in 0..80 {
        assert!(
            kill(&server, "normal") >= 1,
            "round {round}: nothing killed"
        );
        let key = unique("after-kill");
        let g = client
            .lock(&key)
            .await
            .unwrap_or_else(|e| panic!("round {round}: first call after the kill: {e}"));
        g.release()
            .await
            .unwrap_or_else(|e| panic!("round {round}: release: {e}"));
    }
}

/// Redis's own idle timeout (what proxies and load balancers do to quiet
/// services) closes the connection between two calls.
#[tokio::test]
async fn a_call_after_the_server_closed_the_idle_connection_succeeds() {
    let server = RedisServer::start_with(&["--save", "", "--appendonly", "no", "--timeout", "1"]);
    let client = used_client(&server).await;
    // Wait for Redis to close the idle connection (it checks about every
    // 100 ms once the second has passed).
    let closed = eventually(Duration::from_secs(10), || {
        let list: String = server.cmd(&["CLIENT", "LIST"]);
        list.lines().count() <= 1
    })
    .await;
    assert!(closed, "Redis did not close the idle connection");
    let g = client
        .lock(unique("after-idle"))
        .await
        .expect("first call after the idle cut");
    g.release().await.unwrap();
}

/// A waiter with time left rides out kills of its connections and still
/// gets the lock when the holder lets go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_rides_out_connection_kills() {
    let server = RedisServer::start();
    let holder = LockClient::connect(&server.url()).await.unwrap();
    let waiting = LockClient::builder()
        .retry_delay(Duration::from_secs(30))
        .connect(&server.url())
        .await
        .unwrap();
    let key = unique("ride-out");
    let held = holder.lock(&key).await.unwrap();
    let (w, k) = (waiting.clone(), key.clone());
    let waiter = tokio::spawn(async move { w.lock(&k).wait(Duration::from_secs(20)).await });
    assert!(eventually(Duration::from_secs(5), || waiting.waiting_here(&key) == 1).await);
    for _ in 0..3 {
        kill(&server, "normal");
        kill(&server, "pubsub");
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(
            !waiter.is_finished(),
            "the waiter gave up: {:?}",
            waiter.await
        );
    }
    // Subscribed again after the kills: the release wakes it, not the
    // 30 s fallback.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let released = Instant::now();
    held.release().await.unwrap();
    let g = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("the waiter was not woken by the release")
        .unwrap()
        .expect("the waiter failed");
    assert!(
        released.elapsed() < Duration::from_secs(2),
        "hand-off took {:?}",
        released.elapsed()
    );
    g.release().await.unwrap();
}

#[distributed_lock(key = "doc:{name}")]
async fn write(name: &str, pause: Duration) -> Result<(u64, u64), AppError> {
    let before = lock_runtime::current_fence().unwrap();
    tokio::time::sleep(pause).await;
    let after = lock_runtime::current_fence().unwrap();
    Ok((before, after))
}

#[distributed_lock(key = "doc:{name}")]
async fn write_both(name: &str, other: &str) -> Result<Vec<(u64, u64)>, AppError> {
    let mine = lock_runtime::current_fence().unwrap();
    // One body joins two others: each must see its own token, and this one
    // keeps its own after they ran.
    let other2 = format!("{other}-2");
    let (a, b) = tokio::join!(
        write(other, Duration::from_millis(30)),
        write(&other2, Duration::from_millis(10))
    );
    let after = lock_runtime::current_fence().unwrap();
    Ok(vec![(mine, after), a?, b?])
}

/// `current_fence()` inside each annotated body is that body's token,
/// whatever runs beside it in the same task.
#[tokio::test]
async fn each_joined_body_sees_its_own_token() {
    let server = global::redis().await;
    let (a, b) = (unique("a"), unique("b"));
    let (ra, rb) = tokio::join!(
        write(&a, Duration::from_millis(40)),
        write(&b, Duration::from_millis(5))
    );
    let (ra, rb) = (ra.unwrap(), rb.unwrap());
    // Every acquisition has a token of its own (one counter serves every
    // key): a body that saw another body's token would see it change, or
    // match that body's.
    let _ = server;
    assert_eq!(ra.0, ra.1, "body for {a} saw another token");
    assert_eq!(rb.0, rb.1, "body for {b} saw another token");
    assert_ne!(ra.0, rb.0);

    let (outer, inner) = (unique("outer"), unique("inner"));
    let seen = write_both(&outer, &inner).await.unwrap();
    for (i, (before, after)) in seen.iter().enumerate() {
        assert_eq!(before, after, "body {i} saw another token");
    }
    let distinct: std::collections::HashSet<u64> = seen.iter().map(|s| s.0).collect();
    assert_eq!(distinct.len(), 3, "two bodies saw one token: {seen:?}");

    // select!: the body that is polled sees its token, the other its own.
    let (c, d) = (unique("c"), unique("d"));
    let mut fc = Box::pin(write(&c, Duration::from_millis(20)));
    let mut fd = Box::pin(write(&d, Duration::from_secs(2)));
    let first = tokio::select! {
        r = &mut fc => r.unwrap(),
        _ = &mut fd => panic!("the slow body finished first"),
    };
    assert_eq!(first.0, first.1);
    let other = fd.await.unwrap();
    assert_eq!(other.0, other.1);
    assert_ne!(first.0, other.0);
    assert_eq!(lock_runtime::current_fence(), None);
}

#[distributed_lock(key = "vanish:{key}", lease = "1s", on_lost = "continue")]
async fn nested_long(key: &str) -> Result<(), AppError> {
    tokio::time::sleep(Duration::from_secs(4)).await;
    Ok(())
}

#[distributed_lock(key = "vanish:{key}", lease = "1s")]
async fn outer_that_loses(key: &str, server: &RedisServer) -> Result<(), AppError> {
    // The outer hold vanishes (failover, eviction, FLUSH) ...
    let _: i64 = server.cmd(&["DEL", &format!("lock:{{vanish:{key}}}")]);
    // ... and a nested call of the same key runs for longer than the lease.
    nested_long(key).await
}

/// A nested call must not hide the loss of the outer hold: the outer body
/// is told within about a renewal interval.
#[tokio::test]
async fn a_vanished_outer_hold_is_reported_lost_despite_a_nested_call() {
    let server = global::redis().await;
    let key = unique("vanish");
    let started = Instant::now();
    let out = outer_that_loses(&key, server).await;
    assert!(
        matches!(out, Err(AppError::Lock(LockError::Lost { .. }))),
        "{out:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "the loss surfaced only after {:?}",
        started.elapsed()
    );
    assert!(!server.exists(&format!("lock:{{vanish:{key}}}")));
}

/// A restart without persistence (or an evicted counter) forgets the fence
/// counter: tokens must still go up.
#[tokio::test]
async fn tokens_keep_increasing_when_the_counter_is_lost() {
    let mut server = RedisServer::start();
    let client = LockClient::builder()
        .op_timeout(Duration::from_secs(1))
        .connect(&server.url())
        .await
        .unwrap();
    let key = unique("token");
    let mut last = 0;
    for _ in 0..3 {
        let g = client.lock(&key).await.unwrap();
        assert!(g.fence() > last, "{} after {last}", g.fence());
        last = g.fence();
        g.release().await.unwrap();
    }
    server.restart();
    let g = client
        .lock(&key)
        .wait(Duration::from_secs(5))
        .await
        .expect("lock after the restart");
    assert!(
        g.fence() > last,
        "token {} after a restart, {last} before",
        g.fence()
    );
    last = g.fence();
    g.release().await.unwrap();
    // Evicted or deleted counter.
    let _: i64 = server.cmd(&["DEL", "lock:fence"]);
    let g = client.lock(&key).await.unwrap();
    assert!(
        g.fence() > last,
        "token {} after the counter was deleted, {last} before",
        g.fence()
    );
    g.release().await.unwrap();
}

/// A client that may not SUBSCRIBE (an ACL that forbids it, a proxy that
/// drops pub/sub) still waits: it falls back to timed retries.
#[tokio::test]
async fn a_refused_subscription_falls_back_to_timed_retries() {
    let server = RedisServer::start();
    let _: String = server.cmd(&[
        "ACL",
        "SETUSER",
        "nosub",
        "on",
        ">pw",
        "~*",
        "&*",
        "+@all",
        "-subscribe",
        "-ssubscribe",
        "-psubscribe",
    ]);
    let url = format!("redis://nosub:pw@127.0.0.1:{}", server.port());
    let holder = LockClient::connect(&server.url()).await.unwrap();
    let waiting = LockClient::builder()
        .retry_delay(Duration::from_millis(200))
        .connect(&url)
        .await
        .unwrap();
    let key = unique("nosub");
    let held = holder.lock(&key).await.unwrap();
    let (w, k) = (waiting.clone(), key.clone());
    let waiter = tokio::spawn(async move { w.lock(&k).wait(Duration::from_secs(10)).await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !waiter.is_finished(),
        "the waiter gave up: {:?}",
        waiter.await
    );
    held.release().await.unwrap();
    let g = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("the waiter never retried")
        .unwrap()
        .expect("the waiter failed instead of retrying on a timer");
    g.release().await.unwrap();
}

/// An attempt whose answer never came is taken back, also when the last
/// handle to the client is dropped right after: the client's I/O thread
/// stays up until that release is through.
#[tokio::test]
async fn an_unanswered_attempt_is_taken_back_after_the_client_is_dropped() {
    let server = RedisServer::start();
    let proxy = Proxy::for_server(&server);
    let client = LockClient::builder()
        .op_timeout(Duration::from_secs(1))
        .connect(&proxy.url())
        .await
        .unwrap();
    let key = unique("unsure");
    let name = format!("lock:{{{key}}}");
    // The acquire runs, its reply is lost, and the client cannot reconnect
    // to ask again: the attempt fails with the lock taken in Redis.
    proxy.lose_reply_to_then(&tests::reply_loss::acquire_sha(), Mode::Refuse);
    let err = client.lock(&key).await.unwrap_err();
    assert!(matches!(err, LockError::Backend(_)), "{err:?}");
    assert!(server.exists(&name), "the acquire did not run");
    drop(client);
    tokio::time::sleep(Duration::from_millis(100)).await;
    proxy.set(Mode::Pass);
    assert!(
        eventually(Duration::from_secs(3), || !server.exists(&name)).await,
        "the unanswered attempt left {name} (pttl {})",
        server.cmd::<i64>(&["PTTL", &name])
    );
}

/// A release whose reply is lost is sent again; by then a waiter may hold
/// the lock. That is the release having worked, not a lost lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_sent_again_after_a_waiter_took_the_lock_is_not_a_loss() {
    let server = RedisServer::start();
    let proxy = Proxy::for_server(&server);
    let holder = LockClient::connect(&proxy.url()).await.unwrap();
    let waiting = LockClient::connect(&server.url()).await.unwrap();
    let key = unique("handed");
    let held = holder.lock(&key).await.unwrap();
    let (w, k) = (waiting.clone(), key.clone());
    let waiter = tokio::spawn(async move { w.lock(&k).wait(Duration::from_secs(10)).await });
    assert!(eventually(Duration::from_secs(5), || waiting.waiting_here(&key) == 1).await);
    // The release runs and wakes the waiter; its reply is lost, and the
    // holder's way back to Redis is slow, so the waiter wins the race.
    proxy.lose_reply_to_then(
        &tests::reply_loss::release_sha(),
        Mode::Delay(Duration::from_millis(100)),
    );
    held.release()
        .await
        .expect("a release that ran is not a lost lock");
    assert_eq!(proxy.replies_lost(), 1);
    let g = waiter.await.unwrap().unwrap();
    assert_eq!(
        server.owner_of(&format!("lock:{{{key}}}")).as_deref(),
        Some(g.holder())
    );
    g.release().await.unwrap();
}

/// One lock name taken over by a key of another type (an older layout's
/// lock, foreign data) is that lock lost; it must not fail the renewal of
/// the other locks in the same batch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_key_fails_only_its_own_renewal() {
    let server = RedisServer::start();
    let client = LockClient::connect(&server.url()).await.unwrap();
    let lease = Duration::from_secs(2);
    let (a, b) = (unique("kept"), unique("taken"));
    let kept = client.lock(&a).lease(lease).await.unwrap();
    let taken = client.lock(&b).lease(lease).await.unwrap();
    let name = format!("lock:{{{b}}}");
    let _: i64 = server.cmd(&["DEL", &name]);
    let _: i64 = server.cmd(&["HSET", &name, "someone", "1"]);
    tokio::time::timeout(Duration::from_secs(5), taken.lost())
        .await
        .expect("the taken-over lock was not reported lost");
    tokio::time::sleep(lease * 2).await;
    assert!(
        !kept.is_lost(),
        "a foreign key in the batch failed every renewal"
    );
    kept.release().await.unwrap();
    assert!(matches!(taken.release().await, Err(LockError::Lost { .. })));
}
