//! Semaphores (`docs/SEMAPHORES.md`) against real Redis: the shared checks
//! of `tests::semaphores` on one Redis, Sentinel with `replica_acks` and a
//! Redis Cluster; on one Redis also the hand-off's cost, a dead holder, a
//! dead waiter, lost replies and a long queue.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lock_runtime::{LockClient, LockError};
use tests::proxy::Proxy;
use tests::reply_loss::script_sha;
use tests::semaphores::{self, Deployment};
use tests::sentinel::{start_replica, wait_replicas_online, Sentinels, Timing};
use tests::{eventually, unique, RedisServer};

const PERMIT: &str = include_str!("../../lock-runtime/scripts/permit.lua");
const RELEASE_PERMIT: &str = include_str!("../../lock-runtime/scripts/release_permit.lua");

fn builder() -> lock_runtime::LockClientBuilder {
    LockClient::builder()
        .op_timeout(Duration::from_millis(1500))
        .connect_timeout(Duration::from_millis(1500))
}

async fn clients_of(server: &RedisServer, n: usize) -> Vec<LockClient> {
    let mut v = Vec::new();
    for _ in 0..n {
        v.push(builder().connect(&server.url()).await.unwrap());
    }
    v
}

fn on_one_redis(server: &RedisServer, clients: Vec<LockClient>) -> Deployment {
    let url = server.url();
    Deployment {
        name: "one Redis",
        clients,
        left: Box::new(move |key| {
            let mut conn = redis::Client::open(url.as_str())
                .unwrap()
                .get_connection()
                .unwrap();
            redis::cmd("KEYS")
                .arg(format!("lock:{{{key}}}*"))
                .query(&mut conn)
                .unwrap()
        }),
    }
}

/// Script calls (EVALSHA and EVAL) Redis answered since the last reset.
fn script_calls(server: &RedisServer) -> u64 {
    server.calls("evalsha") + server.calls("eval")
}

/// `permit.lua` run by hand for `owner` with the default prefix.
fn permit(server: &RedisServer, key: &str, owner: &str, lease_ms: u64, stay: &str) -> Vec<i64> {
    redis::Script::new(PERMIT)
        .key(format!("lock:{{{key}}}"))
        .key(tests::scripts::COUNTER)
        .arg(owner)
        .arg(lease_ms)
        .arg(stay)
        .arg("f")
        .arg(tests::scripts::COUNTER_TTL_MS)
        .invoke(&mut server.conn())
        .expect("permit.lua")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_check_on_one_redis() {
    tests::init_tracing();
    let server = RedisServer::start();
    let d = on_one_redis(&server, clients_of(&server, 3).await);
    semaphores::all(&d).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_check_on_a_cluster() {
    tests::init_tracing();
    let cluster = tests::cluster::Cluster::start(3, 0, 2000);
    let mut clients = Vec::new();
    for _ in 0..3 {
        clients.push(builder().cluster(cluster.urls()).await.unwrap());
    }
    let urls = cluster.urls();
    let d = Deployment {
        name: "Redis Cluster",
        clients,
        left: Box::new(move |key| {
            let mut left = Vec::new();
            for url in &urls {
                let mut conn = redis::Client::open(url.as_str())
                    .unwrap()
                    .get_connection()
                    .unwrap();
                let found: Vec<String> = redis::cmd("KEYS")
                    .arg(format!("lock:{{{key}}}*"))
                    .query(&mut conn)
                    .unwrap();
                left.extend(found);
            }
            left
        }),
    };
    semaphores::all(&d).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_check_on_sentinel_with_replica_acks() {
    tests::init_tracing();
    let primary = RedisServer::start();
    let replica = start_replica(primary.port());
    wait_replicas_online(&primary, 1, Duration::from_secs(10));
    let sentinels = Sentinels::start(3, "sem", &primary, Timing::default());
    sentinels.wait_ready(1, Duration::from_secs(20));
    let mut clients = Vec::new();
    for _ in 0..3 {
        clients.push(
            builder()
                .replica_acks(1, Duration::from_millis(1000))
                .sentinel(sentinels.urls(), "sem")
                .await
                .unwrap(),
        );
    }
    primary.reset_stats();
    let d = on_one_redis(&primary, clients);
    semaphores::all(&d).await;
    // Every permit and renewal went through the replicas' acknowledgement.
    assert!(primary.calls("wait") > 0, "no WAIT was sent");
    drop(replica);
}

/// A returned permit reaches the first waiter through the release itself:
/// the waiter sends nothing more (1 script call: the release), and the
/// permit lands within a round trip or two.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_returned_permit_is_handed_to_the_first_waiter_at_once() {
    tests::init_tracing();
    let server = RedisServer::start();
    let mut clients = Vec::new();
    for _ in 0..2 {
        // Any retry of its own would wait a minute.
        clients.push(
            builder()
                .retry_delay(Duration::from_secs(60))
                .connect(&server.url())
                .await
                .unwrap(),
        );
    }
    let d = on_one_redis(&server, clients.clone());
    let key = unique("sem-handoff");
    let a = clients[0].semaphore(&key, 2).await.unwrap();
    let b = clients[0].semaphore(&key, 2).await.unwrap();
    let waiter = {
        let (c, key) = (clients[1].clone(), key.clone());
        tokio::spawn(async move { c.semaphore(&key, 2).wait(Duration::from_secs(30)).await })
    };
    d.until_waiters(&key, 1).await;
    server.reset_stats();
    let released = Instant::now();
    a.release().await.unwrap();
    let g = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("the waiter was not handed the permit")
        .unwrap()
        .unwrap();
    let took = released.elapsed();
    println!("a returned permit reached the waiter {took:?} after the release");
    assert_eq!(script_calls(&server), 1, "the waiter asked again");
    assert!(
        g.fence() > b.fence(),
        "the handed-over permit has a new token"
    );
    let info = clients[0].inspect(&key).await.unwrap().unwrap();
    assert_eq!(info.holders.len(), 2);
    b.release().await.unwrap();
    g.release().await.unwrap();
    d.assert_nothing_left(&key).await;
}

/// A holder that died (its permit never renewed, never released) frees its
/// permit one lease later; a waiter queued behind it gets it then, by its
/// own next attempt, and the dead entry is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_holders_permit_frees_one_lease_later() {
    tests::init_tracing();
    let server = RedisServer::start();
    let d = on_one_redis(&server, clients_of(&server, 2).await);
    let key = unique("sem-dead");
    let lease = 600;
    assert_eq!(permit(&server, &key, "dead:s1.1", lease, "")[0], 1);
    let started = Instant::now();
    let g = d.clients[0]
        .semaphore(&key, 1)
        .wait(Duration::from_secs(10))
        .await
        .unwrap();
    let waited = started.elapsed();
    println!("a dead holder's permit (lease {lease} ms) came back after {waited:?}");
    assert!(waited >= Duration::from_millis(lease - 50), "{waited:?}");
    let info = d.clients[0].inspect(&key).await.unwrap().unwrap();
    assert_eq!(info.holders, [g.holder()]);
    g.release().await.unwrap();
    d.assert_nothing_left(&key).await;
}

/// A queued waiter whose client is gone (nobody hears its grant) is passed
/// over by the release, and the live waiter behind it is handed the permit
/// by that same release; the dead waiter's entry goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_nobody_hears_is_passed_over() {
    tests::init_tracing();
    let server = RedisServer::start();
    let clients = clients_of(&server, 2).await;
    let d = on_one_redis(&server, clients.clone());
    let key = unique("sem-dead-waiter");
    let held = clients[0].semaphore(&key, 1).await.unwrap();
    assert_eq!(permit(&server, &key, "gone:s1.1", 30_000, "30000")[0], 0);
    let waiter = {
        let (c, key) = (clients[1].clone(), key.clone());
        tokio::spawn(async move { c.semaphore(&key, 1).wait(Duration::from_secs(30)).await })
    };
    // The dead waiter and the live one; the live one listens.
    let ready = eventually(Duration::from_secs(10), || {
        clients[1].waiting_here(&key) == 1
    })
    .await;
    assert!(ready);
    server.reset_stats();
    held.release().await.unwrap();
    let g = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("the live waiter was not served")
        .unwrap()
        .unwrap();
    assert_eq!(script_calls(&server), 1, "the live waiter asked again");
    let info = clients[0].inspect(&key).await.unwrap().unwrap();
    assert_eq!(
        (info.holders.as_slice(), info.waiters),
        ([g.holder().to_owned()].as_slice(), 0)
    );
    g.release().await.unwrap();
    d.assert_nothing_left(&key).await;
}

