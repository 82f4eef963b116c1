//! The attribute and manual API against a real `redis-server`, with checks of
//! what Redis holds at each step.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use lock_runtime::{distributed_lock, LockClient, LockError};
use tests::semantics::{self, AppError};
use tests::{eventually, global, unique, RedisServer};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mutual_exclusion_many_tasks() {
    global::redis().await;
    semantics::mutual_exclusion(32, 20).await;
}

#[distributed_lock(key = "rmw:{key}", wait = "30s")]
async fn redis_increment(
    key: &str,
    conn: &mut redis::aio::MultiplexedConnection,
) -> Result<(), AppError> {
    // A deliberate read-modify-write: only the lock makes it safe.
    let v: Option<i64> = redis::cmd("GET").arg(key).query_async(conn).await.unwrap();
    tokio::task::yield_now().await;
    let _: () = redis::cmd("SET")
        .arg(key)
        .arg(v.unwrap_or(0) + 1)
        .query_async(conn)
        .await
        .unwrap();
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mutual_exclusion_read_modify_write_in_redis() {
    let server = global::redis().await;
    let key = unique("counter");
    let (tasks, rounds) = (24, 25);
    let mut handles = Vec::new();
    for _ in 0..tasks {
        let key = key.clone();
        let url = server.url();
        handles.push(tokio::spawn(async move {
            let mut conn = redis::Client::open(url)
                .unwrap()
                .get_multiplexed_async_connection()
                .await
                .unwrap();
            for _ in 0..rounds {
                redis_increment(&key, &mut conn).await.unwrap();
            }
        }));
    }
    for h in handles {
        h.await.unwrap();
    }
    let n: i64 = server.cmd(&["GET", &key]);
    assert_eq!(n, (tasks * rounds) as i64);
}

#[tokio::test]
async fn try_once_fails_fast() {
    global::redis().await;
    semantics::try_once_fails_fast().await;
}

#[tokio::test]
async fn waiter_is_woken_by_release_message() {
    let server = global::redis().await;
    // Fallback retries far beyond the wait: only pub/sub can hand over.
    let client = LockClient::builder()
        .retry_delay(Duration::from_secs(600))
        .connect(&server.url())
        .await
        .unwrap();
    semantics::waiter_woken_by_release(&client).await;
}

#[tokio::test]
async fn reentrancy_counts_in_redis_and_frees_after_outermost() {
    let server = global::redis().await;
    let name = semantics::reentrancy().await;
    assert!(!server.exists(&format!("lock:{{{name}}}")));
}

#[distributed_lock(key = "count:{key}")]
async fn nested_probe(
    key: &str,
    depth: u32,
    seen: &mut Vec<(String, u64)>,
    url: &str,
) -> Result<(), AppError> {
    let name = format!("lock:{{count:{key}}}");
    let mut c = redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let owner: String = redis::cmd("GET")
        .arg(&name)
        .query_async(&mut c)
        .await
        .unwrap();
    seen.push((owner, lock_runtime::current_fence().unwrap()));
    if depth > 1 {
        Box::pin(nested_probe(key, depth - 1, seen, url)).await?;
    }
    Ok(())
}

/// Reentry is counted in the process: Redis keeps one owner and one token
/// for the whole nest.
#[tokio::test]
async fn reentry_keeps_one_owner_and_token_in_redis() {
    let server = global::redis().await;
    let key = unique("count");
    let mut seen = Vec::new();
    nested_probe(&key, 3, &mut seen, &server.url())
        .await
        .unwrap();
    assert_eq!(seen.len(), 3);
    assert!(seen.windows(2).all(|w| w[0] == w[1]), "{seen:?}");
    assert!(!server.exists(&format!("lock:{{count:{key}}}")));
}

#[tokio::test]
async fn redis_layout_owner_fence_and_cleanup() {
    let server = global::redis().await;
    let client = lock_runtime::client().unwrap();
    let key = unique("layout");
    let hash = format!("lock:{{{key}}}");
    let guard = client
        .lock(&key)
        .lease(Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(server.cmd::<String>(&["TYPE", &hash]), "string");
    let value: String = server.cmd(&["GET", &hash]);
    // The holder's owner id and its token.
    assert_eq!(value, format!("{} {}", guard.holder(), guard.fence()));
    assert!(guard.holder().starts_with(client.id()));
    let pttl: i64 = server.cmd(&["PTTL", &hash]);
    assert!(
        pttl > 5_000 && pttl <= 10_000,
        "lease is the expiry: {pttl}"
    );
    // The token came from the one counter of the server, set as the lock was.
    let counter: u64 = server.cmd(&["GET", "lock:fence"]);
    assert!(counter >= guard.fence());
    let counter_ttl: i64 = server.cmd(&["PTTL", "lock:fence"]);
    assert!(counter_ttl > 0, "the counter never expires: {counter_ttl}");
    guard.release().await.unwrap();
    assert!(
        server.keys(&format!("lock:{{{key}}}*")).is_empty(),
        "nothing of the lock stays after its release"
    );
}

#[tokio::test]
async fn release_on_question_mark_panic_and_cancel_leaves_nothing() {
    let server = global::redis().await;
    let names = semantics::release_on_every_exit().await;
    for name in names {
        let hash = format!("lock:{{{name}}}");
        assert!(
            eventually(Duration::from_secs(2), || !server.exists(&hash)).await,
            "{hash} left behind"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watchdog_keeps_a_one_second_lease_alive() {
    global::redis().await;
    semantics::watchdog_keeps_lease().await;
}

#[distributed_lock(key = "{key}", lease = "1s")]
async fn stoppable(
    key: &str,
    entered: tokio::sync::oneshot::Sender<()>,
    finished: &AtomicBool,
) -> Result<(), AppError> {
    let _ = entered.send(());
    tokio::time::sleep(Duration::from_secs(20)).await;
    finished.store(true, Ordering::SeqCst);
    Ok(())
}

#[tokio::test]
async fn deleted_lock_is_lost_and_body_stopped() {
    let server = global::redis().await;
    let key = unique("deleted");
    let finished = Arc::new(AtomicBool::new(false));
    let (tx, rx) = tokio::sync::oneshot::channel();
    let (k, f) = (key.clone(), finished.clone());
    let call = tokio::spawn(async move { stoppable(&k, tx, &f).await });
    rx.await.unwrap();
    let _: i64 = server.cmd(&["DEL", &format!("lock:{{{key}}}")]);
    // The next renewal (within lease/3 ≈ 333 ms) finds it gone.
    let res = tokio::time::timeout(Duration::from_secs(5), call)
        .await
        .expect("body was not stopped within 5 s")
        .unwrap();
    assert!(
        matches!(res, Err(AppError::Lock(LockError::Lost { .. }))),
        "{res:?}"
    );
    assert!(
        !finished.load(Ordering::SeqCst),
        "body ran on after the loss"
    );
}

#[tokio::test]
async fn manual_guard_reports_loss_on_release() {
    let server = global::redis().await;
    let client = lock_runtime::client().unwrap();
    let key = unique("manual-lost");
    let guard = client
        .lock(&key)
        .lease(Duration::from_secs(1))
        .await
        .unwrap();
    let _: i64 = server.cmd(&["DEL", &format!("lock:{{{key}}}")]);
    tokio::time::timeout(Duration::from_secs(5), guard.lost())
        .await
        .expect("loss noticed");
    assert!(guard.is_lost());
    assert!(matches!(guard.release().await, Err(LockError::Lost { .. })));
}

#[tokio::test]
async fn fences_strictly_increase_across_clients() {
    let server = global::redis().await;
    let a = LockClient::connect(&server.url()).await.unwrap();
    let b = LockClient::connect(&server.url()).await.unwrap();
    semantics::fences_increase(&[a, b, lock_runtime::client().unwrap()]).await;
}

#[tokio::test]
async fn empty_key_is_invalid() {
    global::redis().await;
    semantics::empty_key_rejected().await;
}

#[tokio::test]
async fn dropped_lock_future_leaves_no_lock() {
    let server = global::redis().await;
    let client = LockClient::connect(&server.url()).await.unwrap();
    // Drop acquire futures at many points, granted or not.
    for i in 0..200u64 {
        let key = format!("{}-{i}", unique("drop"));
        let fut = client.lock(&key).into_future();
        let budget = Duration::from_micros(i * 5);
        let _ = tokio::time::timeout(budget, fut).await;
    }
    assert!(
        eventually(Duration::from_secs(3), || server
            .keys("lock:{drop-*}")
            .is_empty())
        .await,
        "locks left behind: {:?}",
        server.keys("lock:{drop-*}")
    );
    assert!(eventually(Duration::from_secs(3), || client.held_count() == 0).await);
}

use std::future::IntoFuture;

/// What a body sees of its tokens: `current_fence()`, `current_fences()`.
type Seen = (Option<u64>, Vec<(String, u64)>);

#[distributed_lock(key = "unfenced:{id}", fence = false)]
async fn unfenced_body(id: u64) -> Result<Seen, AppError> {
    let _ = id;
    Ok((
        lock_runtime::current_fence(),
        lock_runtime::current_fences(),
    ))
}

/// `fence = false`: no token anywhere (the guard says 0, the body sees
/// none), the lock's value is its owner id alone (what a bare `SET NX PX`
/// writes), and the queue, hand-off and reentry work as with a token. A
/// fenced request behind an unfenced holder still gets a token.
#[tokio::test]
async fn a_lock_without_a_token_is_a_bare_value_and_still_hands_off() {
    let server = tests::RedisServer::start();
    let (a, b) = (
        LockClient::connect(&server.url()).await.unwrap(),
        LockClient::connect(&server.url()).await.unwrap(),
    );
    let key = unique("unfenced");
    let lock = format!("lock:{{{key}}}");
    let held = a.lock(&key).fence(false).await.unwrap();
    assert_eq!(held.fence(), 0);
    assert_eq!(server.try_get(&lock).as_deref(), Some(held.holder()));
    assert!(
        server.try_get("lock:fence").is_none(),
        "an unfenced lock wrote the token counter"
    );
    // Queued behind it: one waiter without a token, one with.
    let plain = tokio::spawn({
        let (b, key) = (b.clone(), key.clone());
        async move {
            b.lock(&key)
                .fence(false)
                .wait(Duration::from_secs(10))
                .await
        }
    });
    assert!(eventually(Duration::from_secs(5), || b.waiting_here(&key) == 1).await);
    let fenced = tokio::spawn({
        let (a, key) = (a.clone(), key.clone());
        async move { a.lock(&key).wait(Duration::from_secs(10)).await }
    });
    assert!(eventually(Duration::from_secs(5), || a.waiting_here(&key) == 1).await);
    held.release().await.unwrap();
    let g = plain.await.unwrap().expect("handed to the unfenced waiter");
    assert_eq!(g.fence(), 0, "an unfenced waiter was handed a token");
    g.release().await.unwrap();
    let g = fenced.await.unwrap().expect("handed to the fenced waiter");
    assert!(g.fence() > 0, "a fenced waiter was handed no token");
    g.release().await.unwrap();
    assert!(!server.exists(&lock));

    // The attribute: no token in the body.
    lock_runtime::with_client(a.clone(), async {
        let (fence, fences) = unfenced_body(7).await.unwrap();
        assert_eq!(fence, None);
        assert!(fences.is_empty(), "{fences:?}");
    })
    .await;
}

/// A service that locks `order:{id}` for many orders keeps no key per
/// order: after the locks are released, Redis holds the one token counter
/// (which expires after `fence_ttl` unused) and nothing else.
#[tokio::test]
async fn nothing_stays_per_lock_name() {
    let server = tests::RedisServer::start();
    let client = LockClient::builder()
        .fence_ttl(Duration::from_secs(60))
        .connect(&server.url())
        .await
        .unwrap();
    let mut last = 0;
    for i in 0..300 {
        let g = client.lock(format!("order:{i}")).await.unwrap();
        assert!(g.fence() > last, "tokens rise across names");
        last = g.fence();
        g.release().await.unwrap();
        let g = client.lock(format!("cart:{i}")).fence(false).await.unwrap();
        g.release().await.unwrap();
    }
    assert_eq!(server.keys("*"), ["lock:fence"]);
    let ttl: i64 = server.cmd(&["PTTL", "lock:fence"]);
    assert!(ttl > 0 && ttl <= 60_000, "the counter's TTL: {ttl}");
    // Once it lapsed (here: deleted), tokens still rise: they start at
    // the clock.
    let _: i64 = server.cmd(&["DEL", "lock:fence"]);
    let g = client.lock("order:0").await.unwrap();
    assert!(g.fence() > last);
    g.release().await.unwrap();
}

/// Replies lost on the cheapest paths: an unfenced lock's bare `SET` ran
/// but its answer was lost (sent again, it finds the lock this owner's and
/// takes it as such), and a release's answer was lost (the native
/// compare-and-delete where the server has one, else the script): sent
/// again, it finds the lock gone and counts as released.
#[tokio::test]
async fn lost_replies_on_the_bare_paths_neither_double_nor_leak() {
    let server = tests::RedisServer::start();
    let proxy = tests::proxy::Proxy::for_server(&server);
    let client = LockClient::connect(&proxy.url()).await.unwrap();
    let rival = LockClient::connect(&server.url()).await.unwrap();
    for fenced in [false, true] {
        let key = unique("bare-loss");
        let lock = format!("lock:{{{key}}}");
        // The acquire (a bare SET without a token, the script with one).
        let lost = proxy.replies_lost();
        proxy.lose_reply_to(if fenced { b"EVALSHA" } else { b"SET" });
        let g = client
            .lock(&key)
            .fence(fenced)
            .wait(Duration::ZERO)
            .await
            .unwrap();
        assert_eq!(proxy.replies_lost(), lost + 1, "no reply was lost");
        assert_eq!(g.fence() > 0, fenced);
        assert!(
            server
                .try_get(&lock)
                .is_some_and(|v| v.starts_with(g.holder())),
            "the lock is not the holder's"
        );
        assert!(matches!(
            rival.lock(&key).wait(Duration::ZERO).await,
            Err(LockError::Timeout { .. })
        ));
        // The release: whatever the server runs for it.
        proxy.lose_reply_to(b"");
        g.release()
            .await
            .expect("a release sent again counts as released");
        assert_eq!(proxy.replies_lost(), lost + 2, "no release reply was lost");
        assert!(!server.exists(&lock), "the lock was left behind");
    }
    assert_eq!(proxy.replies_lost(), 4);
}

/// A server whose own compare-and-delete this client may not run (an ACL
/// that allows scripts only; a node rolled back to a version without it):
/// the release falls back to the script, and the client stops trying the
/// native command. Where the server has none, the script is all it uses.
#[tokio::test]
async fn a_refused_native_release_falls_back_to_the_script() {
    let server = tests::RedisServer::start();
    let native: Vec<redis::Value> = server.cmd(&["COMMAND", "INFO", "DELIFEQ", "DELEX"]);
    let deny: Vec<String> = ["delifeq", "delex"]
        .iter()
        .zip(&native)
        .filter(|(_, info)| !matches!(info, redis::Value::Nil))
        .map(|(c, _)| format!("-{c}"))
        .collect();
    let mut acl = vec!["ACL", "SETUSER", "app", "on", ">pw", "~*", "&*", "+@all"];
    acl.extend(deny.iter().map(String::as_str));
    let _: () = server.cmd(&acl);
    let url = format!("redis://app:pw@127.0.0.1:{}", server.port());
    let client = LockClient::connect(&url).await.unwrap();
    for i in 0..3 {
        let key = unique("refused-native");
        let g = client.lock(&key).await.unwrap();
        g.release()
            .await
            .unwrap_or_else(|e| panic!("release {i} failed: {e}"));
        assert!(
            !server.exists(&format!("lock:{{{key}}}")),
            "release {i} left the lock"
        );
    }
    let refused: String = server.cmd(&["INFO", "errorstats"]);
    let noperm = refused
        .lines()
        .find_map(|l| l.strip_prefix("errorstat_NOPERM:count="))
        .and_then(|n| n.parse::<u64>().ok())
        .unwrap_or(0);
    assert_eq!(
        noperm,
        u64::from(!deny.is_empty()),
        "the native release is tried once where the server has it, then never again"
    );
}

/// Token counters past 2^53 (the end of a Lua number's exact integers)
/// still rise by exactly one, on every path that takes a token: a free
/// lock, a hand-off to a queued waiter, a permit. The scripts compare and
/// increment them as digit strings, with a carry. Before, `n + 1` was
/// computed in floating point: from 2^53 + 1 the next token came out as
/// 2^53, below the counter, and tokens stopped increasing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_counters_past_2_pow_53_rise_by_exactly_one() {
    tests::init_tracing();
    let server = RedisServer::start();
    let client = LockClient::connect(&server.url()).await.unwrap();
    let other = LockClient::connect(&server.url()).await.unwrap();
    let counter = || -> u64 {
        server
            .cmd::<String>(&["GET", "lock:fence"])
            .parse()
            .unwrap()
    };
    let start: u64 = (1 << 53) + 1;
    let _: () = server.cmd(&["SET", "lock:fence", &start.to_string()]);
    let mut last = start;
    for _ in 0..3 {
        let g = client.lock(unique("big-counter")).await.unwrap();
        assert_eq!(g.fence(), last + 1, "a free lock's token");
        assert_eq!(counter(), g.fence());
        last = g.fence();
        g.release().await.unwrap();
    }
    // Handed over: the waiter's queuing attempt takes a token too (a gap,
    // harmless); the hand-off's is the counter's next.
    let key = unique("big-hand-off");
    let held = client.lock(&key).await.unwrap();
    let waiter = tokio::spawn({
        let (other, key) = (other.clone(), key.clone());
        async move { other.lock(&key).wait(Duration::from_secs(20)).await }
    });
    assert!(eventually(Duration::from_secs(10), || other.waiting_here(&key) == 1).await);
    let before = counter();
    held.release().await.unwrap();
    let handed = waiter.await.unwrap().unwrap();
    assert_eq!(handed.fence(), before + 1, "the hand-off's token");
    handed.release().await.unwrap();
    let permit = client.semaphore(unique("big-permit"), 2).await.unwrap();
    assert_eq!(permit.fence(), before + 2, "a permit's token");
    permit.release().await.unwrap();
    // Readers share a hold's token: the one joining later gets it exactly
    // (an odd token past 2^53 has no exact Lua number).
    let _: () = server.cmd(&["SET", "lock:fence", &((1u64 << 53) + 2).to_string()]);
    let key = unique("big-readers");
    let first = client.read_lock(&key).await.unwrap();
    let second = other.read_lock(&key).await.unwrap();
    assert_eq!(first.fence(), (1 << 53) + 3, "a reader's token");
    assert_eq!(second.fence(), first.fence(), "a reader joining the hold");
    first.release().await.unwrap();
    second.release().await.unwrap();
    // Past u64 digits' carry: 10^16 - 1 rolls over to 17 digits.
    let _: () = server.cmd(&["SET", "lock:fence", "9999999999999999"]);
    let g = client.lock(unique("carry")).await.unwrap();
    assert_eq!(g.fence(), 10_000_000_000_000_000, "the carry");
    g.release().await.unwrap();
}

/// A token counter that holds no token (not an integer, or already at the
/// largest one a reply carries, `i64::MAX`: a Redis integer, and
/// PostgreSQL's `bigint`) is refused by every script that
/// hands out tokens, and left as it was: an acquire and a permit fail with
/// a `Backend` error that says why; a release that would hand the lock or
/// a permit to a fenced waiter frees it without handing it on, and the
/// waiter's own next ask is told why. Before, the hand-offs wrote the
/// clock over the counter and granted the waiter a token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_counter_holding_no_token_is_refused_by_every_script_and_left_as_it_was() {
    tests::init_tracing();
    let server = RedisServer::start();
    let url = server.url();
    let connect = || {
        LockClient::builder()
            .retry_delay(Duration::from_millis(50))
            .connect(&url)
    };
    let (client, other) = (connect().await.unwrap(), connect().await.unwrap());
    let counter = || server.cmd::<String>(&["GET", "lock:fence"]);
    for (bad, says) in [
        ("not a number", "integer"),
        ("9223372036854775807", "largest"),
    ] {
        let _: () = server.cmd(&["SET", "lock:fence", "1"]);
        let refused =
            |e: &LockError| matches!(e, LockError::Backend(_)) && e.to_string().contains(says);

        // A lock handed on.
        let key = unique("bad-counter-lock");
        let held = client.lock(&key).await.unwrap();
        let waiter = tokio::spawn({
            let (other, key) = (other.clone(), key.clone());
            async move {
                other
                    .lock(&key)
                    .wait(Duration::from_secs(20))
                    .await
                    .map(drop)
            }
        });
        assert!(eventually(Duration::from_secs(10), || other.waiting_here(&key) == 1).await);
        let _: () = server.cmd(&["SET", "lock:fence", bad]);
        held.release().await.unwrap();
        let err = waiter
            .await
            .unwrap()
            .expect_err("a waiter granted a lock without a token");
        assert!(refused(&err), "{bad}: the waiter got {err:?}");
        assert_eq!(counter(), bad, "a lock's hand-off changed the counter");
        assert!(
            client
                .inspect(&key)
                .await
                .unwrap()
                .is_none_or(|i| i.holders.is_empty()),
            "{bad}: {key} held"
        );

        // A permit handed on.
        let key = unique("bad-counter-permit");
        let _: () = server.cmd(&["SET", "lock:fence", "1"]);
        let held = client.semaphore(&key, 1).await.unwrap();
        let waiter = tokio::spawn({
            let (other, key) = (other.clone(), key.clone());
            async move {
                other
                    .semaphore(&key, 1)
                    .wait(Duration::from_secs(20))
                    .await
                    .map(drop)
            }
        });
        assert!(eventually(Duration::from_secs(10), || other.waiting_here(&key) == 1).await);
        let _: () = server.cmd(&["SET", "lock:fence", bad]);
        held.release().await.unwrap();
        let err = waiter
            .await
            .unwrap()
            .expect_err("a waiter granted a permit without a token");
        assert!(refused(&err), "{bad}: the permit's waiter got {err:?}");
        assert_eq!(counter(), bad, "a permit's hand-off changed the counter");

        // Asked directly.
        for err in [
            client
                .lock(unique("bad-counter"))
                .wait(Duration::ZERO)
                .await
                .map(drop)
                .unwrap_err(),
            client
                .semaphore(unique("bad-counter"), 2)
                .wait(Duration::ZERO)
                .await
                .map(drop)
                .unwrap_err(),
        ] {
            assert!(refused(&err), "{bad}: {err:?}");
        }
        assert_eq!(counter(), bad, "an acquire changed the counter");
    }
    // A counter of another type: refused by the hand-off as by an acquire.
    let _: i64 = server.cmd(&["DEL", "lock:fence"]);
    let key = unique("typed-counter");
    let held = client.lock(&key).await.unwrap();
    let waiter = tokio::spawn({
        let (other, key) = (other.clone(), key.clone());
        async move {
            other
                .lock(&key)
                .wait(Duration::from_secs(20))
                .await
                .map(drop)
        }
    });
    assert!(eventually(Duration::from_secs(10), || other.waiting_here(&key) == 1).await);
    let _: i64 = server.cmd(&["DEL", "lock:fence"]);
    let _: i64 = server.cmd(&["HSET", "lock:fence", "not", "a counter"]);
    held.release().await.unwrap();
    let err = waiter
        .await
        .unwrap()
        .expect_err("a waiter granted a lock without a token");
    assert!(
        matches!(&err, LockError::Backend(_)) && err.to_string().contains("WRONGTYPE"),
        "{err:?}"
    );
    let kind: String = server.cmd(&["TYPE", "lock:fence"]);
    assert_eq!(kind, "hash");
    let _: i64 = server.cmd(&["DEL", "lock:fence"]);
    // One below the largest: the last token there is, exactly.
    let _: () = server.cmd(&["SET", "lock:fence", "9223372036854775806"]);
    let g = client.lock(unique("largest")).await.unwrap();
    assert_eq!(g.fence(), i64::MAX as u64);
    g.release().await.unwrap();
    let _: i64 = server.cmd(&["DEL", "lock:fence"]);
}
