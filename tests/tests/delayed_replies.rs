//! Safety under delayed and repeated replies: a reply that comes back
//! seconds late while grant messages stay fast, a command a transport sends
//! twice, an undo that must not overtake what it undoes. Each test opens
//! one narrow window on purpose, against real Redis (and Sentinel).

use std::future::IntoFuture;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lock_runtime::{LockClient, LockError, LockGuard};
use tests::proxy::{Mode, Proxy};
use tests::reply_loss::{acquire_sha, renew_read_sha, renew_sha};
use tests::scripts;
use tests::sentinel::Sentinels;
use tests::{eventually, unique, RedisServer};

fn hash(key: &str) -> String {
    format!("lock:{{{key}}}")
}

fn queued(server: &RedisServer, key: &str) -> i64 {
    server.cmd(&["HLEN", &format!("{}:waiters", hash(key))])
}

/// Who held `key` when, as each holder saw it.
#[derive(Default)]
struct Exclusive {
    inside: AtomicBool,
}

impl Exclusive {
    /// Hold `guard` for `hold` as a writer would: nobody else may be inside
    /// meanwhile, and Redis must name this holder.
    async fn hold(&self, redis_url: &str, guard: LockGuard, hold: Duration) -> Result<u64, String> {
        let lock = hash(guard.key());
        let value: Option<String> = redis::Client::open(redis_url)
            .and_then(|c| c.get_connection())
            .and_then(|mut c| redis::cmd("GET").arg(&lock).query(&mut c))
            .map_err(|e| e.to_string())?;
        let value = value.unwrap_or_default();
        let held = value == guard.holder()
            || value.starts_with(&format!("{} ", guard.holder()))
            || value.starts_with("~r") && guard.holder().contains(":r");
        if !held {
            return Err(format!(
                "{} (token {}) runs its body while Redis says `{value}` holds the lock",
                guard.holder(),
                guard.fence()
            ));
        }
        if self.inside.swap(true, Ordering::SeqCst) {
            return Err(format!(
                "{} entered while another holder was inside",
                guard.holder()
            ));
        }
        tokio::time::sleep(hold).await;
        self.inside.store(false, Ordering::SeqCst);
        let fence = guard.fence();
        guard.release().await.map_err(|e| format!("release: {e}"))?;
        Ok(fence)
    }
}