/// Replies lost on the way back (the script ran): an acquire sent again is
/// answered `Repeated` with the same token and takes no second permit; a
/// release sent again counts as released. Never more than N holders,
/// nothing left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_replies_never_make_a_second_permit_nor_leave_one() {
    tests::init_tracing();
    let server = RedisServer::start();
    let proxy = Proxy::for_server(&server);
    let lossy = builder().connect(&proxy.url()).await.unwrap();
    let rival = builder().connect(&server.url()).await.unwrap();
    let d = on_one_redis(&server, vec![lossy.clone(), rival.clone()]);
    let key = unique("sem-lossy");
    for round in 0..3 {
        proxy.lose_reply_to(&script_sha(PERMIT));
        let g = lossy.semaphore(&key, 2).await.unwrap();
        assert!(!proxy.armed(), "round {round}: no reply was lost");
        let info = rival.inspect(&key).await.unwrap().unwrap();
        assert_eq!(info.holders, [g.holder()], "one permit per acquisition");
        // One permit left for the rival, and not two.
        let r = rival.semaphore(&key, 2).await.unwrap();
        let third = rival.semaphore(&key, 2).wait(Duration::ZERO).await;
        assert!(matches!(third, Err(LockError::Timeout { .. })), "{third:?}");
        proxy.lose_reply_to(&script_sha(RELEASE_PERMIT));
        g.release().await.unwrap();
        assert!(!proxy.armed(), "round {round}: no release reply was lost");
        r.release().await.unwrap();
        d.assert_nothing_left(&key).await;
    }
    // A queued attempt whose reply is lost: the request still gets the
    // permit, once, and leaves the queue.
    let held = rival.semaphore(&key, 1).await.unwrap();
    proxy.lose_reply_to(&script_sha(PERMIT));
    let waiter = {
        let (c, key) = (lossy.clone(), key.clone());
        tokio::spawn(async move { c.semaphore(&key, 1).wait(Duration::from_secs(20)).await })
    };
    let fired = eventually(Duration::from_secs(10), || !proxy.armed()).await;
    assert!(fired);
    tokio::time::sleep(Duration::from_millis(100)).await;
    held.release().await.unwrap();
    let g = tokio::time::timeout(Duration::from_secs(15), waiter)
        .await
        .expect("the waiter was not served")
        .unwrap()
        .unwrap();
    let info = rival.inspect(&key).await.unwrap().unwrap();
    assert_eq!(
        (info.holders.as_slice(), info.waiters),
        ([g.holder().to_owned()].as_slice(), 0)
    );
    g.release().await.unwrap();
    d.assert_nothing_left(&key).await;
}

