//! Scheduled jobs against a real `redis-server`: `on_busy = "skip"`,
//! `min_hold` (lockAtLeastFor), `max_hold` (lockAtMostFor) and
//! `try_acquire`, with the attribute on the global client and by hand.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use lock_runtime::{distributed_lock, LockClient, LockError};
use tests::proxy::{Mode, Proxy};
use tests::{eventually, global, unique, RedisServer};

static RAN: AtomicU32 = AtomicU32::new(0);

#[distributed_lock(key = "job:{name}", wait = "0s", on_busy = "skip")]
async fn job(name: &str) -> Result<u32, LockError> {
    let _ = name;
    Ok(RAN.fetch_add(1, Ordering::SeqCst) + 1)
}

#[distributed_lock(key = "hung:{name}", lease = "1500ms", max_hold = "2s")]
async fn hung(name: &str) -> Result<(), LockError> {
    let _ = name;
    std::future::pending::<()>().await;
    Ok(())
}

/// `max_hold` below the client's default lease (30 s), no `lease` beside
/// it: the lease is `max_hold`. The lease left, seen from the body.
#[distributed_lock(key = "short:{name}", max_hold = "2s")]
async fn short(name: &str) -> Result<Option<Duration>, LockError> {
    let info = lock_runtime::client()?
        .inspect(format!("short:{name}"))
        .await?;
    Ok(info.and_then(|i| i.ttl))
}

fn lock_key(key: &str) -> String {
    format!("lock:{{{key}}}")
}

#[tokio::test]
async fn a_busy_job_is_skipped_with_the_default_value_and_its_body_does_not_run() {
    let server = global::redis().await;
    let client = lock_runtime::client().unwrap();
    let name = unique("nightly");
    let other = client.lock(format!("job:{name}")).await.unwrap();
    let before = RAN.load(Ordering::SeqCst);
    assert_eq!(job(&name).await.unwrap(), 0, "skipped: u32::default()");
    assert_eq!(
        RAN.load(Ordering::SeqCst),
        before,
        "the body ran while busy"
    );
    // The other instance's lock is untouched.
    assert!(server.exists(&lock_key(&format!("job:{name}"))));
    other.release().await.unwrap();
    assert!(
        job(&name).await.unwrap() > before,
        "free again: the body runs"
    );
}

#[tokio::test]
async fn try_acquire_says_none_when_busy_and_leaves_nothing_behind_when_dropped() {
    let server = global::redis().await;
    let client = lock_runtime::client().unwrap();
    let key = unique("try");
    let held = client
        .lock(&key)
        .try_acquire()
        .await
        .unwrap()
        .expect("free");
    assert!(client.lock(&key).try_acquire().await.unwrap().is_none());
    assert!(client
        .lock(&key)
        .wait(Duration::from_millis(50))
        .try_acquire()
        .await
        .unwrap()
        .is_none());
    held.release().await.unwrap();
    // Dropped while it may have been granted: no lock is left behind.
    for _ in 0..20 {
        let fut = client.lock(&key).try_acquire();
        let _ = tokio::time::timeout(Duration::from_micros(50), fut).await;
    }
    assert!(
        eventually(Duration::from_secs(5), || !server.exists(&lock_key(&key))).await,
        "a dropped try_acquire left its lock behind"
    );
}

#[tokio::test]
async fn min_hold_leaves_the_lock_to_expire_and_a_later_release_deletes_it() {
    let server = global::redis().await;
    let client = lock_runtime::client().unwrap();
    let key = unique("min-hold");
    let taken = Instant::now();
    let guard = client
        .lock(&key)
        .lease(Duration::from_secs(30))
        .min_hold(Duration::from_secs(3))
        .await
        .unwrap();
    guard.release().await.unwrap();
    let name = lock_key(&key);
    let pttl: i64 = server.cmd(&["PTTL", &name]);
    let bound = 3000 - taken.elapsed().as_millis() as i64;
    assert!(
        pttl > 0 && pttl <= bound + 250,
        "after an early release the lock expires at min_hold: pttl {pttl} ms, at most {bound} ms"
    );
    // Nothing renews it: its TTL only goes down, and it is busy meanwhile.
    assert!(client.lock(&key).try_acquire().await.unwrap().is_none());
    tokio::time::sleep(Duration::from_millis(300)).await;
    let later: i64 = server.cmd(&["PTTL", &name]);
    assert!(later > 0 && later < pttl, "pttl {pttl} then {later}");

    // Released after min_hold: deleted as usual.
    let key2 = unique("min-hold-past");
    let guard = client
        .lock(&key2)
        .min_hold(Duration::from_millis(100))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(150)).await;
    guard.release().await.unwrap();
    assert!(!server.exists(&lock_key(&key2)));
}

