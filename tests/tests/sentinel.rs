//! Sentinel: a primary, a replica and three `redis-sentinel` processes.
//! The client follows a failover; what a failover does to held locks, with
//! and without `replica_acks`.

use std::time::{Duration, Instant};

use lock_runtime::{LockClient, LockError};
use tests::proxy::{Mode, Proxy};
use tests::sentinel::{start_replica, wait_replicas_online, Sentinels, Timing};
use tests::{eventually, unique, RedisServer};

const MASTER: &str = "mymaster";

fn hash(key: &str) -> String {
    format!("lock:{{{key}}}")
}

/// A primary, one replica replicating through a proxy (so that a test can
/// stall replication), and three sentinels that see the primary down after
/// `down_after_ms`.
fn replicated_through_a_link(down_after_ms: u64) -> (RedisServer, Proxy, RedisServer, Sentinels) {
    let primary = RedisServer::start();
    let link = Proxy::start(primary.port());
    let replica = start_replica(link.port());
    wait_replicas_online(&primary, 1, Duration::from_secs(10));
    let timing = Timing {
        down_after_ms,
        // Keeps Sentinel from "fixing" the replica to bypass the proxy.
        failover_timeout_ms: 30_000,
    };
    let sentinels = Sentinels::start(3, MASTER, &primary, timing);
    sentinels.wait_ready(1, Duration::from_secs(20));
    (primary, link, replica, sentinels)
}