/// Redis CPU time (µs) of the script calls since the last reset.
fn script_usec(server: &RedisServer) -> u64 {
    let info: String = server.cmd(&["INFO", "commandstats"]);
    ["cmdstat_evalsha:", "cmdstat_eval:"]
        .iter()
        .filter_map(|p| info.lines().find_map(|l| l.strip_prefix(p)))
        .filter_map(|l| {
            l.split("usec=")
                .nth(1)?
                .split(',')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

/// Queue `n` waiters on `key` as permit.lua queues them, of `clients`
/// client ids (`<prefix><i % clients>:s1.<i>`), each staying a minute.
fn queue_waiters(server: &RedisServer, key: &str, prefix: &str, clients: usize, n: usize) {
    let hash = format!("lock:{{{key}}}");
    let t: Vec<String> = server.cmd(&["TIME"]);
    let until = t[0].parse::<u64>().unwrap() * 1000 + 60_000;
    let mut pipe = redis::pipe();
    for i in 0..n {
        let owner = format!("{prefix}{}:s1.{i}", i % clients);
        pipe.cmd("RPUSH")
            .arg(format!("{hash}:queue"))
            .arg(&owner)
            .ignore();
        pipe.cmd("HSET")
            .arg(format!("{hash}:waiters"))
            .arg(&owner)
            .arg(format!("30000 {until} f"))
            .ignore();
    }
    pipe.cmd("PEXPIRE")
        .arg(format!("{hash}:queue"))
        .arg(60_000)
        .ignore();
    pipe.cmd("PEXPIRE")
        .arg(format!("{hash}:waiters"))
        .arg(60_000)
        .ignore();
    let () = pipe.query(&mut server.conn()).unwrap();
}

/// With 10,000 live waiters queued on one key, a release hands its permit
/// to the first and is done: its cost does not grow with the queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_with_ten_thousand_waiters_costs_what_one_with_one_does() {
    tests::init_tracing();
    let server = RedisServer::start();
    let clients = clients_of(&server, 1).await;
    // The waiters' 10 clients listen (nobody reads: the grants just queue
    // up in this connection's output).
    let mut conn = server.conn();
    let mut listening = conn.as_pubsub();
    let mut cost = Vec::new();
    for n in [1, 10_000] {
        let key = unique("sem-long-queue");
        let channels: Vec<String> = (0..10)
            .map(|c| format!("lock:{{{key}}}:granted:live{c}"))
            .collect();
        listening.subscribe(&channels).unwrap();
        let held = clients[0].semaphore(&key, 1).await.unwrap();
        queue_waiters(&server, &key, "live", 10, n);
        server.reset_stats();
        held.release().await.unwrap();
        let inner = server.all_calls() - script_calls(&server);
        cost.push((n, inner, script_usec(&server)));
        let info = clients[0].inspect(&key).await.unwrap().unwrap();
        assert_eq!(info.holders, ["live0:s1.0"], "the first waiter holds");
        assert_eq!(info.waiters, n - 1);
        let _: i64 = server.cmd(&[
            "DEL",
            &format!("lock:{{{key}}}"),
            &format!("lock:{{{key}}}:queue"),
            &format!("lock:{{{key}}}:waiters"),
        ]);
    }
    println!("a release that hands its permit on, by queue length: {cost:?} (waiters, commands inside, µs)");
    // (One more look at the next head, which stays queued.)
    assert!(
        cost[1].1 <= cost[0].1 + 2,
        "the release did more with a longer queue"
    );
}

/// With 10,000 waiters queued on one key whose clients are gone (nobody
/// hears a grant), one release does bounded work, not O(waiters); each
/// later call goes on where the last stopped, and a live request gets its
/// permit once the dead ones are passed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_dead_waiters_do_not_make_a_release_o_of_waiters() {
    tests::init_tracing();
    let server = RedisServer::start();
    let clients = clients_of(&server, 1).await;
    let d = on_one_redis(&server, clients.clone());
    let key = unique("sem-dead-queue");
    let hash = format!("lock:{{{key}}}");
    let held = clients[0].semaphore(&key, 1).await.unwrap();
    queue_waiters(&server, &key, "gone", 4, 10_000);
    server.reset_stats();
    held.release().await.unwrap();
    let inner = server.all_calls() - script_calls(&server);
    println!(
        "one release with 10,000 dead waiters queued: {inner} commands inside the script, {} µs",
        script_usec(&server)
    );
    assert!(inner < 1200, "a release ran {inner} commands");
    let left: i64 = server.cmd(&["LLEN", &format!("{hash}:queue")]);
    assert_eq!(left, 10_000 - 256);
    // A live request passes the rest, 256 a call.
    let started = Instant::now();
    let g = clients[0]
        .semaphore(&key, 1)
        .wait(Duration::from_secs(20))
        .await
        .unwrap();
    println!(
        "a request behind 9,744 dead waiters got its permit in {:?}",
        started.elapsed()
    );
    g.release().await.unwrap();
    d.assert_nothing_left(&key).await;
}

/// Every command's CPU time (µs) and calls since the last reset, by name.
fn command_stats(server: &RedisServer) -> Vec<(String, u64, u64)> {
    let info: String = server.cmd(&["INFO", "commandstats"]);
    info.lines()
        .filter_map(|l| l.strip_prefix("cmdstat_"))
        .filter(|l| !l.starts_with("info:") && !l.starts_with("config|resetstat:"))
        .filter_map(|l| {
            let (name, rest) = l.split_once(':')?;
            let field = |f: &str| -> Option<u64> {
                rest.split(',')
                    .find_map(|kv| kv.strip_prefix(f))?
                    .parse()
                    .ok()
            };
            Some((name.to_owned(), field("calls=")?, field("usec=")?))
        })
        .collect()
}

/// Instructions Redis ran for `cycles` uncontended acquire + release
/// cycles of locks and of permits, counted by callgrind: a redis-server
/// started by hand under `valgrind --tool=callgrind` with its pid in
/// `SEM_CALLGRIND_PID` and its URL in `SEM_CALLGRIND_URL`. Repeatable
/// where wall-clock CPU is not (a loaded machine).
async fn callgrind_costs(cycles: usize) -> Option<[f64; 2]> {
    let pid = std::env::var("SEM_CALLGRIND_PID").ok()?;
    let url = std::env::var("SEM_CALLGRIND_URL").ok()?;
    let client = LockClient::builder()
        .op_timeout(Duration::from_secs(10))
        .connect(&url)
        .await
        .unwrap();
    let control = |arg: &str| {
        let out = std::process::Command::new("callgrind_control")
            .args([arg, &pid])
            .output()
            .unwrap();
        assert!(out.status.success(), "callgrind_control {arg}: {out:?}");
    };
    let mut per = [0.0; 2];
    for (i, sem) in [false, true].into_iter().enumerate() {
        // Warm: scripts loaded, connections open.
        for _ in 0..20 {
            let key = unique("cg");
            let g = if sem {
                client.semaphore(&key, 4).await
            } else {
                client.lock(&key).await
            };
            g.unwrap().release().await.unwrap();
        }
        let keys: Vec<String> = (0..cycles).map(|_| unique("cg")).collect();
        control("-z");
        for key in &keys {
            let g = if sem {
                client.semaphore(key, 4).await
            } else {
                client.lock(key).await
            };
            g.unwrap().release().await.unwrap();
        }
        let before: std::collections::HashSet<_> = dumps(&pid);
        control("-d");
        let file = dumps(&pid)
            .difference(&before)
            .next()
            .cloned()
            .expect("a new dump");
        let text = std::fs::read_to_string(&file).unwrap();
        let total: u64 = text
            .lines()
            .find_map(|l| {
                l.strip_prefix("summary: ")
                    .or_else(|| l.strip_prefix("totals: "))
            })
            .and_then(|n| n.split_whitespace().next()?.parse().ok())
            .expect("a total in the dump");
        per[i] = total as f64 / cycles as f64;
    }
    Some(per)
}

/// The callgrind dumps of process `pid` in the working directory of the
/// run (`SEM_CALLGRIND_DIR`).
fn dumps(pid: &str) -> std::collections::HashSet<std::path::PathBuf> {
    let dir = std::env::var("SEM_CALLGRIND_DIR").unwrap_or_else(|_| ".".into());
    std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(&format!("callgrind.out.{pid}")))
        })
        .collect()
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// The figures of docs/SEMAPHORES.md ("What it costs"): Redis CPU of an
/// uncontended acquire + release, a semaphore's against a lock's in the
/// same run (interleaved rounds), and the hand-off latency of each. Run by
/// hand: `cargo test --release -p tests --test semaphores -- --ignored
/// --nocapture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: run by hand"]
async fn measure_costs_and_hand_off() {
    let server = RedisServer::start();
    let client = builder().connect(&server.url()).await.unwrap();
    const CYCLES: usize = 1000;
    let mut usec = [0u64; 2];
    let mut calls = [0u64; 2];
    let mut scripts = [0u64; 2];
    for round in 0..6 {
        for (i, sem) in [false, true].into_iter().enumerate() {
            let keys: Vec<String> = (0..CYCLES).map(|_| unique("cost")).collect();
            server.reset_stats();
            for key in &keys {
                let g = if sem {
                    client.semaphore(key, 4).await.unwrap()
                } else {
                    client.lock(key).await.unwrap()
                };
                g.release().await.unwrap();
            }
            if round == 0 {
                continue; // warm-up
            }
            for (name, c, u) in command_stats(&server) {
                usec[i] += u;
                if name == "evalsha" || name == "eval" {
                    scripts[i] += c;
                } else {
                    calls[i] += c;
                }
            }
        }
    }
    if let Some([lock, sem]) = callgrind_costs(500).await {
        println!(
            "callgrind, Redis instructions per uncontended acquire + release: lock {lock:.0}, semaphore {sem:.0}: {:.2}×",
            sem / lock
        );
    }
    let per = |x: u64| x as f64 / (5 * CYCLES) as f64;
    println!(
        "uncontended acquire + release, Redis CPU per cycle: lock {:.1} µs ({:.1} scripts, {:.1} inner commands), semaphore {:.1} µs ({:.1} scripts, {:.1} inner commands): {:.2}×",
        per(usec[0]),
        per(scripts[0]),
        per(calls[0]),
        per(usec[1]),
        per(scripts[1]),
        per(calls[1]),
        usec[1] as f64 / usec[0] as f64
    );

    // Hand-off: two tasks take turns on one key; the waiter measures from
    // the holder's call to release() to its own guard in hand.
    for sem in [false, true] {
        let key = unique("handoff");
        let released = Arc::new(Mutex::new(None::<Instant>));
        let samples = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for _ in 0..2 {
            let (c, key, released, samples) = (
                builder().connect(&server.url()).await.unwrap(),
                key.clone(),
                released.clone(),
                samples.clone(),
            );
            tasks.push(tokio::spawn(async move {
                for _ in 0..300 {
                    let req = if sem {
                        c.semaphore(&key, 1)
                    } else {
                        c.lock(&key)
                    };
                    let g = req.wait(Duration::from_secs(30)).await.unwrap();
                    if let Some(at) = released.lock().unwrap().take() {
                        samples.lock().unwrap().push(at.elapsed());
                    }
                    tokio::time::sleep(Duration::from_micros(500)).await;
                    *released.lock().unwrap() = Some(Instant::now());
                    g.release().await.unwrap();
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        let mut s = samples.lock().unwrap().clone();
        s.sort();
        println!(
            "{} hand-off over {} turns: p50 {:?}, p99 {:?}",
            if sem { "semaphore(1)" } else { "lock" },
            s.len(),
            percentile(&s, 0.5),
            percentile(&s, 0.99)
        );
    }
}

/// On a Redis Cluster, a release sent while the semaphore's slot is half
/// moved (its queue and waiters on the target, the hash still on the
/// source) is refused whole (`TRYAGAIN`: every key is declared), waits the
/// migration out, and then hands the permit to the waiter; nothing is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_waits_out_a_slot_half_moved() {
    use tests::cluster::{key_slot, Cluster};
    tests::init_tracing();
    let cluster = Cluster::start(3, 0, 2000);
    let holder = builder().cluster(cluster.urls()).await.unwrap();
    let waiting = builder().cluster(cluster.urls()).await.unwrap();
    let key = unique("sem-migrating");
    let hash = format!("lock:{{{key}}}");
    let slot = key_slot(&hash);
    let held = holder.semaphore(&key, 1).await.unwrap();
    let waiter = {
        let (c, key) = (waiting.clone(), key.clone());
        tokio::spawn(async move { c.semaphore(&key, 1).wait(Duration::from_secs(20)).await })
    };
    assert!(eventually(Duration::from_secs(10), || waiting.waiting_here(&key) == 1).await);
    let from = cluster.slot_owner(slot);
    let to = (from + 1) % cluster.nodes.len();
    cluster.begin_migration(slot, from, to);
    cluster.migrate_keys(
        from,
        to,
        &[&format!("{hash}:queue"), &format!("{hash}:waiters")],
    );
    let tries = || cluster.try_again_errors(from) + cluster.try_again_errors(to);
    let before = tries();
    let releasing = tokio::spawn(async move { held.release().await });
    assert!(
        eventually(Duration::from_secs(5), || tries() > before).await,
        "the release met no TRYAGAIN"
    );
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert!(
        !releasing.is_finished(),
        "the release ended mid-migration: {:?}",
        releasing.await
    );
    cluster.finish_migration(slot, from, to);
    releasing.await.unwrap().unwrap();
    let g = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the waiter was not served after the migration")
        .unwrap()
        .unwrap();
    g.release().await.unwrap();
    let left: Vec<String> =
        cluster.nodes[to].cmd(&["CLUSTER", "GETKEYSINSLOT", &slot.to_string(), "100"]);
    assert!(
        left.iter().all(|k| !k.contains(&key)),
        "left behind: {left:?}"
    );
}

/// `raise_permit_fence.lua` (Redlock: every granted node learns the token
/// the acquisition chose) raises the permit's token and the slot's
/// counter, never lowers either, and leaves another owner's permit alone.
#[tokio::test]
async fn raising_a_permits_token_only_raises() {
    let server = RedisServer::start();
    let key = unique("sem-raise");
    let hash = format!("lock:{{{key}}}");
    let token = permit(&server, &key, "c1:s2.1", 30_000, "")[1];
    let other = permit(&server, &key, "c2:s2.1", 30_000, "")[1];
    let raise = |owner: &str, to: i64| -> Vec<i64> {
        redis::Script::new(include_str!(
            "../../lock-runtime/scripts/raise_permit_fence.lua"
        ))
        .key(&hash)
        .key(tests::scripts::COUNTER)
        .arg(owner)
        .arg(to)
        .arg(tests::scripts::COUNTER_TTL_MS)
        .invoke(&mut server.conn())
        .unwrap()
    };
    let token_of = |owner: &str| -> i64 {
        let v: String = server.cmd(&["HGET", &hash, owner]);
        v.split(' ').nth(1).unwrap().parse().unwrap()
    };
    // Above both tokens (the second is the clock's some µs later: how
    // many depends on the machine).
    let high = token.max(other) + 1000;
    assert_eq!(raise("c1:s2.1", high), [1]);
    assert_eq!(token_of("c1:s2.1"), high);
    // Another permit carries that token now: refused, with the counter.
    assert_eq!(raise("c2:s2.1", high), [0, high]);
    assert_eq!(token_of("c2:s2.1"), other);
    let counter: i64 = server.cmd(&["GET", tests::scripts::COUNTER]);
    assert_eq!(counter, high);
    raise("c1:s2.1", token);
    assert_eq!(token_of("c1:s2.1"), high, "lowered");
    let counter: i64 = server.cmd(&["GET", tests::scripts::COUNTER]);
    assert_eq!(counter, high, "the counter was lowered");
}

/// `raise_permit_fence.lua` compares tokens exactly past 2^53 (as digit
/// strings, as the other scripts do), and refuses a counter that is not an
/// integer, leaving it and the permit as they were. Before, it compared Lua
/// numbers: 2^53 + 1 read as 2^53, so the counter was not raised to the
/// permit's token; and it wrote the token over a counter that was not one.
#[tokio::test]
async fn raising_a_permits_token_is_exact_and_refuses_a_counter_that_is_no_integer() {
    let server = RedisServer::start();
    let key = unique("sem-raise-exact");
    let hash = format!("lock:{{{key}}}");
    let token = permit(&server, &key, "c1:s2.1", 30_000, "")[1];
    let raise = |to: &str| -> redis::RedisResult<Vec<i64>> {
        redis::Script::new(include_str!(
            "../../lock-runtime/scripts/raise_permit_fence.lua"
        ))
        .key(&hash)
        .key(tests::scripts::COUNTER)
        .arg("c1:s2.1")
        .arg(to)
        .arg(tests::scripts::COUNTER_TTL_MS)
        .invoke(&mut server.conn())
    };
    let held = || -> String {
        let v: String = server.cmd(&["HGET", &hash, "c1:s2.1"]);
        v.split(' ').nth(1).unwrap().to_string()
    };
    let _: () = server.cmd(&["SET", tests::scripts::COUNTER, "9007199254740992"]);
    assert_eq!(raise("9007199254740993").unwrap(), [1]);
    assert_eq!(held(), "9007199254740993");
    let counter: String = server.cmd(&["GET", tests::scripts::COUNTER]);
    assert_eq!(
        counter, "9007199254740993",
        "the counter below the permit's token"
    );

    let _: () = server.cmd(&["SET", tests::scripts::COUNTER, "not a number"]);
    let err = raise("9007199254740999").expect_err("a counter that is no integer raised");
    assert!(err.to_string().contains("integer"), "{err}");
    let counter: String = server.cmd(&["GET", tests::scripts::COUNTER]);
    assert_eq!(counter, "not a number", "the counter was overwritten");
    assert_eq!(held(), "9007199254740993", "the permit was raised");
    assert!(token < 9007199254740992);
}

/// Sentinel: permits granted before the primary dies are on the replica
/// (checked before the kill: without `replica_acks`, which the one replica
/// could not give once it is the primary), so after the failover their
/// holders keep them (renewed on the new primary), the semaphore still
/// admits no more than N, and a waiter parked on the old primary is handed
/// a returned permit on the new one; nothing is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permits_survive_a_sentinel_failover() {
    tests::init_tracing();
    let mut primary = RedisServer::start();
    let replica = start_replica(primary.port());
    wait_replicas_online(&primary, 1, Duration::from_secs(10));
    let sentinels = Sentinels::start(3, "semfo", &primary, Timing::default());
    sentinels.wait_ready(1, Duration::from_secs(20));
    let patient = || builder().retry_delay(Duration::from_secs(30));
    let client = patient().sentinel(sentinels.urls(), "semfo").await.unwrap();
    let waiting = patient().sentinel(sentinels.urls(), "semfo").await.unwrap();
    let key = unique("sem-failover");
    let hash = format!("lock:{{{key}}}");
    let lease = Duration::from_secs(10);
    let a = client.semaphore(&key, 2).lease(lease).await.unwrap();
    let b = client.semaphore(&key, 2).lease(lease).await.unwrap();
    let waiter = {
        let (c, key) = (waiting.clone(), key.clone());
        tokio::spawn(async move {
            c.semaphore(&key, 2)
                .lease(lease)
                .wait(Duration::from_secs(60))
                .await
        })
    };
    assert!(eventually(Duration::from_secs(5), || waiting.waiting_here(&key) == 1).await);
    let replicated = eventually(Duration::from_secs(5), || {
        replica.cmd::<i64>(&["HLEN", &hash]) == 2
            && replica.cmd::<i64>(&["LLEN", &format!("{hash}:queue")]) == 1
    });
    assert!(replicated.await, "the permits never reached the replica");
    let old = primary.port();
    primary.kill();
    assert_eq!(
        sentinels.wait_failover(old, Duration::from_secs(20)),
        replica.port()
    );
    // Still two permits held, and room for no third.
    let third = loop {
        match client.semaphore(&key, 2).wait(Duration::ZERO).await {
            Err(LockError::Backend(_)) => tokio::time::sleep(Duration::from_millis(50)).await,
            other => break other,
        }
    };
    assert!(matches!(third, Err(LockError::Timeout { .. })), "{third:?}");
    let holders: i64 = replica.cmd(&["HLEN", &hash]);
    assert_eq!(holders, 2);
    assert!(!a.is_lost() && !b.is_lost());
    assert!(
        !waiter.is_finished(),
        "the waiter gave up: {:?}",
        waiter.await
    );
    // Time for the waiter to notice the failover and listen again.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let released = Instant::now();
    a.release()
        .await
        .expect("a replicated permit survived the failover");
    let handed = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the waiter was not handed the permit after the failover")
        .unwrap()
        .unwrap();
    println!(
        "after a failover, a returned permit reached the waiter in {:?}",
        released.elapsed()
    );
    assert!(released.elapsed() < Duration::from_secs(3));
    b.release().await.unwrap();
    handed.release().await.unwrap();
    assert!(
        eventually(Duration::from_secs(5), || replica
            .keys(&format!("{hash}*"))
            .is_empty())
        .await,
        "left: {:?}",
        replica.keys(&format!("{hash}*"))
    );
}

/// `release_permit.lua` run by hand for `owner` with the default prefix.
fn release_permit(server: &RedisServer, key: &str, owner: &str) -> i64 {
    redis::Script::new(RELEASE_PERMIT)
        .key(format!("lock:{{{key}}}"))
        .key(tests::scripts::COUNTER)
        .arg(owner)
        .arg("")
        .arg(tests::scripts::COUNTER_TTL_MS)
        .invoke(&mut server.conn())
        .expect("release_permit.lua")
}

/// A permit whose lease ended is no permit, also while its entry is still
/// there (another holder keeps the hash): its release says it was not
/// held (0), as a renewal would and as the in-memory backend does, and
/// the entry goes. A live one's says 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn releasing_a_permit_whose_lease_ended_says_it_was_not_held() {
    let server = RedisServer::start();
    let key = unique("sem-ended");
    assert_eq!(permit(&server, &key, "c1:s2.1", 30, "")[0], 1);
    assert_eq!(permit(&server, &key, "c2:s2.1", 30_000, "")[0], 1);
    tokio::time::sleep(Duration::from_millis(80)).await;
    let hash = format!("lock:{{{key}}}");
    assert!(
        server.cmd::<bool>(&["HEXISTS", &hash, "c1:s2.1"]),
        "still there"
    );
    assert_eq!(
        release_permit(&server, &key, "c1:s2.1"),
        0,
        "an ended permit released"
    );
    assert!(!server.cmd::<bool>(&["HEXISTS", &hash, "c1:s2.1"]));
    assert_eq!(release_permit(&server, &key, "c2:s2.1"), 1);
}

/// `permit.lua` as the client sends it: `args` after the owner id (the
/// trailing ones at their defaults left out).
fn permit_as_sent(
    server: &RedisServer,
    hash: &str,
    owner: &str,
    args: &[&str],
) -> redis::RedisResult<Vec<i64>> {
    let script = redis::Script::new(PERMIT);
    let mut call = script.prepare_invoke();
    call.key(hash).key(tests::scripts::COUNTER).arg(owner);
    for a in args {
        call.arg(*a);
    }
    call.invoke(&mut server.conn())
}

/// A free semaphore's permit (the fast path) takes its token as a lock
/// does: the next of the slot's counter, never below the clock or the
/// Redlock floor, also where the counter has fewer digits than the clock;
/// a counter that is no integer is an error reply and stays as it was,
/// and nothing is held. The client leaves trailing arguments at their
/// defaults out, and the release's counter key where the script can name
/// it: a waiter it serves still takes its token from that counter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_free_semaphore_s_permit_takes_its_token_as_a_lock_does() {
    let server = RedisServer::start();
    let counter = tests::scripts::COUNTER;
    let hash = format!("lock:{{{}}}", unique("sem-fast"));
    let now_ms = |server: &RedisServer| {
        let t: Vec<u64> = server.cmd(&["TIME"]);
        t[0] * 1000 + t[1] / 1000
    };
    // Owner id, lease: fenced, no wait, the default fence_ttl.
    let before = now_ms(&server);
    let got = permit_as_sent(&server, &hash, "c1:s8.1", &["30000"]).unwrap();
    let after = now_ms(&server);
    assert_eq!(got[0], 1, "{got:?}");
    assert!(got[1] >= before as i64 * 1000, "{got:?} below the clock");
    assert_eq!(server.cmd::<i64>(&["GET", counter]), got[1]);
    let ttl: i64 = server.cmd(&["PTTL", counter]);
    assert!(ttl > 86_000_000, "the counter's ttl {ttl}");
    let entry: String = server.cmd(&["HGET", &hash, "c1:s8.1"]);
    let (ends, token) = entry.split_once(' ').unwrap();
    let ends: u64 = ends.parse().unwrap();
    assert!(
        (before + 30_000..=after + 30_000).contains(&ends),
        "{entry}: lease end not {before}..{after} + 30000"
    );
    assert_eq!(token, got[1].to_string());
    let ttl: i64 = server.cmd(&["PTTL", &hash]);
    assert!(
        (25_000..=30_000).contains(&ttl),
        "the semaphore's ttl {ttl}"
    );

    // A counter above the clock: its next. One of fewer digits (above the
    // clock as a string, below it as a number): the clock.
    let _: () = server.cmd(&["SET", counter, "8999999999999998"]);
    let got = permit_as_sent(&server, &hash, "c1:s8.2", &["30000", "60000"]).unwrap();
    assert_eq!(got, [1, 8_999_999_999_999_999]);
    let _: () = server.cmd(&["SET", counter, "999999999999999"]);
    let before = now_ms(&server) as i64 * 1000;
    let got = permit_as_sent(&server, &hash, "c1:s8.3", &["30000"]).unwrap();
    assert_eq!(got[0], 1);
    assert!(
        (before..before + 60_000_000).contains(&got[1]),
        "{got:?}: not the clock ({before} µs)"
    );
    assert_eq!(server.cmd::<i64>(&["GET", counter]), got[1]);

    // Redlock: never below the floor, nor below the counter.
    let _: () = server.cmd(&["DEL", counter]);
    let ttl = tests::scripts::COUNTER_TTL_MS.to_string();
    let floor = ["30000", "w5000", "f", &ttl, "1900000000000000"];
    let got = permit_as_sent(&server, &hash, "c1:s8.4", &floor).unwrap();
    assert_eq!(got, [1, 1_900_000_000_000_000]);
    let floor = ["30000", "w5000", "f", &ttl, "1000000000000000"];
    let got = permit_as_sent(&server, &hash, "c1:s8.5", &floor).unwrap();
    assert_eq!(got, [1, 1_900_000_000_000_001]);

    // A counter that is no integer (of the clock's length and below it as
    // a string, or of another length): refused, left as it was.
    for broken in ["12345678901234x6", "not-a-number"] {
        let _: () = server.cmd(&["SET", counter, broken]);
        let got = permit_as_sent(&server, &hash, "c1:s8.6", &["30000"]);
        assert!(got.is_err(), "{broken}: {got:?}");
        assert_eq!(server.cmd::<String>(&["GET", counter]), broken);
        assert!(!server.cmd::<bool>(&["HEXISTS", &hash, "c1:s8.6"]));
    }
    let _: () = server.cmd(&["DEL", counter]);

    // Unfenced: no token.
    let got = permit_as_sent(&server, &hash, "c1:s8.7", &["30000", "", ""]).unwrap();
    assert_eq!(got, [1, 0]);
    let entry: String = server.cmd(&["HGET", &hash, "c1:s8.7"]);
    assert!(entry.ends_with(" -"), "{entry}");

    // The release as sent: the semaphore's key and the owner id alone.
    let release = |owner: &str| -> i64 {
        redis::Script::new(RELEASE_PERMIT)
            .key(&hash)
            .arg(owner)
            .invoke(&mut server.conn())
            .expect("release_permit.lua")
    };
    assert_eq!(release("c1:s8.7"), 1);
    assert_eq!(release("c1:s8.7"), 0, "released twice");
    // Full, with a fenced waiter: a release serves it a token from the
    // slot's counter, named by the script.
    for n in 1..=5 {
        assert_eq!(release(&format!("c1:s8.{n}")), 1, "c1:s8.{n}");
    }
    let hash1 = format!("lock:{{{}}}", unique("sem-fast-1"));
    assert_eq!(
        permit_as_sent(&server, &hash1, "c2:s1.1", &["30000"]).unwrap()[0],
        1
    );
    let queued = permit_as_sent(&server, &hash1, "c3:s1.1", &["30000", "60000"]).unwrap();
    assert_eq!(queued[0], 0, "{queued:?}");
    let _: () = server.cmd(&["SET", counter, "1900000000000000"]);
    let released: i64 = redis::Script::new(RELEASE_PERMIT)
        .key(&hash1)
        .arg("c2:s1.1")
        .invoke(&mut server.conn())
        .expect("release_permit.lua");
    assert_eq!(released, 1);
    assert_eq!(
        server.cmd::<i64>(&["GET", counter]),
        1_900_000_000_000_001,
        "the served waiter's token is not the counter's next"
    );
}

/// One key used both ways. P2 waits for a permit; the permits lapse and a
/// lock L takes the key; L2 queues behind P2. L's release hands no lock to
/// P2 (a permit's waiter): P2 stays first and its own next ask takes a
/// permit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_s_release_hands_no_lock_to_a_permit_waiter() {
    let server = RedisServer::start();
    let key = unique("sem-mixed");
    let (hash, queue) = (format!("lock:{{{key}}}"), format!("lock:{{{key}}}:queue"));
    assert_eq!(permit(&server, &key, "c1:s1.1", 30, "")[0], 1);
    assert_eq!(permit(&server, &key, "c2:s1.1", 30_000, "60000")[0], 0);
    // P2's client listens for its grant.
    let mut listening = server.conn();
    let mut sub = listening.as_pubsub();
    sub.subscribe(format!("{hash}:granted:c2")).unwrap();
    assert!(eventually(Duration::from_secs(2), || !server.exists(&hash)).await);
    let clients = clients_of(&server, 2).await;
    let l = clients[0].lock(&key).await.unwrap();
    let l2 = tokio::spawn({
        let (c, key) = (clients[1].clone(), key.clone());
        async move { c.lock(&key).wait(Duration::from_secs(5)).await }
    });
    let q = queue.clone();
    assert!(
        eventually(Duration::from_secs(5), || server
            .cmd::<usize>(&["LLEN", &q])
            == 2)
        .await
    );
    l.release().await.unwrap();
    let value: Option<String> = server.cmd(&["GET", &hash]);
    assert!(
        !value.as_deref().unwrap_or("").starts_with("c2:s1.1"),
        "a permit's waiter was handed the lock: {value:?}"
    );
    let head: Option<String> = server.cmd(&["LINDEX", &queue, "0"]);
    assert_eq!(
        head.as_deref(),
        Some("c2:s1.1"),
        "the permit's waiter stays first"
    );
    l2.abort();
    let _ = l2.await;
    assert_eq!(permit(&server, &key, "c2:s1.1", 30_000, "60000")[0], 1);
    drop(sub);
}