/// The window of the orphan-grant race: a waiter's queuing attempt runs
/// but its reply is lost; the client sends it again, and that send reaches
/// Redis late (after the holder's release handed the lock to this very
/// owner) and is answered late too, more than a second after the grant
/// message (fast, on the subscription connection) arrived. The client must
/// not pass on a grant whose owner's attempt is still on its way back: the
/// attempt answers "held", and the next waiter must not get the lock
/// meanwhile.
async fn in_flight_grant(read: bool) {
    tests::init_tracing();
    let server = RedisServer::start();
    let proxy = Proxy::for_server(&server);
    proxy.spare_pubsub();
    let a = LockClient::connect(&server.url()).await.unwrap();
    let c = LockClient::connect(&server.url()).await.unwrap();
    let b = LockClient::builder()
        .op_timeout(Duration::from_secs(6))
        .connect(&proxy.url())
        .await
        .unwrap();
    let key = unique(if read { "in-flight-read" } else { "in-flight" });
    let held = a.lock(&key).lease(Duration::from_secs(30)).await.unwrap();
    // Another task of b waited here a moment and gave up: b's client still
    // listens on the lock's grant channel for a while, as a client whose
    // tasks keep waiting on a hot key does.
    let gave_up = b.lock(&key).wait(Duration::from_millis(300)).await;
    assert!(
        matches!(gave_up, Err(LockError::Timeout { .. })),
        "{gave_up:?}"
    );

    // b's next attempt runs, queues, and loses its reply; the attempt sent
    // again reaches Redis 800 ms later and its answer takes 1.5 s more.
    proxy.lose_reply_to_then_slow(
        &acquire_sha(),
        Duration::from_millis(800),
        Duration::from_millis(1500),
    );
    let excl = Arc::new(Exclusive::default());
    let b_task = {
        let (b, key, excl, server_url) = (b.clone(), key.clone(), excl.clone(), server.url());
        tokio::spawn(async move {
            let request = if read {
                b.read_lock(&key)
            } else {
                b.lock(&key)
            };
            let g = request
                .wait(Duration::from_secs(20))
                .await
                .map_err(|e| e.to_string())?;
            excl.hold(&server_url, g, Duration::from_millis(500)).await
        })
    };
    assert!(
        eventually(Duration::from_secs(5), || proxy.replies_lost() == 1).await,
        "b's attempt never lost its reply"
    );
    let c_task = {
        let (c, key, excl, server_url) = (c.clone(), key.clone(), excl.clone(), server.url());
        tokio::spawn(async move {
            let g = c
                .lock(&key)
                .wait(Duration::from_secs(20))
                .await
                .map_err(|e| e.to_string())?;
            excl.hold(&server_url, g, Duration::from_secs(2)).await
        })
    };
    assert!(
        eventually(Duration::from_secs(5), || queued(&server, &key) == 2).await,
        "b and c did not both queue"
    );
    let a_fence = held.fence();
    held.release().await.unwrap();
    let b_fence = b_task.await.unwrap().expect("b");
    let c_fence = c_task.await.unwrap().expect("c");
    assert!(
        a_fence < b_fence || read,
        "b's token {b_fence} is not above a's {a_fence}"
    );
    assert!(
        b_fence < c_fence,
        "c's token {c_fence} is not above b's {b_fence}"
    );
    assert!(
        eventually(Duration::from_secs(5), || server
            .keys(&format!("{}*", hash(&key)))
            .len()
            <= 1)
        .await,
        "left behind: {:?}",
        server.keys(&format!("{}*", hash(&key)))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_to_an_attempt_still_in_flight_is_not_passed_on() {
    in_flight_grant(false).await;
}

/// The same window for a reader handed the lock by a writer's release: the
/// next writer must not get it while the reader's late answer says "held".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_grant_to_an_attempt_still_in_flight_is_not_passed_on() {
    in_flight_grant(true).await;
}

/// Sentinel with `replica_acks`: the acquire (and its `WAIT`) goes on a
/// connection of its own. The caller gives up while that acquire is still
/// on its way to Redis; the release that takes it back must not arrive
/// first, or the acquire takes a lock nobody holds, for a whole lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_undone_acquire_with_replica_acks_leaves_no_lock() {
    tests::init_tracing();
    let primary = RedisServer::start();
    let proxy = Proxy::for_server(&primary);
    let sentinels = Sentinels::start_at(1, "undo", proxy.port(), Default::default());
    assert!(
        eventually(Duration::from_secs(10), || sentinels.primary_port()
            == Some(proxy.port()))
        .await,
        "the sentinel does not name the primary"
    );
    let client = LockClient::builder()
        .replica_acks(1, Duration::from_millis(500))
        .sentinel(sentinels.urls(), "undo")
        .await
        .unwrap();
    let key = unique("undo");
    primary.reset_stats();
    // The acquire reaches Redis a second late; the caller stops waiting
    // once it is on its way.
    proxy.slow_connection_of(&acquire_sha(), Duration::from_secs(1), Duration::ZERO);
    let out = tokio::select! {
        out = client.lock(&key).lease(Duration::from_secs(30)).into_future() => Some(out),
        _ = eventually(Duration::from_secs(10), || proxy.stats().slowed > 0) => None,
    };
    assert!(
        out.is_none(),
        "the acquire answered before it was dropped: {out:?}"
    );
    // Both the acquire and its undo ran; the lock is gone.
    let clean = eventually(Duration::from_secs(5), || {
        primary.calls("evalsha") >= 2 && !primary.exists(&hash(&key))
    })
    .await;
    assert!(
        clean,
        "after the dropped acquire: {} EVALSHA ran, and `{}` is held for {} ms more",
        primary.calls("evalsha"),
        hash(&key),
        primary.cmd::<i64>(&["PTTL", &hash(&key)])
    );
}

