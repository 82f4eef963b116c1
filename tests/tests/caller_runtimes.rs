//! The connection a caller's runtime drives: one per runtime that uses the
//! client, opened on first use and gone with that runtime; and the undo of
//! an attempt sent over it, which must not overtake that attempt, also when
//! the runtime goes away with the attempt still on its way to Redis.

use std::future::IntoFuture;
use std::time::{Duration, Instant};

use lock_runtime::LockClient;
use tests::proxy::Proxy;
use tests::reply_loss::acquire_sha;
use tests::{eventually, unique, RedisServer};

fn hash(key: &str) -> String {
    format!("lock:{{{key}}}")
}

fn current_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn multi_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Connections of normal clients, less the one asking.
fn connections(server: &RedisServer) -> usize {
    let list: String = server.cmd(&["CLIENT", "LIST", "TYPE", "normal"]);
    list.lines().count() - 1
}

/// Wait (off any runtime) until `cond` holds; false after `limit`.
fn settles(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    while !cond() {
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    true
}

async fn cycle(client: &LockClient, key: &str) {
    let guard = client.lock(key).await.expect("lock");
    guard.release().await.expect("release");
}

#[test]
fn each_runtime_that_uses_the_client_has_one_connection_while_it_lives() {
    let server = RedisServer::start();
    let client = current_thread()
        .block_on(LockClient::connect(&server.url()))
        .unwrap();
    // The runtime that made the client is gone; the I/O thread's
    // connection stays.
    let base = connections(&server);
    assert_eq!(base, 1, "the I/O thread's connection");

    let mut runtimes: Vec<_> = (0..3).map(|_| current_thread()).collect();
    for rt in &runtimes {
        rt.block_on(cycle(&client, &unique("conn")));
        rt.block_on(cycle(&client, &unique("conn")));
    }
    assert_eq!(
        connections(&server),
        base + 3,
        "one connection per runtime that used the client, reused by its later calls"
    );

    // A multi-thread runtime: its tasks get one; what its `block_on` polls
    // (off its worker threads) goes over the I/O thread's.
    let mt = multi_thread();
    mt.block_on(cycle(&client, &unique("conn")));
    assert_eq!(connections(&server), base + 3);
    for _ in 0..2 {
        let (c, key) = (client.clone(), unique("conn"));
        mt.block_on(async move { tokio::spawn(async move { cycle(&c, &key).await }).await })
            .unwrap();
    }
    assert_eq!(connections(&server), base + 4);

    // Runtimes that go away take their connections along.
    drop(runtimes.pop());
    drop(runtimes.pop());
    drop(mt);
    assert!(
        settles(Duration::from_secs(5), || connections(&server) == base + 1),
        "{} connections left, {} expected",
        connections(&server),
        base + 1
    );

    // The client goes on working where it was used and in a new runtime.
    runtimes[0].block_on(cycle(&client, &unique("conn")));
    current_thread().block_on(cycle(&client, &unique("conn")));
    let left = server.keys("lock:{conn*");
    assert!(left.is_empty(), "locks left behind: {left:?}");
}

/// The caller gives up while its attempt, on its runtime's connection,
/// is still on its way to Redis; its runtime lives on. The undo must go
/// behind the attempt, on that same connection: sent over another, it
/// would reach Redis first, and the attempt would then take the lock for
/// nobody, for a whole lease.
#[tokio::test]
async fn an_undo_follows_its_attempt_on_the_runtime_connection() {
    let server = RedisServer::start();
    let proxy = Proxy::for_server(&server);
    let client = LockClient::connect(&proxy.url()).await.unwrap();
    // This runtime's connection is open; the next acquire goes over it.
    cycle(&client, &unique("warm")).await;
    let key = unique("undo");
    server.reset_stats();
    proxy.slow_connection_of(&acquire_sha(), Duration::from_secs(1), Duration::ZERO);
    let out = tokio::time::timeout(
        Duration::from_millis(200),
        client
            .lock(&key)
            .lease(Duration::from_secs(30))
            .into_future(),
    )
    .await;
    assert!(
        out.is_err(),
        "the acquire answered before it was dropped: {out:?}"
    );
    // Behind the attempt on that connection, slow as it is: both run, and
    // nothing is killed (this runtime runs).
    let clean = eventually(Duration::from_secs(5), || {
        server.calls("evalsha") >= 2 && !server.exists(&hash(&key))
    })
    .await;
    assert!(
        clean,
        "after the dropped acquire: {} EVALSHA ran, and `{}` is held for {} ms more",
        server.calls("evalsha"),
        hash(&key),
        server.cmd::<i64>(&["PTTL", &hash(&key)])
    );
    // The attempt was due a second after it was sent: it took nothing.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        !server.exists(&hash(&key)),
        "the attempt took `{}` after its undo",
        hash(&key)
    );
    assert_eq!(
        server.calls("client|kill"),
        0,
        "a running runtime's connection was killed"
    );
}