/// One key used both ways: a live lock waiter at the head of the queue
/// stops the serving of permits, as in memory; it is not dropped without
/// a word while a permit waiter behind it is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_release_stops_at_a_lock_waiter_at_the_head() {
    let server = RedisServer::start();
    let key = unique("sem-lockhead");
    let (hash, queue, waiters) = (
        format!("lock:{{{key}}}"),
        format!("lock:{{{key}}}:queue"),
        format!("lock:{{{key}}}:waiters"),
    );
    assert_eq!(permit(&server, &key, "c1:s1.1", 30_000, "")[0], 1);
    let until = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis()
        + 60_000;
    let _: () = server.cmd(&["RPUSH", &queue, "l9:5"]);
    let _: () = server.cmd(&["HSET", &waiters, "l9:5", &format!("30000 {until} f")]);
    assert_eq!(permit(&server, &key, "c3:s1.1", 30_000, "60000")[0], 0);
    assert_eq!(release_permit(&server, &key, "c1:s1.1"), 1);
    let head: Option<String> = server.cmd(&["LINDEX", &queue, "0"]);
    assert_eq!(
        head.as_deref(),
        Some("l9:5"),
        "the lock's waiter was dropped"
    );
    assert!(
        !server.cmd::<bool>(&["HEXISTS", &hash, "c3:s1.1"]),
        "a permit served past a lock's waiter"
    );
}