/// `acquire.lua` sent twice with the same arguments (a transport's own
/// re-send, without the flag that says "an earlier send may have queued
/// this owner"): the first send queued the owner, the lock expired, the
/// second send took it. The owner must not stay in the queue, and the
/// waiter behind it must still be served by the release.
#[test]
fn a_queuing_attempt_sent_twice_leaves_no_ghost_entry() {
    let server = RedisServer::start();
    let key = hash(&unique("ghost"));
    let keys = [
        key.clone(),
        format!("{key}:queue"),
        format!("{key}:waiters"),
    ];
    let mut conn = server.conn();
    let mut acquire =
        |owner: &str| scripts::acquire(&mut conn, &key, owner, 30_000, "10000", "f")[0];
    assert_eq!(acquire("x:1"), 1);
    assert_eq!(acquire("b:1"), 0, "b queues");
    assert_eq!(acquire("c:1"), 0, "c queues behind b");
    // x's lease runs out; then b's attempt arrives once more.
    let _: i64 = server.cmd(&["DEL", &key]);
    assert_eq!(
        acquire("b:1"),
        1,
        "the repeated attempt takes the free lock"
    );
    let queue: Vec<String> = server.cmd(&["LRANGE", &keys[1], "0", "-1"]);
    let b_waits: i64 = server.cmd(&["HEXISTS", &keys[2], "b:1"]);
    assert_eq!(queue, ["c:1"], "b holds the lock and is still queued");
    assert_eq!(
        b_waits, 0,
        "b holds the lock and still has a waiter's entry"
    );
    let value = server.try_get(&key).unwrap_or_default();
    let fields: Vec<&str> = value.split(' ').collect();
    assert!(
        fields.len() == 3 && fields[0] == "b:1" && fields[2] == "q",
        "c waits, so b's release must hand the lock over; the lock holds `{value}`"
    );
}

