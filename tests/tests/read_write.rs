//! Read-write locks (`read_lock`, `write_lock`, `mode = "read"`) against
//! real servers on every deployment, and in memory: readers share, a
//! writer excludes, a waiting writer is not starved, hand-off wakes the
//! readers together, each reader's lease is its own, reentry and upgrade.

use std::time::{Duration, Instant};

use lock_runtime::{distributed_lock, LockClient, LockError};
use tests::cluster::Cluster;
use tests::proxy::{Mode, Proxy};
use tests::read_write as rw;
use tests::sentinel::{start_replica, wait_replicas_online, Sentinels, Timing};
use tests::{global, unique, RedisServer};

fn name(key: &str) -> String {
    format!("lock:{{{key}}}")
}

async fn redis_clients(server: &RedisServer, n: usize) -> Vec<LockClient> {
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(LockClient::connect(&server.url()).await.unwrap());
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_read_write_semantics() {
    let server = RedisServer::start();
    let clients = redis_clients(&server, 3).await;
    rw::readers_share_and_a_writer_excludes_them(&clients).await;
    let waited = rw::a_waiting_writer_is_not_starved(&clients).await;
    println!("writer waited {waited:?} behind one reader and a stream of four");
    rw::a_release_wakes_the_readers_together_then_the_writer(&clients).await;
    rw::reentry_and_upgrade(&clients[0]).await;
    rw::a_reader_is_renewed(&clients[0], &clients[1]).await;
    rw::dropped_read_requests_leave_nothing(&clients).await;
}

#[tokio::test]
async fn memory_read_write_semantics() {
    let client = LockClient::memory();
    let clients = [client.clone(), client.clone(), client];
    rw::readers_share_and_a_writer_excludes_them(&clients).await;
    rw::a_waiting_writer_is_not_starved(&clients).await;
    rw::a_release_wakes_the_readers_together_then_the_writer(&clients).await;
    rw::reentry_and_upgrade(&clients[0]).await;
    rw::a_reader_is_renewed(&clients[0], &clients[1]).await;
    rw::dropped_read_requests_leave_nothing(&clients).await;
}

/// Clients whose waiters never ask again on their own within a test.
fn patient() -> lock_runtime::LockClientBuilder {
    LockClient::builder().retry_delay(Duration::from_secs(60))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_giving_up_lets_the_readers_behind_it_in() {
    let server = RedisServer::start();
    let mut clients = Vec::new();
    for _ in 0..2 {
        clients.push(patient().connect(&server.url()).await.unwrap());
    }
    rw::a_writer_giving_up_lets_the_readers_behind_it_in(&clients).await;
    let memory = patient().memory().unwrap();
    rw::a_writer_giving_up_lets_the_readers_behind_it_in(&[memory.clone(), memory]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_read_write_semantics() {
    let cluster = Cluster::start(3, 0, 2000);
    let mut clients = Vec::new();
    for _ in 0..2 {
        clients.push(LockClient::cluster(cluster.urls()).await.unwrap());
    }
    rw::readers_share_and_a_writer_excludes_them(&clients).await;
    rw::a_waiting_writer_is_not_starved(&clients).await;
    rw::a_release_wakes_the_readers_together_then_the_writer(&clients).await;
    rw::reentry_and_upgrade(&clients[0]).await;
    rw::a_reader_is_renewed(&clients[0], &clients[1]).await;
    let mut patient_clients = Vec::new();
    for _ in 0..2 {
        patient_clients.push(patient().cluster(cluster.urls()).await.unwrap());
    }
    rw::a_writer_giving_up_lets_the_readers_behind_it_in(&patient_clients).await;
}

/// Three Redis masters for a Redlock, and their URLs.
fn redlock_nodes() -> ([RedisServer; 3], Vec<String>) {
    let nodes = [
        RedisServer::start(),
        RedisServer::start(),
        RedisServer::start(),
    ];
    let urls = nodes.iter().map(RedisServer::url).collect();
    (nodes, urls)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_read_write_semantics() {
    let (nodes, urls) = redlock_nodes();
    let mut clients = Vec::new();
    for _ in 0..2 {
        clients.push(LockClient::redlock(&urls).await.unwrap());
    }
    // Redlock waiters do not queue (each node would serve its own queue's
    // head): hand-off order is not FIFO there, so only sharing, exclusion,
    // reentry and renewal are checked, plus that readers waiting on a
    // writer all get in after its release.
    rw::readers_share_and_a_writer_excludes_them(&clients).await;
    rw::reentry_and_upgrade(&clients[0]).await;
    rw::a_reader_is_renewed(&clients[0], &clients[1]).await;
    let key = unique("rl-rw");
    let w = clients[0].write_lock(&key).await.unwrap();
    let w_fence = w.fence();
    let readers: Vec<_> = (0..3)
        .map(|i| {
            let (c, key) = (clients[i % 2].clone(), key.clone());
            tokio::spawn(async move { c.read_lock(&key).wait(Duration::from_secs(10)).await })
        })
        .collect();
    assert!(
        tests::eventually(Duration::from_secs(10), || rw::waiting(&clients, &key) == 3).await,
        "the readers did not wait"
    );
    w.release().await.unwrap();
    let mut guards = Vec::new();
    for r in readers {
        guards.push(r.await.unwrap().expect("a woken reader"));
    }
    // Woken together, the first readers may start the read hold on
    // different nodes, each with a token of its own (a reader's token is
    // the highest its majority holds): every one is above the writer's
    // before, and the next writer's is above them all.
    let highest = guards.iter().map(|g| g.fence()).max().unwrap();
    assert!(
        guards.iter().all(|g| g.fence() > w_fence),
        "a reader's token is not above the writer's before it"
    );
    for g in guards {
        g.release().await.unwrap();
    }
    let next = clients[1].write_lock(&key).await.unwrap();
    assert!(
        next.fence() > highest,
        "the next writer's token {} is not above the readers' {highest}",
        next.fence()
    );
    next.release().await.unwrap();
    for n in &nodes {
        assert!(!n.exists(&name(&key)), "a node kept the read lock");
        assert!(!n.exists(&format!("{}:readers", name(&key))));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_read_write_semantics() {
    let primary = RedisServer::start();
    let _replica = start_replica(primary.port());
    wait_replicas_online(&primary, 1, Duration::from_secs(10));
    let sentinels = Sentinels::start(3, "rwmaster", &primary, Timing::default());
    sentinels.wait_ready(1, Duration::from_secs(20));
    let mut clients = Vec::new();
    for _ in 0..2 {
        clients.push(
            LockClient::sentinel(sentinels.urls(), "rwmaster")
                .await
                .unwrap(),
        );
    }
    rw::readers_share_and_a_writer_excludes_them(&clients).await;
    rw::a_release_wakes_the_readers_together_then_the_writer(&clients).await;
    rw::reentry_and_upgrade(&clients[0]).await;
}

/// What Redis holds: the lock is `~r <token>` while read-held (the hold's
/// token, shared by its readers), each reader has its own entry (its
/// lease's end) in `lock:{K}:readers`, and after the last reader leaves
/// nothing of the lock is left.
#[tokio::test]
async fn a_read_hold_is_the_lock_key_plus_one_entry_per_reader() {
    let server = RedisServer::start();
    let clients = redis_clients(&server, 2).await;
    let key = unique("layout");
    let a = clients[0].read_lock(&key).await.unwrap();
    let b = clients[1].read_lock(&key).await.unwrap();
    assert_eq!(
        server.try_get(&name(&key)),
        Some(format!("~r {}", a.fence()))
    );
    assert_eq!(a.fence(), b.fence());
    let readers: Vec<String> =
        server.cmd(&["ZRANGE", &format!("{}:readers", name(&key)), "0", "-1"]);
    assert_eq!(readers.len(), 2, "{readers:?}");
    assert!(readers.iter().all(|r| r.contains(":r")), "{readers:?}");
    let pttl: i64 = server.cmd(&["PTTL", &name(&key)]);
    assert!(pttl > 0, "a read hold without expiry: {pttl}");
    a.release().await.unwrap();
    let readers: Vec<String> =
        server.cmd(&["ZRANGE", &format!("{}:readers", name(&key)), "0", "-1"]);
    assert_eq!(readers.len(), 1, "{readers:?}");
    b.release().await.unwrap();
    let mut left = server.keys(&format!("{}*", name(&key)));
    left.sort();
    assert!(left.is_empty(), "left behind: {left:?}");
}

/// A writer's release hands the lock to every queued reader in the same
/// script call, and the last reader's release to the queued writer: each
/// waiter costs its one failed attempt, nothing more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hand_off_to_readers_and_back_costs_no_extra_script_call() {
    let server = RedisServer::start();
    let clients = redis_clients(&server, 3).await;
    let key = unique("calls");
    let wait = Duration::from_secs(10);
    let w = clients[0].write_lock(&key).await.unwrap();
    server.reset_stats();
    let readers: Vec<_> = (0..4)
        .map(|i| {
            let (c, key) = (clients[1 + i % 2].clone(), key.clone());
            tokio::spawn(async move { c.read_lock(&key).wait(wait).await })
        })
        .collect();
    assert!(
        tests::eventually(wait, || rw::waiting(&clients, &key) == 4).await,
        "the readers did not wait"
    );
    let writer = {
        let (c, key) = (clients[0].clone(), key.clone());
        tokio::spawn(async move { c.write_lock(&key).wait(wait).await })
    };
    assert!(
        tests::eventually(wait, || rw::waiting(&clients, &key) == 5).await,
        "the writer did not wait"
    );
    w.release().await.unwrap();
    let mut guards = Vec::new();
    for r in readers {
        guards.push(r.await.unwrap().expect("reader"));
    }
    for g in guards {
        g.release().await.unwrap();
    }
    writer
        .await
        .unwrap()
        .expect("writer")
        .release()
        .await
        .unwrap();
    // 5 failed attempts, 1 + 4 + 1 releases.
    let calls = server.calls("evalsha");
    assert_eq!(
        calls, 11,
        "script calls for 4 readers and a writer handed the lock in turn"
    );
}

/// A client that reaches `server` through a proxy a test can cut, with a
/// short operation timeout so that cut-off calls give up soon.
async fn behind_a_proxy(server: &RedisServer) -> (Proxy, LockClient) {
    let proxy = Proxy::for_server(server);
    let client = LockClient::builder()
        .op_timeout(Duration::from_millis(300))
        .connect(&proxy.url())
        .await
        .unwrap();
    (proxy, client)
}

/// A reader cut off from Redis (as good as crashed) keeps the key
/// read-locked until its own lease ends, and no longer; the reader still
/// renewing keeps its hold through that.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_reader_lapses_on_its_own_lease_and_the_others_keep_theirs() {
    let server = RedisServer::start();
    let (proxy, cut_off) = behind_a_proxy(&server).await;
    let clients = redis_clients(&server, 2).await;
    let key = unique("crash");
    let lease = Duration::from_secs(2);
    let dead = cut_off.read_lock(&key).lease(lease).await.unwrap();
    proxy.set(Mode::Blackhole);
    // The other reader renews every lease/3 of 1.5 s.
    let live = clients[0]
        .read_lock(&key)
        .lease(Duration::from_millis(1500))
        .await
        .unwrap();
    let writer = {
        let (c, key) = (clients[1].clone(), key.clone());
        tokio::spawn(async move { c.write_lock(&key).wait(Duration::from_secs(20)).await })
    };
    // Past the dead reader's lease, the live one still holds the key.
    tokio::time::sleep(lease + Duration::from_millis(500)).await;
    assert!(
        !writer.is_finished(),
        "the writer got in beside a live reader"
    );
    live.release().await.expect("the live reader kept its hold");
    let g = writer
        .await
        .unwrap()
        .expect("the writer after both readers");
    g.release().await.unwrap();
    drop(dead);
}

/// Once the live readers are gone, a dead reader holds the key until its
/// own lease ends: a writer queued behind gets it then, not earlier, and
/// not only at the lock's longest lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_readers_entry_ends_with_its_lease_not_the_longest() {
    let server = RedisServer::start();
    let (proxy, cut_off) = behind_a_proxy(&server).await;
    let clients = redis_clients(&server, 2).await;
    let key = unique("dead-short");
    // The dead reader's lease is short; the live reader's is long, and it
    // leaves early: the key is then free once the short lease ends.
    let short = Duration::from_millis(1500);
    let started = Instant::now();
    let dead = cut_off.read_lock(&key).lease(short).await.unwrap();
    proxy.set(Mode::Blackhole);
    let live = clients[0]
        .read_lock(&key)
        .lease(Duration::from_secs(60))
        .await
        .unwrap();
    live.release().await.unwrap();
    let pttl: i64 = server.cmd(&["PTTL", &name(&key)]);
    assert!(
        pttl > 0 && pttl <= short.as_millis() as i64,
        "after the long reader left, the key lives {pttl} ms: more than the dead reader's lease"
    );
    let g = clients[1]
        .write_lock(&key)
        .wait(Duration::from_secs(10))
        .await
        .expect("the writer once the dead reader's lease ended");
    assert!(started.elapsed() >= short - Duration::from_millis(50));
    g.release().await.unwrap();
    drop(dead);
}

/// Lost replies: a reader's acquire that ran but whose answer was lost is
/// recognised on the re-send (one reader entry, not two), and a release
/// whose reply was lost leaves nothing behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_reply_neither_fails_a_reader_nor_leaves_it_behind() {
    let server = RedisServer::start();
    let proxy = Proxy::for_server(&server);
    let client = LockClient::connect(&proxy.url()).await.unwrap();
    let other = LockClient::connect(&server.url()).await.unwrap();
    for round in 0..5 {
        let key = unique(&format!("rl{round}"));
        let peer = other.read_lock(&key).await.unwrap();
        proxy.lose_reply_to(name(&key).as_bytes());
        let g = client
            .read_lock(&key)
            .wait(Duration::from_secs(5))
            .await
            .unwrap_or_else(|e| panic!("round {round}: {e}"));
        assert!(!proxy.armed(), "round {round}: the loss did not fire");
        let readers: Vec<String> =
            server.cmd(&["ZRANGE", &format!("{}:readers", name(&key)), "0", "-1"]);
        assert_eq!(readers.len(), 2, "round {round}: {readers:?}");
        proxy.lose_reply_to(name(&key).as_bytes());
        g.release()
            .await
            .unwrap_or_else(|e| panic!("round {round}: release: {e}"));
        let readers: Vec<String> =
            server.cmd(&["ZRANGE", &format!("{}:readers", name(&key)), "0", "-1"]);
        assert_eq!(readers.len(), 1, "round {round}: {readers:?}");
        peer.release().await.unwrap();
        assert!(!server.exists(&name(&key)), "round {round}: left behind");
    }
}

/// On Redlock a waiting writer marks a read-held lock so that new readers
/// wait behind it. Once the writer gives up, the mark lapses within about
/// one retry: new readers share again, although the first reader never
/// left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redlock_writer_that_gave_up_no_longer_keeps_readers_out() {
    let (nodes, urls) = redlock_nodes();
    let mut clients = Vec::new();
    for _ in 0..2 {
        clients.push(
            LockClient::builder()
                .retry_delay(Duration::from_millis(200))
                .op_timeout(Duration::from_millis(300))
                .redlock(&urls)
                .await
                .unwrap(),
        );
    }
    let key = unique("rl-gave-up");
    let first = clients[0].read_lock(&key).await.unwrap();
    let writer = {
        let (c, key) = (clients[1].clone(), key.clone());
        tokio::spawn(async move { c.write_lock(&key).wait(Duration::from_secs(2)).await })
    };
    let marked = || {
        nodes
            .iter()
            .filter(|n| {
                n.try_get(&name(&key))
                    .is_some_and(|v| v.split(' ').nth(2).is_some_and(|m| m.starts_with('w')))
            })
            .count()
            >= 2
    };
    assert!(
        tests::eventually(Duration::from_secs(5), marked).await,
        "the waiting writer did not mark the lock"
    );
    assert!(
        clients[0]
            .read_lock(&key)
            .try_acquire()
            .await
            .unwrap()
            .is_none(),
        "a new reader got in ahead of the waiting writer"
    );
    assert!(matches!(
        writer.await.unwrap(),
        Err(LockError::Timeout { .. })
    ));
    let late = clients[1]
        .read_lock(&key)
        .wait(Duration::from_secs(10))
        .await
        .expect("a reader after the writer gave up, beside the first reader");
    late.release().await.unwrap();
    first.release().await.unwrap();
    for n in &nodes {
        assert!(!n.exists(&name(&key)), "a node kept the read lock");
    }
}

/// A read hold released with `min_hold` time left keeps the key exactly
/// that long, not for the rest of its lease: a waiting writer gets it then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_hold_with_min_hold_left_keeps_the_key_that_long_only() {
    let server = RedisServer::start();
    let clients = redis_clients(&server, 2).await;
    let key = unique("rw-min-hold");
    let min_hold = Duration::from_secs(1);
    let r = clients[0]
        .read_lock(&key)
        .lease(Duration::from_secs(20))
        .min_hold(min_hold)
        .await
        .unwrap();
    r.release().await.unwrap();
    for k in [name(&key), format!("{}:readers", name(&key))] {
        let pttl: i64 = server.cmd(&["PTTL", &k]);
        assert!(
            pttl > 0 && pttl <= min_hold.as_millis() as i64,
            "{k} lives {pttl} ms after a release with at most {min_hold:?} of min_hold left"
        );
    }
    let w = clients[1]
        .write_lock(&key)
        .wait(Duration::from_secs(10))
        .await
        .expect("the writer once min_hold ended");
    w.release().await.unwrap();
}

/// A reader whose own lease ended is no longer a reader, even while other
/// readers keep the lock: its late release says so (the guard reports the
/// hold lost), and the same owner asking again is a fresh hold, not a
/// repeat. The scripts themselves, on a state built by hand.
#[tokio::test]
async fn a_reader_whose_lease_ended_holds_nothing_though_others_keep_the_lock() {
    let server = RedisServer::start();
    let key = name(&unique("rw-ended"));
    let keys = [
        key.clone(),
        tests::scripts::COUNTER.to_string(),
        format!("{key}:queue"),
        format!("{key}:waiters"),
        format!("{key}:readers"),
    ];
    let (secs, micros): (String, String) = {
        let t: Vec<String> = server.cmd(&["TIME"]);
        (t[0].clone(), t[1].clone())
    };
    let now_ms = secs.parse::<u64>().unwrap() * 1000 + micros.parse::<u64>().unwrap() / 1000;
    let _: () = server.cmd(&["SET", &key, "~r 5", "PX", "20000"]);
    let ended = (now_ms - 1000).to_string();
    let live = (now_ms + 20_000).to_string();
    let _: i64 = server.cmd(&["ZADD", &keys[4], &ended, "x:r1", &live, "y:r1"]);
    let mut conn = server.conn();
    let released = tests::scripts::release(&mut conn, &key, "x:r1", "r");
    assert_eq!(released, 0, "the release of a reader whose lease ended");
    let readers: Vec<String> = server.cmd(&["ZRANGE", &keys[4], "0", "-1"]);
    assert_eq!(readers, ["y:r1"]);
    assert_eq!(server.try_get(&key).as_deref(), Some("~r 5"));
    // Back as it was, and the same owner asks again.
    let _: i64 = server.cmd(&["ZADD", &keys[4], &ended, "x:r1"]);
    let reply = tests::scripts::acquire(&mut conn, &key, "x:r1", 30_000, "10000", "f");
    assert_eq!(
        reply,
        [1, 5],
        "a reader whose lease ended asks again: a fresh hold"
    );
}

#[derive(Debug)]
enum AppError {
    Lock(LockError),
}

impl From<LockError> for AppError {
    fn from(e: LockError) -> Self {
        AppError::Lock(e)
    }
}

#[distributed_lock(key = "doc:{id}", mode = "read", wait = "5s")]
async fn read_doc(id: &str, all_in: &tokio::sync::Barrier) -> Result<u64, AppError> {
    // Both readers are inside at once.
    tokio::time::timeout(Duration::from_secs(10), all_in.wait())
        .await
        .expect("readers did not share the key");
    Ok(lock_runtime::current_fence().unwrap())
}

#[distributed_lock(key = "doc:{id}")]
async fn write_doc(id: &str) -> Result<u64, AppError> {
    Ok(lock_runtime::current_fence().unwrap())
}

#[distributed_lock(key = "doc:{id}", mode = "write")]
async fn write_then_read(id: &str) -> Result<(u64, u64), AppError> {
    let outer = lock_runtime::current_fence().unwrap();
    Ok((outer, read_alone(id).await?))
}

#[distributed_lock(key = "doc:{id}", mode = "read")]
async fn read_alone(id: &str) -> Result<u64, AppError> {
    Ok(lock_runtime::current_fence().unwrap())
}

#[distributed_lock(key = "doc:{id}", mode = "read")]
async fn read_then_write(id: &str) -> Result<u64, AppError> {
    write_doc(id).await
}

#[distributed_lock(keys = ["doc:{a}", "doc:{b}"], mode = "read")]
async fn read_both(a: &str, b: &str) -> Result<Vec<u64>, AppError> {
    Ok(vec![lock_runtime::current_fence().unwrap()])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_attribute_takes_read_and_write_locks() {
    let server = global::redis().await;
    let id = unique("attr");
    let all_in = std::sync::Arc::new(tokio::sync::Barrier::new(2));
    let reader = || {
        let (id, all_in) = (id.clone(), all_in.clone());
        tokio::spawn(async move { read_doc(&id, &all_in).await })
    };
    let (a, b) = tokio::join!(reader(), reader());
    let (a, b) = (a.unwrap().unwrap(), b.unwrap().unwrap());
    assert_eq!(a, b, "readers see one token");
    let w = write_doc(&id).await.unwrap();
    assert!(w > a, "a writer's token is new");
    let (outer, inner) = write_then_read(&id).await.unwrap();
    assert_eq!(outer, inner, "a read inside a write re-enters it");
    match read_then_write(&id).await {
        Err(AppError::Lock(LockError::UpgradeRefused { key })) => {
            assert_eq!(key, format!("doc:{id}"))
        }
        other => panic!("an upgrade was not refused: {other:?}"),
    }
    let other = unique("attr-b");
    assert_eq!(read_both(&id, &other).await.unwrap().len(), 1);
    assert!(!server.exists(&name(&format!("doc:{id}"))));
}

/// A counter that lost its last increments (a failover to a replica that
/// had not seen them, a restart without persistence): the first reader of
/// a read hold gets a token floored at the server's clock, as a writer
/// does, not the stale counter, which is below earlier writers' tokens.
#[tokio::test]
async fn the_first_reader_of_a_hold_gets_a_token_floored_at_the_clock() {
    let server = RedisServer::start();
    let key = name(&unique("rw-floor"));
    let counter = tests::scripts::COUNTER;
    // What the lost writer had (a clock token), and what survived.
    let time: Vec<String> = server.cmd(&["TIME"]);
    let clock_us = time[0].parse::<u64>().unwrap() * 1_000_000 + time[1].parse::<u64>().unwrap();
    let _: () = server.cmd(&["SET", counter, "5"]);
    let reply: Vec<u64> =
        tests::scripts::acquire(&mut server.conn(), &key, "x:r1", 30_000, "", "f")
            .into_iter()
            .map(|n| n as u64)
            .collect();
    assert_eq!(reply[0], 1);
    assert!(
        reply[1] >= clock_us,
        "the reader got token {} from a stale counter (clock {clock_us})",
        reply[1]
    );
    let counter: u64 = server.cmd(&["GET", counter]);
    assert_eq!(counter, reply[1], "the floor is kept for the next writer");
}