/// Serving that stops at its bound (256 heads a call) tells the asker to
/// ask again at once, not at the earliest lease end of a live holder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serving_stopped_at_its_bound_says_ask_again_at_once() {
    let server = RedisServer::start();
    let key = unique("sem-bound");
    let queue = format!("lock:{{{key}}}:queue");
    assert_eq!(permit(&server, &key, "c1:s2.1", 30_000, "")[0], 1);
    let dead: Vec<String> = (0..300).map(|i| format!("d{i}:s2.1")).collect();
    let mut args = vec!["RPUSH", queue.as_str()];
    args.extend(dead.iter().map(String::as_str));
    let _: () = server.cmd(&args);
    let _: () = server.cmd(&["PEXPIRE", &queue, "60000"]);
    let busy = permit(&server, &key, "c5:s2.1", 30_000, "");
    assert_eq!(busy[0], 0, "{busy:?}");
    assert!(busy[1] <= 1, "ask again in {} ms", busy[1]);
    // The next ask goes on, and admits.
    assert_eq!(permit(&server, &key, "c5:s2.1", 30_000, "")[0], 1);
}

/// A waiter that gives up from behind the head serves the queue as a
/// release does: here the head's stay has passed and a permit is free for
/// the live waiter behind it, which gets it from the leaver's call, not at
/// its own next ask (30 s away), as on the in-memory backend.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_leaving_from_behind_the_head_serves_those_behind_it() {
    let server = RedisServer::start();
    let key = unique("sem-leaver");
    let queue = format!("lock:{{{key}}}:queue");
    // Two of three permits held; the head wants two of two (blocked) and
    // stays one second.
    assert_eq!(permit(&server, &key, "h:s3.1", 60_000, "")[0], 1);
    assert_eq!(permit(&server, &key, "h:s3.2", 60_000, "")[0], 1);
    assert_eq!(permit(&server, &key, "d:s2.1", 60_000, "1000")[0], 0);
    let slow = builder()
        .retry_delay(Duration::from_secs(30))
        .connect(&server.url())
        .await
        .unwrap();
    let waiter = {
        let key = key.clone();
        tokio::spawn(async move { slow.semaphore(&key, 3).wait(Duration::from_secs(20)).await })
    };
    assert!(
        eventually(Duration::from_secs(5), || server
            .cmd::<i64>(&["LLEN", &queue])
            == 2)
        .await
    );
    assert_eq!(permit(&server, &key, "x:s3.1", 60_000, "60000")[0], 0);
    // The head's stay passes (time is the subject here).
    tokio::time::sleep(Duration::from_millis(1300)).await;
    assert_eq!(release_permit(&server, &key, "x:s3.1"), 0);
    let t = Instant::now();
    let g = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the waiter behind the dead head was not served")
        .unwrap()
        .expect("a permit");
    assert!(t.elapsed() < Duration::from_secs(10));
    g.release().await.unwrap();
}