/// A renewal is on the wire when the holder releases with `min_hold` left
/// (the lock is left to expire at its `min_hold`); a transport sends that
/// renewal again after the release. It must not give the lock its whole
/// lease back: the next instance's job would wait that long.
async fn renewal_after_min_hold_release(read: bool) {
    tests::init_tracing();
    let server = RedisServer::start();
    let proxy = Proxy::for_server(&server);
    let client = LockClient::connect(&proxy.url()).await.unwrap();
    let key = unique(if read { "kept-read" } else { "kept" });
    let request = if read {
        client.read_lock(&key)
    } else {
        client.lock(&key)
    };
    let guard = request
        .lease(Duration::from_secs(9))
        .min_hold(Duration::from_secs(5))
        .await
        .unwrap();
    // The watchdog renews at lease/3 = 3 s; a copy of that renewal reaches
    // Redis again 600 ms later.
    let sha = if read { renew_read_sha() } else { renew_sha() };
    proxy.resend(&sha, Duration::from_millis(600));
    assert!(
        eventually(Duration::from_secs(10), || !proxy.resend_armed()).await,
        "no renewal went out"
    );
    let released = Instant::now();
    guard.release().await.unwrap();
    let left_ms = 5000 - 3000;
    let ttl: i64 = server.cmd(&["PTTL", &hash(&key)]);
    assert!(ttl > 0 && ttl <= left_ms, "after the release: PTTL {ttl}");
    assert!(
        proxy.resent(1, Duration::from_secs(5)).await,
        "the copy never ran"
    );
    assert!(
        released.elapsed() < Duration::from_millis(left_ms as u64),
        "the copy came too late to matter"
    );
    let ttl: i64 = server.cmd(&["PTTL", &hash(&key)]);
    assert!(
        ttl <= left_ms,
        "the renewal sent again after the min_hold release gave the lock {ttl} ms (min_hold left {left_ms} ms)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_sent_again_after_a_min_hold_release_restores_no_lease() {
    renewal_after_min_hold_release(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_renewal_sent_again_after_a_min_hold_release_restores_no_lease() {
    renewal_after_min_hold_release(true).await;
}

/// A wait that saw the lock busy and never free ends as `Timeout`, by its
/// deadline plus at most one operation timeout, even when Redis stops
/// answering this client halfway through the wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_wait_whose_server_goes_silent_ends_as_timeout_in_time() {
    tests::init_tracing();
    let server = RedisServer::start();
    let proxy = Proxy::for_server(&server);
    let holder = LockClient::connect(&server.url()).await.unwrap();
    let op_timeout = Duration::from_millis(600);
    let waiter = LockClient::builder()
        .op_timeout(op_timeout)
        .retry_delay(Duration::from_millis(200))
        .connect(&proxy.url())
        .await
        .unwrap();
    let key = unique("silent");
    let _held = holder
        .lock(&key)
        .lease(Duration::from_secs(30))
        .await
        .unwrap();
    let wait = Duration::from_secs(2);
    let task = {
        let (w, key) = (waiter.clone(), key.clone());
        tokio::spawn(async move {
            let started = Instant::now();
            let out = w.lock(&key).wait(wait).await;
            (out, started.elapsed())
        })
    };
    // Queued, and told so: it listens for its grant once the busy answer
    // came back.
    let told = eventually(Duration::from_secs(5), || {
        let listening: Vec<String> =
            server.cmd(&["PUBSUB", "CHANNELS", &format!("{}:granted:*", hash(&key))]);
        queued(&server, &key) == 1 && listening.len() == 1
    })
    .await;
    assert!(told, "the waiter never queued");
    proxy.set(Mode::Blackhole);
    let (out, took) = task.await.unwrap();
    proxy.set(Mode::Pass);
    assert!(
        matches!(out, Err(LockError::Timeout { .. })),
        "the lock was busy the whole wait, yet: {out:?}"
    );
    // Margin for a loaded machine: the bound is wait + op_timeout.
    assert!(
        took < wait + op_timeout + Duration::from_millis(1500),
        "a {wait:?} wait took {took:?}"
    );
}

/// A renewal round waiting on a slow connection must not blind the
/// watchdog. The I/O thread's connection (renewals) turns slow; a 1 s hold
/// taken meanwhile over the caller's connection (fast) lapses in Redis at
/// its deadline: its holder must be told `Lost` by then, and before another
/// client gets the key, not when the slow round returns seconds later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hold_taken_while_a_renewal_round_is_out_is_declared_lost_at_its_deadline() {
    tests::init_tracing();
    let server = RedisServer::start();
    let proxy = Proxy::for_server(&server);
    proxy.spare_pubsub();
    let a = LockClient::builder()
        .op_timeout(Duration::from_secs(10))
        .connect(&proxy.url())
        .await
        .unwrap();
    let b = LockClient::connect(&server.url()).await.unwrap();
    // The first renewal turns its connection, the I/O thread's, slow: its
    // replies come 30 s late.
    proxy.slow_connection_of(&renew_sha(), Duration::ZERO, Duration::from_secs(30));
    let long_lease = Duration::from_secs(8);
    let _long = a
        .lock(unique("round-out-long"))
        .lease(long_lease)
        .await
        .unwrap();
    assert!(
        eventually(Duration::from_secs(10), || proxy.stats().slowed == 1).await,
        "the renewal never went out"
    );
    // That round waits until the long hold's deadline, about 5 s from now.
    let round_out = Instant::now();
    let key = unique("round-out-short");
    let lease = Duration::from_secs(1);
    let sent = Instant::now();
    // From a task: its commands go over its runtime's connection (the
    // test body itself, polled by `block_on`, is served by the I/O
    // thread's).
    let short = {
        let (a, key) = (a.clone(), key.clone());
        tokio::spawn(async move { a.lock(&key).lease(lease).await })
    };
    let short = Arc::new(short.await.unwrap().unwrap());
    assert!(
        sent.elapsed() < Duration::from_millis(500),
        "the caller's connection was slow too: the scenario did not happen"
    );
    let b_task = {
        let (b, key, short) = (b.clone(), key.clone(), short.clone());
        tokio::spawn(async move {
            let g = b.lock(&key).wait(Duration::from_secs(15)).await;
            // Looked at before anything else: was the first holder told?
            let told = short.is_lost();
            (g.map(|g| g.fence()), told, sent.elapsed())
        })
    };
    let lost = tokio::time::timeout(Duration::from_secs(15), short.lost()).await;
    let lost_after = sent.elapsed();
    assert!(lost.is_ok(), "the 1 s hold was never declared lost");
    // The deadline is `lease` after the acquire was sent; margin for a
    // loaded machine, well short of the round's return.
    assert!(
        lost_after < lease + Duration::from_millis(500),
        "the 1 s hold was declared lost {lost_after:?} after it was taken (the slow round went out {:?} before it)",
        sent - round_out
    );
    let (b_got, told, b_after) = b_task.await.unwrap();
    println!(
        "declared lost {lost_after:?} after the acquire was sent; b got the key {b_after:?} after"
    );
    assert!(b_got.is_ok(), "b never got the lapsed lock: {b_got:?}");
    assert!(
        told,
        "b took the key {b_after:?} after a's acquire while a's guard still said it held it"
    );
}

/// Every reply takes 0.6 × `op_timeout`: each command is answered within
/// its operation timeout, so nothing may fail. Locks are taken, renewed
/// (held past their lease) and released for a few seconds by four tasks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replies_slower_than_half_the_op_timeout_fail_no_call_and_lose_no_lock() {
    tests::init_tracing();
    let server = RedisServer::start();
    let proxy = Proxy::for_server(&server);
    let op_timeout = Duration::from_secs(1);
    let client = LockClient::builder()
        .op_timeout(op_timeout)
        .connect(&proxy.url())
        .await
        .unwrap();
    proxy.set(Mode::DelayReplies(op_timeout.mul_f64(0.6)));
    let until = Instant::now() + Duration::from_secs(8);
    let lease = Duration::from_secs(2);
    let tasks: Vec<_> = (0..4)
        .map(|t| {
            let client = client.clone();
            tokio::spawn(async move {
                let (mut held, mut failed) = (0, Vec::new());
                let mut round = 0;
                while Instant::now() < until {
                    round += 1;
                    let key = unique(&format!("slow-replies-{t}"));
                    let g = match client
                        .lock(&key)
                        .lease(lease)
                        .wait(Duration::from_secs(5))
                        .await
                    {
                        Ok(g) => g,
                        Err(e) => {
                            failed.push(format!("task {t} round {round}: lock: {e}"));
                            continue;
                        }
                    };
                    // Past the lease: only answered renewals keep it.
                    tokio::time::sleep(lease + Duration::from_millis(800)).await;
                    if g.is_lost() {
                        failed.push(format!("task {t} round {round}: declared lost"));
                    }
                    match g.release().await {
                        Ok(()) => held += 1,
                        Err(e) => failed.push(format!("task {t} round {round}: release: {e}")),
                    }
                }
                (held, failed)
            })
        })
        .collect();
    let (mut held, mut failed) = (0, Vec::new());
    for t in tasks {
        let (h, f) = t.await.unwrap();
        held += h;
        failed.extend(f);
    }
    proxy.set(Mode::Pass);
    println!("held and released {held}, failed {}", failed.len());
    assert!(failed.is_empty(), "{} failed: {failed:#?}", failed.len());
    assert!(held >= 4, "only {held} locks held");
}