#[tokio::test]
async fn a_waiter_queued_behind_a_min_hold_gets_the_lock_when_it_lapses() {
    global::redis().await;
    let client = lock_runtime::client().unwrap();
    let key = unique("min-hold-queue");
    let guard = client
        .lock(&key)
        .min_hold(Duration::from_millis(800))
        .await
        .unwrap();
    let waiter = {
        let (client, key) = (client.clone(), key.clone());
        tokio::spawn(async move {
            let t = Instant::now();
            let g = client.lock(&key).wait(Duration::from_secs(10)).await;
            (g, t.elapsed())
        })
    };
    // The waiter is queued before the release.
    assert!(eventually(Duration::from_secs(5), || client.waiting_here(&key) > 0).await);
    guard.release().await.unwrap();
    let (g, waited) = waiter.await.unwrap();
    let g = g.expect("the waiter gets the lock once min_hold lapses");
    assert!(
        waited >= Duration::from_millis(400),
        "taken {waited:?} after asking: before min_hold was over"
    );
    g.release().await.unwrap();
}

#[tokio::test]
async fn a_dropped_guard_with_min_hold_leaves_the_lock_to_expire_at_min_hold() {
    // The drop path ends the hold in the background: a compare-and-expire,
    // not a delete.
    let server = global::redis().await;
    let client = lock_runtime::client().unwrap();
    let key = unique("min-hold-twice");
    let taken = Instant::now();
    let guard = client
        .lock(&key)
        .min_hold(Duration::from_millis(1500))
        .await
        .unwrap();
    drop(guard); // background: compare-and-expire
    let name = lock_key(&key);
    assert!(
        eventually(Duration::from_secs(2), || {
            let pttl: i64 = server.cmd(&["PTTL", &name]);
            pttl > 0 && pttl <= 1550
        })
        .await,
        "a dropped guard with min_hold left its lock to expire at min_hold"
    );
    assert!(
        eventually(Duration::from_secs(5), || !server.exists(&name)).await,
        "the lock did not lapse"
    );
    assert!(taken.elapsed() >= Duration::from_millis(1400));
}

#[tokio::test]
async fn max_hold_stops_renewal_and_the_body_ends_with_lost() {
    let server = global::redis().await;
    let name = unique("hung");
    let t = Instant::now();
    let out = tokio::time::timeout(Duration::from_secs(10), hung(&name)).await;
    let took = t.elapsed();
    match out {
        Ok(Err(LockError::MaxHoldReached { max_hold, .. })) => {
            assert_eq!(max_hold, Duration::from_secs(2));
        }
        other => panic!("a hung body past max_hold must end with MaxHoldReached: {other:?}"),
    }
    // Ended at max_hold (2 s): renewals ran (the lease is 1.5 s) but not
    // past it.
    assert!(
        took >= Duration::from_millis(1950) && took < Duration::from_secs(6),
        "ended after {took:?}"
    );
    assert!(
        eventually(Duration::from_secs(2), || !server
            .exists(&lock_key(&format!("hung:{name}"))))
        .await,
        "the lock outlived max_hold"
    );
}

#[tokio::test]
async fn max_hold_below_the_lease_is_a_config_error() {
    let client = LockClient::memory();
    let e = client
        .lock("k")
        .lease(Duration::from_secs(30))
        .max_hold(Duration::from_secs(10))
        .await
        .unwrap_err();
    assert!(matches!(e, LockError::Config(_)), "{e:?}");
    assert!(
        e.to_string().contains("10s") && e.to_string().contains("30s"),
        "{e}"
    );
}

#[tokio::test]
async fn max_hold_below_the_default_lease_bounds_the_lease() {
    global::redis().await;
    let ttl = short(&unique("short"))
        .await
        .expect("max_hold below the default lease runs the body")
        .expect("held in the body");
    assert!(ttl <= Duration::from_secs(2), "lease left {ttl:?}");
    // By hand, and for a permit, too.
    let client = lock_runtime::client().unwrap();
    let key = unique("short");
    let g = client
        .lock(&key)
        .max_hold(Duration::from_secs(2))
        .await
        .expect("lock");
    assert!(client.inspect(&key).await.unwrap().unwrap().ttl.unwrap() <= Duration::from_secs(2));
    g.release().await.unwrap();
    let g = client
        .semaphore(&key, 2)
        .max_hold(Duration::from_secs(2))
        .await
        .expect("permit");
    assert!(client.inspect(&key).await.unwrap().unwrap().ttl.unwrap() <= Duration::from_secs(2));
    g.release().await.unwrap();
}