/// A counter that is no integer: serving stops before the head leaves the
/// queue (it keeps its place), and the asker hears the error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_counter_drops_no_waiter() {
    let server = RedisServer::start();
    let key = unique("sem-counter");
    let queue = format!("lock:{{{key}}}:queue");
    assert_eq!(permit(&server, &key, "c1:s1.1", 30, "")[0], 1);
    assert_eq!(permit(&server, &key, "c2:s1.1", 30_000, "60000")[0], 0);
    // c1's permit lapses: c2 is admissible, and the next ask serves it.
    let hash = format!("lock:{{{key}}}");
    assert!(eventually(Duration::from_secs(2), || !server.exists(&hash)).await);
    let _: () = server.cmd(&["SET", tests::scripts::COUNTER, "not-a-number"]);
    let asked = redis::Script::new(PERMIT)
        .key(format!("lock:{{{key}}}"))
        .key(tests::scripts::COUNTER)
        .arg("c3:s1.1")
        .arg(30_000)
        .arg("")
        .arg("f")
        .arg(tests::scripts::COUNTER_TTL_MS)
        .invoke::<Vec<i64>>(&mut server.conn());
    assert!(asked.is_err(), "{asked:?}");
    let head: Option<String> = server.cmd(&["LINDEX", &queue, "0"]);
    assert_eq!(
        head.as_deref(),
        Some("c2:s1.1"),
        "the waiter lost its place"
    );
}