/// Replies come 0.6 × `op_timeout` late, and the key is busy: a
/// `try_acquire` whose one send ran (busy) while its holder let go before
/// the answer came back leaves nothing behind. A second copy of the
/// command sent beside the first at half the timeout (on the same live
/// connection, behind it) took the free lock for an owner that had
/// already been told "busy" and given up: nobody renewed or released it,
/// and the key was held for a whole lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_busy_answer_leaves_no_lock_behind() {
    tests::init_tracing();
    let server = RedisServer::start();
    let proxy = Proxy::for_server(&server);
    let op_timeout = Duration::from_secs(1);
    let a = LockClient::builder()
        .op_timeout(op_timeout)
        .connect(&proxy.url())
        .await
        .unwrap();
    let holder = LockClient::connect(&server.url()).await.unwrap();
    // Every connection `a` uses is open before replies slow down.
    a.lock(unique("warm-up"))
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let warm = {
        let a = a.clone();
        tokio::spawn(async move { a.lock(unique("warm-up")).await.unwrap().release().await })
    };
    warm.await.unwrap().unwrap();
    let key = unique("late-busy");
    let name = format!("lock:{{{key}}}");
    // A long lease: no renewal of the holder's runs in the window below.
    let held = holder
        .lock(&key)
        .lease(Duration::from_secs(60))
        .await
        .unwrap();
    proxy.set(Mode::DelayReplies(op_timeout.mul_f64(0.6)));
    let before = server.calls("evalsha");
    let attempt = {
        let (a, key) = (a.clone(), key.clone());
        tokio::spawn(async move { a.lock(&key).try_acquire().await })
    };
    // Its send ran on Redis (busy); the holder lets go before half the
    // operation timeout, while that answer is still on its way back.
    assert!(
        eventually(Duration::from_secs(5), || server.calls("evalsha") > before).await,
        "the attempt never reached Redis"
    );
    held.release().await.unwrap();
    let got = attempt.await.unwrap();
    assert!(
        matches!(got, Ok(None)),
        "the attempt's one send found the lock busy: {got:?}"
    );
    proxy.set(Mode::Pass);
    // Anything of the attempt still on its way would land within the
    // operation timeout.
    let stayed_free = !eventually(op_timeout * 2, || server.exists(&name)).await;
    assert!(
        stayed_free,
        "a lock nobody holds appeared after the busy answer: {:?} (PTTL {} ms)",
        server.cmd::<Option<String>>(&["GET", &name]),
        server.cmd::<i64>(&["PTTL", &name])
    );
    assert!(holder.lock(&key).try_acquire().await.unwrap().is_some());
}