#[tokio::test]
async fn in_memory_the_same_bounds_hold() {
    let client = LockClient::memory();
    let guard = client
        .lock("mem-job")
        .min_hold(Duration::from_millis(500))
        .await
        .unwrap();
    guard.release().await.unwrap();
    assert!(client
        .lock("mem-job")
        .try_acquire()
        .await
        .unwrap()
        .is_none());
    let t = Instant::now();
    let g = client
        .lock("mem-job")
        .wait(Duration::from_secs(5))
        .await
        .unwrap();
    assert!(t.elapsed() >= Duration::from_millis(300));
    g.release().await.unwrap();
    let skipped = client
        .lock("mem-job")
        .run_or_skip(async { 1 })
        .await
        .unwrap();
    assert_eq!(skipped, Some(1));
}

/// A `min_hold` longer than the lease (a nightly job: `min_hold = "50s"`
/// beside a 30 s lease): released early, the lock stays taken until
/// `min_hold`, not only until the lease it had. `keep.lua` only shortens
/// a hold, so the lock lapsed at its lease and another instance could run
/// the job again within the period.
#[tokio::test]
async fn a_min_hold_longer_than_the_lease_holds_past_the_lease() {
    let server = global::redis().await;
    let client = lock_runtime::client().unwrap();
    let key = unique("min-hold-long");
    let taken = Instant::now();
    let guard = client
        .lock(&key)
        .lease(Duration::from_secs(1))
        .min_hold(Duration::from_secs(5))
        .max_hold(Duration::from_secs(10))
        .await
        .unwrap();
    guard.release().await.unwrap();
    let pttl: i64 = server.cmd(&["PTTL", &lock_key(&key)]);
    let bound = 5000 - taken.elapsed().as_millis() as i64;
    assert!(
        pttl > 2000 && pttl <= bound + 250,
        "released early, the lock must stay until min_hold: pttl {pttl} ms, expected about {bound} ms (the lease was 1 s)"
    );
    assert!(client.lock(&key).try_acquire().await.unwrap().is_none());

    // The in-memory backend, the same.
    let memory = LockClient::memory();
    let guard = memory
        .lock(&key)
        .lease(Duration::from_secs(1))
        .min_hold(Duration::from_secs(5))
        .max_hold(Duration::from_secs(10))
        .await
        .unwrap();
    guard.release().await.unwrap();
    let ttl = memory.inspect(&key).await.unwrap().and_then(|i| i.ttl);
    assert!(
        ttl.is_some_and(|t| t > Duration::from_secs(2)),
        "in memory: {ttl:?} left of a 5 s min_hold"
    );
}

/// A watchdog round sent just before the release of a hold whose
/// `min_hold` (20 s) outlasts its lease (3 s) lands between the stretch to
/// `min_hold` and `keep.lua`: the round goes over the I/O thread's
/// connection (its requests 300 ms late here), the release's commands over
/// the caller's (its replies 600 ms late). The stale renewal must not bring
/// the lock back down to its lease, or the job runs twice in its period.
/// Before, `renew.lua`'s unconditional `PEXPIRE` did so (and `keep.lua`
/// only shortens): PTTL about 2 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_in_flight_does_not_undo_a_min_hold_longer_than_the_lease() {
    tests::init_tracing();
    let server = RedisServer::start();
    let proxy = Proxy::for_server(&server);
    let client = LockClient::connect(&proxy.url()).await.unwrap();
    let key = unique("min-hold-renewed");
    let name = lock_key(&key);
    // Taken in a task, as it is released: the caller's connection is
    // open by the time of the release.
    let guard = tokio::spawn({
        let (client, key) = (client.clone(), key.clone());
        async move {
            client
                .lock(&key)
                .lease(Duration::from_secs(3))
                .min_hold(Duration::from_secs(20))
                .await
        }
    })
    .await
    .unwrap()
    .unwrap();
    // The next command naming the lock is the watchdog's round, 1 s on.
    proxy.slow_connection_of(name.as_bytes(), Duration::from_millis(300), Duration::ZERO);
    assert!(
        eventually(Duration::from_secs(10), || proxy.stats().slowed == 1).await,
        "the round went out"
    );
    proxy.set(Mode::DelayReplies(Duration::from_millis(600)));
    let released = Instant::now();
    // Released from a task: over its runtime's connection.
    tokio::spawn(guard.release())
        .await
        .unwrap()
        .expect("held to the end");
    proxy.set(Mode::Pass);
    proxy.end_slow_spell();
    let pttl: i64 = server.cmd(&["PTTL", &name]);
    println!(
        "PTTL {pttl} ms after a release {:?} long",
        released.elapsed()
    );
    assert!(
        pttl > 15_000,
        "a renewal in flight undid the 20 s min_hold: PTTL {pttl} ms"
    );
}