/// `inspect_permits.lua` reads the waiters it is given as KEYS[2] (every
/// key a script reads is declared: a Cluster slot on the move then
/// refuses the whole call).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspecting_a_semaphore_reads_only_declared_keys() {
    let server = RedisServer::start();
    let key = unique("sem-inspect");
    let declared = format!("lock:{{{key}}}:elsewhere");
    let until = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis()
        + 60_000;
    let _: () = server.cmd(&["HSET", &declared, "c1:s2.1", &format!("30000 {until}")]);
    let seen: (String, i64, String, i64, Vec<String>) = redis::Script::new(include_str!(
        "../../lock-runtime/scripts/inspect_permits.lua"
    ))
    .key(format!("lock:{{{key}}}"))
    .key(&declared)
    .invoke(&mut server.conn())
    .unwrap();
    assert_eq!(seen.3, 1, "waiters read from an undeclared key: {seen:?}");
}

/// The scripts read an owner id's mode after its first ':', as the client
/// does (`Mode::of`): an id whose client part has a ':' is no permit to
/// either (client ids have none).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_owner_id_is_read_after_its_first_colon() {
    let server = RedisServer::start();
    let key = unique("sem-colon");
    let asked = redis::Script::new(PERMIT)
        .key(format!("lock:{{{key}}}"))
        .key(tests::scripts::COUNTER)
        .arg("a:b:s2.1")
        .arg(30_000)
        .arg("")
        .arg("f")
        .arg(tests::scripts::COUNTER_TTL_MS)
        .invoke::<Vec<i64>>(&mut server.conn());
    assert!(
        asked.is_err(),
        "a writer's id taken for a permit's: {asked:?}"
    );
}