fn builder() -> lock_runtime::LockClientBuilder {
    LockClient::builder()
        .op_timeout(Duration::from_millis(500))
        .connect_timeout(Duration::from_millis(500))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn primary_killed_clients_follow_the_new_primary() {
    tests::init_tracing();
    let mut primary = RedisServer::start();
    let replica = start_replica(primary.port());
    wait_replicas_online(&primary, 1, Duration::from_secs(10));
    let sentinels = Sentinels::start(3, MASTER, &primary, Timing::default());
    sentinels.wait_ready(1, Duration::from_secs(20));
    let client = builder().sentinel(sentinels.urls(), MASTER).await.unwrap();

    let held_key = unique("held");
    let held = client
        .lock(&held_key)
        .lease(Duration::from_secs(10))
        .await
        .unwrap();
    assert!(primary.exists(&hash(&held_key)));
    assert!(
        eventually(Duration::from_secs(5), || replica.exists(&hash(&held_key))).await,
        "the lock never reached the replica"
    );

    // A waiter on another client, parked on the old primary's channel, with
    // a fallback retry far away: only a wake-up from the new primary can
    // hand it the lock quickly.
    let waiting = builder()
        .retry_delay(Duration::from_secs(30))
        .sentinel(sentinels.urls(), MASTER)
        .await
        .unwrap();
    let (w, k) = (waiting.clone(), held_key.clone());
    let waiter = tokio::spawn(async move { w.lock(&k).wait(Duration::from_secs(60)).await });
    assert!(
        eventually(Duration::from_secs(5), || waiting.waiting_here(&held_key)
            == 1)
        .await
    );

    let old = primary.port();
    primary.kill();
    let killed = Instant::now();
    // New locks fail with a backend error until the failover is through,
    // then work on the new primary.
    let mut failures = 0;
    let first = loop {
        match client.lock(unique("after")).await {
            Ok(g) => break g,
            Err(e) => {
                assert!(matches!(e, LockError::Backend(_)), "{e:?}");
                failures += 1;
                assert!(
                    killed.elapsed() < Duration::from_secs(50),
                    "no new lock within 50 s of the failover: {e}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    let recovered = killed.elapsed();
    assert!(
        replica.exists(&hash(first.key())),
        "new lock is not on the new primary"
    );
    first.release().await.unwrap();
    assert_eq!(
        sentinels.wait_failover(old, Duration::from_secs(15)),
        replica.port()
    );
    println!(
        "Sentinel failover: first new lock granted {recovered:?} after the primary was killed \
         ({failures} failed attempts in between)"
    );

    // The lock held across the failover is still ours on the new primary.
    assert!(!held.is_lost());
    assert!(
        !waiter.is_finished(),
        "the waiter gave up: {:?}",
        waiter.await
    );
    // Give the waiter time to notice the failover and listen again.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let released = Instant::now();
    held.release()
        .await
        .expect("the replicated lock survived the failover");
    let handed = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the waiter was not woken after the failover")
        .unwrap()
        .expect("the waiter failed across the failover");
    assert!(
        released.elapsed() < Duration::from_secs(2),
        "the waiter got the lock {:?} after the release",
        released.elapsed()
    );
    handed.release().await.unwrap();
    assert!(!replica.exists(&hash(&held_key)));

    // A client made after the failover finds the new primary at once.
    let late = builder().sentinel(sentinels.urls(), MASTER).await.unwrap();
    let g = late.lock(unique("late")).await.unwrap();
    assert!(replica.exists(&hash(g.key())));
    g.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_loss_on_failover_with_and_without_replica_acks() {
    tests::init_tracing();
    let (mut primary, link, replica, sentinels) = replicated_through_a_link(1000);
    // Long enough for a healthy replica on a loaded machine.
    let ack_wait = Duration::from_secs(1);
    let plain = builder().sentinel(sentinels.urls(), MASTER).await.unwrap();
    let acked = builder()
        .replica_acks(1, ack_wait)
        .sentinel(sentinels.urls(), MASTER)
        .await
        .unwrap();

    // Healthy replica: an acknowledged acquire costs one WAIT round trip more.
    let (mut safe, mut plain_ms, mut acked_ms) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..10 {
        let t = Instant::now();
        safe.push(
            acked
                .lock(unique("acked"))
                .lease(Duration::from_secs(20))
                .await
                .unwrap(),
        );
        acked_ms.push(t.elapsed().as_secs_f64() * 1e3);
        let t = Instant::now();
        let g = plain.lock(unique("warm")).await.unwrap();
        plain_ms.push(t.elapsed().as_secs_f64() * 1e3);
        g.release().await.unwrap();
    }

    // A key whose fence counter the replica has, before the stall.
    let tok_key = unique("tok");
    let first = plain.lock(&tok_key).await.unwrap();
    let counter = "lock:fence".to_string();
    let replicated = first.fence().to_string();
    first.release().await.unwrap();
    assert!(
        eventually(Duration::from_secs(5), || {
            replica.cmd::<Option<String>>(&["GET", &counter]).as_deref() == Some(&*replicated)
        })
        .await,
        "the fence counter never reached the replica"
    );

    // Replication stalls: the primary still grants, the replica never hears.
    link.set(Mode::Drop);
    // Tokens handed out now are lost to the replica's counter.
    let mut stalled_tokens = Vec::new();
    for _ in 0..5 {
        let g = plain.lock(&tok_key).await.unwrap();
        stalled_tokens.push(g.fence());
        g.release().await.unwrap();
    }
    let mut exposed = Vec::new();
    for _ in 0..20 {
        exposed.push(
            plain
                .lock(unique("plain"))
                .lease(Duration::from_secs(3))
                .await
                .expect("without acks the primary alone grants"),
        );
    }
    let mut refused = 0;
    for _ in 0..3 {
        let key = unique("refused");
        let t = Instant::now();
        // Tried once: a call short of acks tries again while its wait
        // lasts, and the acknowledged locks' copies must not run out on
        // the replica before the failover.
        match acked
            .lock(&key)
            .lease(Duration::from_secs(3))
            .wait(Duration::ZERO)
            .await
        {
            Err(LockError::Backend(e)) => {
                refused += 1;
                assert!(e.to_string().contains("replicas"), "{e}");
                assert!(t.elapsed() >= ack_wait, "refused before WAIT ran out");
                assert!(
                    !primary.exists(&hash(&key)),
                    "refused lock left on the primary"
                );
            }
            other => panic!("granted although no replica could confirm: {other:?}"),
        }
    }

    let old = primary.port();
    primary.kill();
    let killed = Instant::now();
    let new = sentinels.wait_failover(old, Duration::from_secs(70));
    let failover = killed.elapsed();
    assert_eq!(new, replica.port());

    // The promoted replica's counter is behind the tokens handed out during
    // the stall; its tokens must still be above every one of them.
    let after = plain
        .lock(&tok_key)
        .wait(Duration::from_secs(20))
        .await
        .expect("lock on the new primary");
    let highest = *stalled_tokens.iter().max().unwrap();
    assert!(
        after.fence() > highest,
        "token {} after the failover, {highest} handed out before it ({stalled_tokens:?})",
        after.fence()
    );
    after.release().await.unwrap();

    // Locks granted while replication stalled are gone from the new primary;
    // every holder must be told.
    let missing = exposed
        .iter()
        .filter(|g| !replica.exists(&hash(g.key())))
        .count();
    for g in &exposed {
        if !replica.exists(&hash(g.key())) {
            tokio::time::timeout(Duration::from_secs(10), g.lost())
                .await
                .expect("a lock missing after the failover was never reported lost");
        }
    }
    let told = killed.elapsed();
    // Acknowledged locks are all on the new primary, and still held.
    let survived = safe
        .iter()
        .filter(|g| replica.exists(&hash(g.key())))
        .count();
    let mut still_held = 0;
    for g in safe {
        match g.release().await {
            Ok(()) => still_held += 1,
            Err(e) => println!("acknowledged lock not held at release: {e}"),
        }
    }
    for g in exposed {
        let _ = g.release().await;
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    println!(
        "Sentinel failover {failover:?} after the primary was killed.\n\
         without replica_acks: 20 locks granted while replication stalled, {missing} missing \
         on the new primary, all holders told lost within {told:?} of the kill\n\
         with replica_acks(1, {ack_wait:?}): {refused}/3 acquires refused while replication \
         stalled; 10 acknowledged locks: {survived} on the new primary, {still_held} still held\n\
         acquire latency median: plain {:.2} ms, with WAIT {:.2} ms",
        median(&mut plain_ms),
        median(&mut acked_ms)
    );
    assert_eq!(refused, 3);
    assert_eq!(
        survived, 10,
        "an acknowledged lock was lost in the failover"
    );
    assert_eq!(still_held, 10);
}

/// With `replica_acks`, a renewal counts only once the replicas have it.
/// Replication to the replica stalls (its link held, the replica still
/// answering the sentinels) for longer than a lease while the holder's
/// watchdog renews on the primary; then the primary dies and the lagging
/// replica is promoted, where the holder's locks ran out long ago. Another
/// client takes them there at once: by then the holder must have been told
/// it lost them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewals_the_replicas_never_acknowledged_do_not_extend_a_hold() {
    tests::init_tracing();
    // The failover is asked for right after the kill (`SENTINEL FAILOVER`):
    // no wait for the sentinels to see the primary down.
    let (mut primary, link, replica, sentinels) = replicated_through_a_link(5_000);
    let lease = Duration::from_secs(3);
    let holder = builder()
        .replica_acks(1, Duration::from_millis(500))
        .sentinel(sentinels.urls(), MASTER)
        .await
        .unwrap();
    let keys: Vec<String> = (0..4).map(|_| unique("renewed")).collect();
    let mut guards = Vec::new();
    for k in &keys {
        guards.push(holder.lock(k).lease(lease).await.unwrap());
    }

    // Healthy replica: the holds outlive their first lease, renewed (and
    // confirmed) about every second, one `WAIT` a tick for all four.
    primary.reset_stats();
    tokio::time::sleep(lease + Duration::from_millis(500)).await;
    let (waits, renew_calls) = (primary.calls("wait"), primary.calls("evalsha"));
    let healthy_lost = guards.iter().filter(|g| g.is_lost()).count();

    // Replication stalls; the primary keeps answering the holder.
    link.set(Mode::Drop);
    let stalled = Instant::now();
    // The replica's copies run out a lease after the last renewal it saw.
    assert!(
        eventually(lease + Duration::from_secs(5), || keys
            .iter()
            .all(|k| !replica.exists(&hash(k))))
        .await,
        "the replica's copies of the locks did not run out"
    );
    let ran_out = stalled.elapsed();

    let old = primary.port();
    primary.kill();
    let killed = Instant::now();
    // Asked of one sentinel, promoted without waiting for the others.
    let asked = sentinels.sentinels[0].try_cmd::<String>(&["SENTINEL", "FAILOVER", MASTER]);
    assert!(
        asked.is_ok() || matches!(&asked, Err(e) if e.code() == Some("INPROG")),
        "{asked:?}"
    );

    // Another client, straight on the replica: each key is taken as soon
    // as the replica is a primary.
    let taker = builder().connect(&replica.url()).await.unwrap();
    let mut taken = Vec::new();
    for (k, a) in keys.iter().zip(&guards) {
        let b = loop {
            if let Ok(Some(b)) = taker.lock(k).wait(Duration::ZERO).try_acquire().await {
                break b;
            }
            assert!(
                killed.elapsed() < Duration::from_secs(15),
                "`{k}` not taken on the replica within 15 s of the kill"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        // The holder must have been told before this moment.
        taken.push((k.clone(), a.is_lost(), killed.elapsed()));
        drop(b);
    }
    assert_eq!(
        sentinels.wait_failover(old, Duration::from_secs(15)),
        replica.port()
    );
    println!(
        "healthy replica, {lease:?} lease, 4 holds: {renew_calls} renew calls and {waits} WAITs \
         in {:?}; replica's copies ran out {ran_out:?} into the stall; taken after the kill \
         (key, holder told lost, when): {taken:?}",
        lease + Duration::from_millis(500)
    );
    for (k, told, at) in &taken {
        assert!(
            *told,
            "`{k}` taken on the promoted replica {at:?} after the kill while its holder's guard \
             still said held (is_lost() == false)"
        );
    }
    assert_eq!(
        healthy_lost, 0,
        "a hold was lost while the replica was healthy"
    );
    // One WAIT per tick, not per hold (a tick about every second).
    assert!(
        (2..=renew_calls.max(2)).contains(&waits),
        "{waits} WAITs for {renew_calls} renew calls of 4 holds"
    );
    for g in guards {
        assert!(
            g.release().await.is_err(),
            "a hold the failover lost released cleanly"
        );
    }
}

#[tokio::test]
async fn unreachable_sentinels_are_a_backend_error_within_five_seconds() {
    let urls: Vec<String> = (0..3)
        .map(|_| format!("redis://127.0.0.1:{}", tests::free_port()))
        .collect();
    let started = Instant::now();
    let err = LockClient::sentinel(&urls, MASTER).await.unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "took {:?}",
        started.elapsed()
    );
    assert!(matches!(err, LockError::Backend(_)), "{err:?}");
    assert!(err.to_string().contains(MASTER), "{err}");
    // Asking replica acks of a single-server client is a configuration error.
    let err = LockClient::builder()
        .replica_acks(1, Duration::from_millis(100))
        .connect(&urls[0])
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::Config(_)), "{err:?}");
}

/// A planned failover (`SENTINEL FAILOVER`) under load: 9 tasks of one
/// client loop on 3 keys (a fenced lock, an unfenced one, a semaphore of
/// 2), each call with a 10 s wait. The old primary keeps answering as a
/// primary for a while after the replica is promoted, then is turned into
/// a replica of the new one (its clients cut). No call with wait left may
/// fail, and nothing may be left held once every task is done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_planned_failover_strands_nothing_and_fails_no_call() {
    tests::init_tracing();
    let primary = RedisServer::start();
    let replica = start_replica(primary.port());
    wait_replicas_online(&primary, 1, Duration::from_secs(10));
    let sentinels = Sentinels::start(3, MASTER, &primary, Timing::default());
    sentinels.wait_ready(1, Duration::from_secs(20));
    let client = LockClient::sentinel(sentinels.urls(), MASTER)
        .await
        .unwrap();
    let keys = [unique("fenced"), unique("unfenced"), unique("sem")];
    let started = Instant::now();
    let run_for = Duration::from_secs(12);
    let tasks: Vec<_> = (0..9)
        .map(|i| {
            let (client, key) = (client.clone(), keys[i % 3].clone());
            tokio::spawn(async move {
                let (mut ok, mut failed, mut lost) = (0u32, Vec::new(), 0u32);
                while started.elapsed() < run_for {
                    let request = match i % 3 {
                        0 => client.lock(&key),
                        1 => client.lock(&key).fence(false),
                        _ => client.semaphore(&key, 2),
                    };
                    let asked = Instant::now();
                    match request.wait(Duration::from_secs(10)).await {
                        Ok(g) => {
                            ok += 1;
                            // Taken on the old primary after the promotion:
                            // gone on the new one, and said so.
                            if g.release().await.is_err() {
                                lost += 1;
                            }
                        }
                        Err(e) => failed.push(format!(
                            "{key} at {:?} after {:?}: {e}",
                            asked.duration_since(started),
                            asked.elapsed()
                        )),
                    }
                }
                (ok, failed, lost)
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let old = primary.port();
    let asked = sentinels.sentinels[0].try_cmd::<String>(&["SENTINEL", "FAILOVER", MASTER]);
    assert!(asked.is_ok(), "{asked:?}");
    let failed_over = Instant::now();
    assert_eq!(
        sentinels.wait_failover(old, Duration::from_secs(15)),
        replica.port()
    );
    let promoted = failed_over.elapsed();
    let (mut ok, mut failed, mut lost) = (0, Vec::new(), 0);
    for t in tasks {
        let (o, f, l) = t.await.unwrap();
        ok += o;
        failed.extend(f);
        lost += l;
    }
    let mut held = Vec::new();
    for k in &keys {
        if let Some(info) = client.inspect(k).await.unwrap() {
            held.push(format!("{k}: {:?} ttl {:?}", info.holders, info.ttl));
        }
    }
    println!(
        "planned failover (sentinels switched after {promoted:?}): {ok} locks taken, \
         {lost} found lost at release, {} calls failed, {} keys left held",
        failed.len(),
        held.len()
    );
    assert!(
        failed.is_empty() && held.is_empty(),
        "calls failed: {failed:#?}\nleft held after the run: {held:#?}"
    );
    assert!(ok > 0);
}

/// A primary, a replica and three sentinels (default timing).
fn deployment() -> (RedisServer, RedisServer, Sentinels) {
    let primary = RedisServer::start();
    let replica = start_replica(primary.port());
    wait_replicas_online(&primary, 1, Duration::from_secs(10));
    let sentinels = Sentinels::start(3, MASTER, &primary, Timing::default());
    sentinels.wait_ready(1, Duration::from_secs(20));
    (primary, replica, sentinels)
}

/// With `replica_acks` and the replica stopped, every acquire is taken and
/// given back for want of its acknowledgement: the primary answered, so
/// the call keeps trying for its whole wait (it used to give up after two
/// operation timeouts), and is granted once the replica is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_short_of_replica_acks_keeps_trying_while_its_wait_lasts() {
    tests::init_tracing();
    let (primary, replica, sentinels) = deployment();
    // Two operation timeouts: 1 s.
    let client = builder()
        .replica_acks(1, Duration::from_millis(200))
        .sentinel(sentinels.urls(), MASTER)
        .await
        .unwrap();
    replica.pause();

    // Stopped for good: the call fails at its wait, nothing left behind.
    let key = unique("unacked");
    let asked = Instant::now();
    let wait = Duration::from_secs(3);
    let err = client.lock(&key).wait(wait).await.unwrap_err();
    let took = asked.elapsed();
    assert!(err.to_string().contains("replicas"), "{err}");
    assert!(
        took >= wait,
        "gave up after {took:?} of a {wait:?} wait: {err}"
    );
    assert!(!primary.exists(&hash(&key)));

    // Back within the wait: granted.
    let key = unique("acked");
    let (c, k) = (client.clone(), key.clone());
    let call = tokio::spawn(async move { c.lock(&k).wait(Duration::from_secs(30)).await });
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(!call.is_finished(), "gave up: {:?}", call.await);
    replica.resume();
    let g = call
        .await
        .unwrap()
        .expect("granted once the replica is back");
    assert!(
        replica.exists(&hash(&key)),
        "granted without the replica's copy"
    );
    g.release().await.unwrap();
    println!("replica stopped: a call with a {wait:?} wait failed after {took:?}");
}

/// The primary dies: a call made then, from a runtime with no connection
/// yet, has every connection refused until the replica is promoted,
/// seconds later. The sentinels still answer, so it keeps trying while
/// its wait lasts (it used to give up after two operation timeouts,
/// whatever its wait) and is granted on the new primary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_that_reaches_no_primary_waits_out_a_failover() {
    tests::init_tracing();
    let (mut primary, replica, sentinels) = deployment();
    let client = builder().sentinel(sentinels.urls(), MASTER).await.unwrap();
    let g = client.lock(unique("before")).await.unwrap();
    g.release().await.unwrap();
    let old = primary.port();
    primary.kill();
    let killed = Instant::now();
    let key = unique("through");
    // A runtime of its own: its first command connects afresh, refused.
    let (c, k) = (client.clone(), key.clone());
    let out = std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(async move {
                let g = c.lock(&k).wait(Duration::from_secs(60)).await?;
                let granted = killed.elapsed();
                g.release().await?;
                Ok::<_, LockError>(granted)
            })
    })
    .join()
    .unwrap();
    let granted = out.expect("the call gave up before the failover was through");
    assert_eq!(
        sentinels.wait_failover(old, Duration::from_secs(15)),
        replica.port()
    );
    println!("primary killed: a call made then was granted {granted:?} later");
}

/// A server that answers "not now" to a lock script's first write: a
/// demoted primary (`READONLY`), one out of memory (`OOM`). The scripts
/// pass the server's error on with its code (they used to wrap it in a
/// message of their own, a final error), so a call keeps trying for its
/// wait, as a client talking to a primary just demoted must.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_refused_for_now_is_tried_again_while_the_wait_lasts() {
    tests::init_tracing();
    let primary = RedisServer::start();
    let replica = start_replica(primary.port());
    wait_replicas_online(&primary, 1, Duration::from_secs(10));
    let full = RedisServer::start_with(&["--maxmemory", "1", "--maxmemory-policy", "noeviction"]);
    let wait = Duration::from_secs(1);
    for (server, code) in [(&replica, "READONLY"), (&full, "OOM")] {
        let client = builder().connect(&server.url()).await.unwrap();
        for fenced in [true, false] {
            let asked = Instant::now();
            let err = client
                .lock(unique("refused"))
                .fence(fenced)
                .wait(wait)
                .await
                .unwrap_err();
            let took = asked.elapsed();
            let said = err.to_string().to_lowercase();
            assert!(said.contains(&code.to_lowercase()), "{err}");
            assert!(
                took >= wait,
                "{code} (fenced: {fenced}) ended the call after {took:?} of its {wait:?} wait: {err}"
            );
        }
        let err = client.semaphore(unique("refused"), 2).wait(wait).await;
        assert!(
            matches!(&err, Err(e) if e.to_string().to_lowercase().contains(&code.to_lowercase())),
            "{err:?}"
        );
    }
}

/// With `replica_acks`, an acquire and its `WAIT` go to the primary in one
/// round trip: Redis reads each acquire's commands at once, and the
/// replica's acknowledgement once (`INFO stats` `total_reads_processed`; in
/// two round trips it read three times per acquire).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acknowledged_acquire_and_its_wait_are_one_round_trip() {
    tests::init_tracing();
    let (primary, _replica, sentinels) = deployment();
    let client = builder()
        .replica_acks(1, Duration::from_secs(1))
        .sentinel(sentinels.urls(), MASTER)
        .await
        .unwrap();
    // This runtime's connections opened.
    for fence in [true, false] {
        let g = client.lock(unique("warm")).fence(fence).await.unwrap();
        g.release().await.unwrap();
    }
    let reads = || -> u64 {
        let info: String = primary.cmd(&["INFO", "stats"]);
        info.lines()
            .find_map(|l| l.strip_prefix("total_reads_processed:"))
            .and_then(|v| v.trim().parse().ok())
            .expect("total_reads_processed in INFO stats")
    };
    let n = 40;
    let mut held = Vec::new();
    primary.reset_stats();
    let before = reads();
    for i in 0..n {
        let request = match i % 3 {
            0 => client.lock(unique("acked")),
            1 => client.lock(unique("acked")).fence(false),
            _ => client.semaphore(unique("acked"), 2),
        };
        held.push(request.await.unwrap());
    }
    let read = reads() - before;
    let waits = primary.calls("wait");
    for g in held {
        g.release().await.unwrap();
    }
    println!("{n} acknowledged acquires: {read} reads by the primary, {waits} WAITs");
    assert_eq!(waits, n, "one WAIT per acquire");
    // Two per acquire, with room for the sentinels' and the replica's own
    // traffic; three per acquire when the WAIT went apart.
    assert!(read < n * 5 / 2, "{read} reads for {n} acquires");
}

/// A call that saw its lock busy sends its last attempt at its deadline,
/// with one operation's time (here 1 s + the 2 s `WAIT`). The primary
/// stops answering just before, and a planned failover promotes the
/// replica while that attempt waits: the attempt ends when its time is
/// up, and the call with it. (It used to try the new primary within the
/// same attempt once the first send timed out: there the lock was busy
/// too, and queuing waited out the `WAIT`, since the new primary has no
/// replica; the call ended two seconds past that bound.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_last_attempt_during_a_failover_ends_within_one_operation() {
    tests::init_tracing();
    let (primary, replica, sentinels) = deployment();
    let (op, ack_wait) = (Duration::from_secs(1), Duration::from_secs(2));
    let client = LockClient::builder()
        .op_timeout(op)
        .connect_timeout(Duration::from_millis(500))
        .replica_acks(1, ack_wait)
        .sentinel(sentinels.urls(), MASTER)
        .await
        .unwrap();
    let key = unique("last");
    let held = client
        .lock(&key)
        .lease(Duration::from_secs(60))
        .await
        .unwrap();
    let wait = Duration::from_secs(2);
    let asked = Instant::now();
    let (c, k) = (client.clone(), key.clone());
    // (Timed in its own task: the test's blocks below do not count.)
    let call = tokio::spawn(async move {
        let out = c.lock(&k).wait(wait).await.map(|_| ());
        (out, asked.elapsed())
    });
    tokio::time::sleep(wait - Duration::from_millis(400)).await;
    let old = primary.port();
    primary.pause();
    let forced = sentinels.sentinels[0].try_cmd::<String>(&["SENTINEL", "FAILOVER", MASTER]);
    assert!(forced.is_ok(), "{forced:?}");
    // (Blocking: the call runs in a task of its own.)
    let new = tokio::task::block_in_place(|| sentinels.wait_failover(old, Duration::from_secs(15)));
    let promoted = asked.elapsed();
    let (out, took) = call.await.unwrap();
    let past = took.saturating_sub(wait);
    assert_eq!(new, replica.port());
    primary.resume();
    drop(held);
    println!(
        "last attempt during a failover (the sentinels switched {promoted:?} after the call \
         began): {out:?}, {past:?} past its deadline"
    );
    assert!(
        matches!(out, Err(LockError::Timeout { .. })),
        "the lock was held throughout: {out:?}"
    );
    let bound = op + ack_wait + Duration::from_millis(500);
    assert!(
        past <= bound,
        "ended {past:?} past its deadline; one attempt has {:?}",
        op + ack_wait
    );
}

/// With `replica_acks`, a grant short of its acknowledgements is given
/// back, and the client keeps that release to send it again to a new
/// primary after a failover (`sentinel/journal.rs`). The request's later
/// grant is therefore under another owner id, and a planned failover
/// leaves it held. (It went on under the same id: the replayed release
/// deleted its live hold on the new primary.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_after_one_given_back_keeps_its_lock_through_a_failover() {
    tests::init_tracing();
    let (primary, replica, sentinels) = deployment();
    let client = builder()
        .replica_acks(1, Duration::from_millis(200))
        .sentinel(sentinels.urls(), MASTER)
        .await
        .unwrap();
    let key = unique("given-back");
    replica.pause();
    let (c, k) = (client.clone(), key.clone());
    let call = tokio::spawn(async move {
        c.lock(&k)
            .lease(Duration::from_secs(60))
            .wait(Duration::from_secs(30))
            .await
    });
    // Two WAITs on the primary: the first attempt was given back.
    let given_back = eventually(Duration::from_secs(10), || primary.calls("wait") >= 2).await;
    assert!(given_back, "no attempt was given back");
    replica.resume();
    let guard = call
        .await
        .unwrap()
        .expect("granted once the replica is back");
    let owner = primary.owner_of(&hash(&key)).expect("held on the primary");
    assert!(eventually(Duration::from_secs(10), || replica.exists(&hash(&key))).await);

    let old = primary.port();
    // (The sentinels may still count the replica down from its pause:
    // `-NOGOODSLAVE` until they see it again.)
    let asked = Instant::now();
    while let Err(e) = sentinels.sentinels[0].try_cmd::<String>(&["SENTINEL", "FAILOVER", MASTER]) {
        assert!(
            asked.elapsed() < Duration::from_secs(20),
            "SENTINEL FAILOVER: {e}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let new = tokio::task::block_in_place(|| sentinels.wait_failover(old, Duration::from_secs(15)));
    assert_eq!(new, replica.port());
    // (Acknowledged grants need the old primary to replicate again.)
    tokio::task::block_in_place(|| wait_replicas_online(&replica, 1, Duration::from_secs(30)));
    // The client follows (and replays what it ended on the old primary)
    // once a lock of its lands on the new one.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let probe = unique("probe");
        let g = client
            .lock(&probe)
            .wait(Duration::from_secs(5))
            .await
            .unwrap();
        let landed = replica.exists(&hash(&probe));
        let _ = g.release().await;
        if landed {
            break;
        }
        assert!(Instant::now() < deadline, "the client never followed");
    }
    let gone = eventually(Duration::from_secs(2), || {
        replica.owner_of(&hash(&key)).as_deref() != Some(owner.as_str())
    })
    .await;
    assert!(
        !gone,
        "the hold of {owner} was deleted on the new primary: {:?}",
        replica.try_get(&hash(&key))
    );
    guard.release().await.expect("released as held, not lost");
}
