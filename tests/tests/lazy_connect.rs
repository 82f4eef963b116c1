//! `LockClient::connect_lazy`: a service that starts before its Redis.
//! Nothing is sent until the first call; calls fail within their bounds
//! while Redis is down, and work once it is up.

use std::time::{Duration, Instant};

use lock_runtime::{LockClient, LockError};
use tests::proxy::{Mode, Proxy};
use tests::{free_port, unique, RedisServer};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_started_before_redis_works_once_redis_is_up() {
    tests::init_tracing();
    let port = free_port();
    let url = format!("redis://127.0.0.1:{port}");
    let built = Instant::now();
    let client = LockClient::builder()
        .lease(Duration::from_secs(1))
        .connect_lazy(&url)
        .expect("no I/O: nothing to fail on");
    assert!(built.elapsed() < Duration::from_secs(1));
    assert!(matches!(
        LockClient::connect_lazy("redis://127.0.0.1:notaport"),
        Err(LockError::Config(_))
    ));

    // Redis is not up: a call fails within its bounds, as a connected
    // client's does when Redis goes away.
    let key = unique("lazy");
    for wait in [Duration::from_secs(1), Duration::from_secs(5)] {
        let asked = Instant::now();
        let out = client.lock(&key).wait(wait).await;
        let took = asked.elapsed();
        println!("with Redis down, a lock call with wait {wait:?} failed after {took:?}: {out:?}");
        assert!(matches!(out, Err(LockError::Backend(_))), "{out:?}");
        assert!(took < wait + Duration::from_secs(3), "took {took:?}");
    }

    let server = RedisServer::start_on(port, &["--save", "", "--appendonly", "no"]);
    let asked = Instant::now();
    let guard = client
        .lock(&key)
        .wait(Duration::from_secs(5))
        .await
        .expect("the first lock once Redis is up");
    println!(
        "the first lock once Redis was up took {:?}",
        asked.elapsed()
    );
    assert!(guard.fence() > 0);
    assert!(server.exists(&format!("lock:{{{key}}}")));
    // Held past two renewals of its 1 s lease: the watchdog's connection
    // (opened lazily too) renews it.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(!guard.is_lost());
    guard.release().await.expect("held to the end");
    assert!(!server.exists(&format!("lock:{{{key}}}")));
}

/// The first open is refused for another reason than I/O (an ACL user that
/// is not made yet, as on a deploy that creates it after the service): once
/// the user exists, the client works, renewals included. The `redis`
/// crate's own lazy connection kept that first error for good: everything
/// sent over the I/O thread's connection (renewals, background releases,
/// calls from outside a runtime's tasks) failed with it until the process
/// restarted ("acquire.lua …: Password authentication failed").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_open_refused_by_auth_is_tried_again() {
    tests::init_tracing();
    let server = RedisServer::start();
    let url = format!("redis://app:secret@127.0.0.1:{}", server.port());
    let client = LockClient::builder()
        .lease(Duration::from_secs(1))
        .connect_lazy(&url)
        .unwrap();
    // Each of its connections is refused: no such user yet.
    let out = client.lock(unique("early")).wait(Duration::ZERO).await;
    assert!(matches!(out, Err(LockError::Backend(_))), "{out:?}");
    // The watchdog's connection too.
    assert!(client.inspect("early").await.is_err());

    let _: () = server.cmd(&[
        "ACL", "SETUSER", "app", "on", ">secret", "~*", "&*", "+@all",
    ]);
    let key = unique("after-acl");
    let guard = client
        .lock(&key)
        .wait(Duration::from_secs(5))
        .await
        .expect("a lock once the user exists");
    assert!(client.inspect(&key).await.expect("inspect").is_some());
    // Held past two renewals of its 1 s lease.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(!guard.is_lost(), "renewals failed after the user was made");
    guard.release().await.expect("held to the end");
}

/// A host that accepts connections and never answers (a stalled server
/// behind a live port). A lazy client's first call that may try once
/// fails within one attempt (`connect_timeout` + `op_timeout`), as
/// `connect` would; a call with wait left does not sit on its first open
/// for its whole wait: it opens anew while the host stays silent, and
/// takes the lock once the host answers. (Issue 40 read that the first call
/// took its whole wait instead of `connect_timeout`: it takes its wait
/// only while nothing answers, as a connected client's call does when its
/// Redis goes silent, and failing sooner would fail a call with time left.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_call_against_a_host_that_never_answers() {
    tests::init_tracing();
    let server = RedisServer::start();
    let proxy = Proxy::for_server(&server);
    proxy.set(Mode::Blackhole);
    let (connect_timeout, op_timeout) = (Duration::from_millis(300), Duration::from_secs(1));
    let client = LockClient::builder()
        .connect_timeout(connect_timeout)
        .op_timeout(op_timeout)
        .connect_lazy(&proxy.url())
        .unwrap();
    let asked = Instant::now();
    let out = client.lock(unique("silent")).wait(Duration::ZERO).await;
    let took = asked.elapsed();
    println!("a host that never answers: a call that tries once failed after {took:?}: {out:?}");
    assert!(matches!(out, Err(LockError::Backend(_))), "{out:?}");
    assert!(
        took < connect_timeout + op_timeout + Duration::from_secs(1),
        "took {took:?}"
    );

    let key = unique("silent-then-up");
    let wait = Duration::from_secs(10);
    let call = tokio::spawn({
        let client = client.clone();
        async move {
            let asked = Instant::now();
            let out = client.lock(&key).wait(wait).await;
            (out, asked.elapsed())
        }
    });
    tokio::time::sleep(Duration::from_secs(2)).await;
    let opened = proxy.stats().accepted;
    // The stalled server is replaced: what it held is gone, the port answers.
    proxy.set(Mode::Pass);
    proxy.cut();
    let (out, took) = call.await.unwrap();
    println!("the host answered 2 s into a call with wait {wait:?}: {took:?}, {opened} connections opened while silent");
    let guard = out.expect("a call with wait left takes the lock once the host answers");
    assert!(took < wait, "{took:?}");
    assert!(
        opened > 2,
        "the first call sat on one open: {opened} connections"
    );
    guard.release().await.expect("held to the end");
}