/// Contention while one reply in five to every command of one client is
/// lost (the command ran; the connection is cut): never more than N bodies
/// inside, every release lands, nothing is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contention_under_random_reply_loss_never_makes_n_plus_one() {
    tests::init_tracing();
    let server = RedisServer::start();
    let proxy = Proxy::for_server(&server);
    proxy.spare_pubsub();
    let lossy = builder().connect(&proxy.url()).await.unwrap();
    let rival = builder().connect(&server.url()).await.unwrap();
    let d = on_one_redis(&server, vec![lossy.clone(), rival.clone()]);
    let key = unique("sem-lossy-contended");
    const N: u32 = 2;
    let inside = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    proxy.lose_replies(b"", 0.2);
    let mut tasks = Vec::new();
    for t in 0..6usize {
        let c = if t % 2 == 0 {
            lossy.clone()
        } else {
            rival.clone()
        };
        let (key, inside) = (key.clone(), inside.clone());
        tasks.push(tokio::spawn(async move {
            let mut done = 0;
            for _ in 0..10 {
                let g = match c.semaphore(&key, N).wait(Duration::from_secs(30)).await {
                    Ok(g) => g,
                    // A call whose every send lost its answer, within its
                    // operation timeout: a backend error, never a permit.
                    Err(LockError::Backend(_)) => continue,
                    Err(e) => panic!("{e}"),
                };
                let n = inside.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
                assert!(n <= N as usize, "{n} inside a semaphore of {N}");
                tokio::time::sleep(Duration::from_millis(2)).await;
                inside.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                if let Err(e) = g.release().await {
                    panic!("a release failed: {e}");
                }
                done += 1;
            }
            done
        }));
    }
    let mut done = 0;
    for t in tasks {
        done += t.await.unwrap();
    }
    proxy.lose_replies(b"", 0.0);
    println!(
        "{done} of 60 bodies ran, {} replies lost",
        proxy.replies_lost()
    );
    assert!(proxy.replies_lost() > 0 && done > 30);
    d.assert_nothing_left(&key).await;
}