/// The caller's runtime lives on but stops running (a current-thread
/// runtime whose `block_on` gave up on the acquire and returned): nothing
/// drives its connection any more, so an undo queued there would wait as
/// long as the runtime rests, while the attempt, still on its way, takes
/// the lock for nobody. The undo gives that connection up, has it killed
/// with the attempt, and goes over the I/O thread's.
#[test]
fn an_undo_does_not_wait_on_a_runtime_that_stopped_running() {
    let server = RedisServer::start();
    let proxy = Proxy::for_server(&server);
    let main = current_thread();
    let client = main
        .block_on(
            LockClient::builder()
                .op_timeout(Duration::from_secs(1))
                .connect(&proxy.url()),
        )
        .unwrap();
    let key = unique("resting");
    let rt = current_thread();
    // Its connection is open; the next acquire goes over it.
    rt.block_on(cycle(&client, &unique("warm")));
    server.reset_stats();
    proxy.slow_connection_of(&acquire_sha(), Duration::from_secs(2), Duration::ZERO);
    let out = rt.block_on(async {
        tokio::time::timeout(
            Duration::from_millis(300),
            client
                .lock(&key)
                .lease(Duration::from_secs(30))
                .into_future(),
        )
        .await
    });
    assert!(
        out.is_err(),
        "the acquire answered before it was dropped: {out:?}"
    );
    assert_eq!(
        proxy.stats().slowed,
        1,
        "the attempt never reached the proxy"
    );
    // `rt` stays alive and idle from here on. The attempt is due two
    // seconds after it was sent: give it four.
    assert!(
        !taken_within(&main, &server, &key, Duration::from_secs(4)),
        "the attempt took `{}` for nobody ({} ms left), its undo stuck behind a runtime at rest",
        hash(&key),
        server.cmd::<i64>(&["PTTL", &hash(&key)])
    );
    assert_eq!(
        server.calls("client|kill"),
        1,
        "the resting runtime's connection was not killed"
    );
    drop(rt);
}

/// A runtime shuts down while an attempt of its task is on its way to
/// Redis (the proxy holds it a second): its connection closes with the
/// attempt still to arrive, and the request's undo cannot follow it there.
/// Returns the key, with the client (made on `main`, over `url`).
fn runtime_gone_mid_attempt(
    main: &tokio::runtime::Runtime,
    server: &RedisServer,
    proxy: &Proxy,
    url: &str,
) -> (LockClient, String) {
    let client = main.block_on(LockClient::connect(url)).unwrap();
    let key = unique("gone");
    let rt = current_thread();
    // Its connection is open; the next acquire goes over it.
    rt.block_on(cycle(&client, &unique("warm")));
    server.reset_stats();
    proxy.slow_connection_of(&acquire_sha(), Duration::from_secs(1), Duration::ZERO);
    rt.block_on(async {
        let (c, k) = (client.clone(), key.clone());
        tokio::spawn(async move {
            let _ = c.lock(k).lease(Duration::from_secs(30)).await;
        });
        assert!(
            eventually(Duration::from_secs(5), || proxy.stats().slowed == 1).await,
            "the attempt never reached the proxy"
        );
    });
    drop(rt);
    (client, key)
}

/// Whether `key` is taken within `window`.
fn taken_within(
    main: &tokio::runtime::Runtime,
    server: &RedisServer,
    key: &str,
    window: Duration,
) -> bool {
    main.block_on(eventually(window, || server.exists(&hash(key))))
}

/// Redis is told to drop the connection the runtime left behind before
/// the undo goes over another one: the attempt, arriving after, never runs.
#[test]
fn a_runtime_gone_with_an_attempt_on_its_way_leaves_no_lock() {
    let server = RedisServer::start();
    let proxy = Proxy::for_server(&server);
    let main = current_thread();
    let (_client, key) = runtime_gone_mid_attempt(&main, &server, &proxy, &proxy.url());
    // The undo ran (on the I/O thread), after the kill.
    assert!(
        main.block_on(eventually(Duration::from_secs(5), || server
            .calls("evalsha")
            >= 1)),
        "the undo never ran"
    );
    // The attempt is due a second after it was sent: give it three.
    assert!(
        !taken_within(&main, &server, &key, Duration::from_secs(3)),
        "the attempt of the runtime that went away took `{}` for {} ms, for nobody",
        hash(&key),
        server.cmd::<i64>(&["PTTL", &hash(&key)])
    );
    assert_eq!(
        server.calls("evalsha"),
        1,
        "the killed connection's attempt ran"
    );
    assert_eq!(
        server.calls("client|kill"),
        1,
        "the connection left behind was not killed"
    );
}

/// A user that may not kill connections: the undo is sent a second time,
/// an operation timeout later, and takes back what the attempt took
/// meanwhile.
#[test]
fn without_client_kill_the_undo_of_a_gone_runtime_is_sent_again() {
    let server = RedisServer::start();
    let _: String = server.cmd(&[
        "ACL",
        "SETUSER",
        "locker",
        "on",
        ">pw",
        "~*",
        "&*",
        "+@all",
        "-client|kill",
    ]);
    let proxy = Proxy::for_server(&server);
    let url = format!("redis://locker:pw@127.0.0.1:{}", proxy.port());
    let main = current_thread();
    let (_client, key) = runtime_gone_mid_attempt(&main, &server, &proxy, &url);
    let clean = main.block_on(eventually(Duration::from_secs(8), || {
        server.calls("evalsha") >= 3 && !server.exists(&hash(&key))
    }));
    assert!(
        clean,
        "{} EVALSHA ran, and `{}` is held for {} ms more",
        server.calls("evalsha"),
        hash(&key),
        server.cmd::<i64>(&["PTTL", &hash(&key)])
    );
}
