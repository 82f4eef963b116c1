//! Redlock over five independent `redis-server` processes: the quorum
//! verdict for every up/down combination, a lock that outlives a minority of
//! its nodes, a loss reported when a majority goes, exclusion across tasks and
//! processes, and fencing tokens that keep increasing.

use std::collections::HashSet;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lock_runtime::{distributed_lock, LockClient, LockError};
use tests::proxy::{Mode, Proxy};
use tests::{spawn_tied, unique, RedisServer};

const N: usize = 5;

fn nodes() -> Vec<RedisServer> {
    (0..N).map(|_| RedisServer::start()).collect()
}

fn urls(nodes: &[RedisServer]) -> Vec<String> {
    nodes.iter().map(RedisServer::url).collect()
}

/// A client whose per-node timeout is short, so a paused node costs little
/// (and long enough for a loaded 2-core machine).
async fn redlock(nodes: &[RedisServer]) -> LockClient {
    LockClient::builder()
        .op_timeout(Duration::from_millis(300))
        .connect_timeout(Duration::from_millis(500))
        .redlock(urls(nodes))
        .await
        .expect("connect Redlock")
}

fn hash(key: &str) -> String {
    format!("lock:{{{key}}}")
}

/// The token a node's hold of `key` carries (its lock's value is
/// `"<owner> <token>"`).
fn hold_token_on(node: &RedisServer, key: &str) -> u64 {
    node.cmd::<Option<String>>(&["GET", &hash(key)])
        .and_then(|v| v.split(' ').nth(1).and_then(|t| t.parse().ok()))
        .unwrap_or(0)
}

/// The token counter of a node (one per node: every lock shares it).
fn fence_on(node: &RedisServer) -> u64 {
    node.cmd::<Option<u64>>(&["GET", "lock:fence"]).unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quorum_verdict_for_every_up_down_mask() {
    tests::init_tracing();
    let nodes = nodes();
    let client = redlock(&nodes).await;
    let started = Instant::now();
    for mask in 0u32..(1 << N) {
        let down: Vec<usize> = (0..N).filter(|i| mask & (1 << i) != 0).collect();
        for &i in &down {
            nodes[i].pause();
        }
        let key = unique(&format!("mask{mask:02}"));
        // A paused node is a slow one: a call keeps trying while it has
        // wait left (here short, for the masks without a majority).
        let out = client
            .lock(&key)
            .lease(Duration::from_secs(5))
            .wait(Duration::from_millis(500))
            .await;
        let up = N - down.len();
        match out {
            Ok(guard) => {
                assert!(
                    up > N / 2,
                    "mask {mask:05b}: granted with only {up} nodes up"
                );
                for (i, n) in nodes.iter().enumerate() {
                    if !down.contains(&i) {
                        assert!(
                            n.exists(&hash(&key)),
                            "mask {mask:05b}: node {i} lacks the lock"
                        );
                        assert_eq!(
                            hold_token_on(n, &key),
                            guard.fence(),
                            "mask {mask:05b}: node {i} fence"
                        );
                    }
                }
                guard.release().await.expect("release with a majority up");
            }
            Err(e) => {
                assert!(
                    up <= N / 2,
                    "mask {mask:05b}: refused with {up} nodes up: {e}"
                );
                assert!(matches!(e, LockError::Backend(_)), "mask {mask:05b}: {e:?}");
                let msg = e.to_string();
                for &i in &down {
                    assert!(
                        msg.contains(&nodes[i].url()),
                        "mask {mask:05b}: {msg} names no {}",
                        nodes[i].url()
                    );
                }
            }
        }
        // Granted or not, nothing but the fence counter is left on a live node.
        for (i, n) in nodes.iter().enumerate() {
            if !down.contains(&i) {
                assert!(
                    !n.exists(&hash(&key)),
                    "mask {mask:05b}: lock left on live node {i}"
                );
            }
        }
        for &i in &down {
            nodes[i].resume();
        }
    }
    println!("32 masks in {:?}", started.elapsed());
}

/// In the steady state every node hands out the same token (the client's
/// clock floor), so an acquire needs no second round trip to raise fences.
#[tokio::test]
async fn an_uncontended_acquire_is_one_round_trip_per_node() {
    let nodes: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let client = redlock(&nodes).await;
    let key = unique("one-trip");
    client.lock(&key).await.unwrap().release().await.unwrap();
    for n in &nodes {
        n.reset_stats();
    }
    let mut last = 0;
    for _ in 0..5 {
        let g = client.lock(&key).await.unwrap();
        assert!(g.fence() > last);
        last = g.fence();
        g.release().await.unwrap();
    }
    for (i, n) in nodes.iter().enumerate() {
        assert_eq!(
            n.calls("evalsha"),
            10,
            "node {i}: 5 acquires and 5 releases should be 10 script calls"
        );
        assert_eq!(fence_on(n), last, "node {i} holds another token");
    }
}

#[tokio::test]
async fn fence_is_raised_on_every_granting_node() {
    let mut nodes = nodes();
    let client = redlock(&nodes).await;
    let key = unique("fence");
    // Node 0 has handed out more tokens than the others (it was in more
    // majorities, and they are ahead of every node's clock floor): the
    // token must come from it and reach the others.
    let ahead: u64 = 8_000_000_000_000_000;
    let _: () = nodes[0].cmd(&["SET", "lock:fence", &ahead.to_string()]);
    let g = client.lock(&key).await.unwrap();
    assert_eq!(g.fence(), ahead + 1);
    for (i, n) in nodes.iter().enumerate() {
        assert_eq!(fence_on(n), ahead + 1, "node {i} was not raised");
        let value: String = n.cmd(&["GET", &hash(&key)]);
        assert_eq!(
            value,
            format!("{} {}", g.holder(), ahead + 1),
            "node {i}'s hold does not carry the token handed out"
        );
    }
    g.release().await.unwrap();
    // Without the node that had the maximum, the next token is still higher.
    nodes[0].kill();
    let g = client.lock(&key).await.unwrap();
    assert_eq!(g.fence(), ahead + 2);
    g.release().await.unwrap();
}

#[tokio::test]
async fn minority_killed_while_held_stays_held_and_renewed() {
    let mut nodes = nodes();
    let client = redlock(&nodes).await;
    let other = redlock(&nodes).await;
    let key = unique("minority");
    let lease = Duration::from_secs(2);
    let guard = client.lock(&key).lease(lease).await.unwrap();
    nodes[3].kill();
    nodes[4].kill();
    // Several leases pass: renewals on the three left keep it.
    tokio::time::sleep(lease * 3).await;
    assert!(!guard.is_lost(), "lost with a majority still up");
    for n in &nodes[..3] {
        let ttl: i64 = n.cmd(&["PTTL", &hash(&key)]);
        assert!(ttl > 0, "not renewed on a live node (pttl {ttl})");
    }
    let err = other.lock(&key).wait(Duration::ZERO).await.unwrap_err();
    assert!(matches!(err, LockError::Timeout { .. }), "{err:?}");
    guard.release().await.expect("still held at release");
    for n in &nodes[..3] {
        assert!(!n.exists(&hash(&key)));
    }
}

/// A waiter listens on one node. A release must wake it also when that
/// node never had the lock (the holder got its majority elsewhere), and
/// taking back a partial grant must not wake it round in a loop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_wakes_a_waiter_listening_on_a_node_without_the_lock() {
    let nodes: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let holder = redlock(&nodes).await;
    let waiting = LockClient::builder()
        .op_timeout(Duration::from_millis(300))
        .retry_delay(Duration::from_secs(30))
        .redlock(urls(&nodes))
        .await
        .unwrap();
    let key = unique("wake-anywhere");
    let held = holder
        .lock(&key)
        .lease(Duration::from_secs(10))
        .await
        .unwrap();
    // The first node (where the waiter subscribes) loses the lock; the
    // other two still hold a majority.
    let _: i64 = nodes[0].cmd(&["DEL", &hash(&key)]);
    let (w, k) = (waiting.clone(), key.clone());
    let waiter = tokio::spawn(async move { w.lock(&k).wait(Duration::from_secs(20)).await });
    assert!(tests::eventually(Duration::from_secs(5), || waiting.waiting_here(&key) == 1).await);
    for n in &nodes {
        n.reset_stats();
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let attempts: u64 = nodes.iter().map(|n| n.calls("evalsha")).sum();
    assert!(
        attempts <= 3 * 2,
        "the waiter kept trying while the lock was held: {attempts} script calls in 500 ms"
    );
    let released = Instant::now();
    held.release().await.unwrap();
    let g = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("the release did not wake the waiter")
        .unwrap()
        .unwrap();
    assert!(
        released.elapsed() < Duration::from_secs(2),
        "woken only after {:?}",
        released.elapsed()
    );
    g.release().await.unwrap();
}

/// A release reaches the nodes one by one: the node the waiter listens
/// on may publish before the others have released, and the waiter's
/// attempt then finds the lock still held there. It asks again within its
/// operation timeout instead of sleeping out the holder's lease (before:
/// no lock 8 s after the release, of a 10 s lease).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wake_up_ahead_of_the_other_nodes_releases_is_followed_up() {
    let nodes: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    // The holder reaches the nodes other than the waiter's through
    // proxies that are slowed before it releases.
    let slow = [Proxy::for_server(&nodes[1]), Proxy::for_server(&nodes[2])];
    let holder = LockClient::builder()
        .op_timeout(Duration::from_secs(2))
        .redlock([nodes[0].url(), slow[0].url(), slow[1].url()])
        .await
        .unwrap();
    let waiting = LockClient::builder()
        .op_timeout(Duration::from_secs(1))
        .retry_delay(Duration::from_secs(30))
        .redlock(urls(&nodes))
        .await
        .unwrap();
    let key = unique("wake-ahead");
    let held = holder
        .lock(&key)
        .lease(Duration::from_secs(10))
        .await
        .unwrap();
    let (w, k) = (waiting.clone(), key.clone());
    let waiter = tokio::spawn(async move { w.lock(&k).wait(Duration::from_secs(20)).await });
    // (A Redlock client listens on its first node while it answers: here
    // the one the holder reaches without delay.)
    assert!(tests::eventually(Duration::from_secs(5), || waiting.waiting_here(&key) == 1).await);
    for p in &slow {
        p.set(Mode::Delay(Duration::from_millis(300)));
    }
    let released = Instant::now();
    held.release().await.unwrap();
    let g = tokio::time::timeout(Duration::from_secs(8), waiter)
        .await
        .expect("the waiter slept out the holder's lease")
        .unwrap()
        .unwrap();
    let after = released.elapsed();
    assert!(
        after < Duration::from_secs(3),
        "taken {after:?} after the release"
    );
    for p in &slow {
        p.set(Mode::Pass);
    }
    g.release().await.unwrap();
}

#[distributed_lock(key = "{key}", lease = "2s")]
async fn hold_until_lost(
    key: &str,
    running: tokio::sync::oneshot::Sender<()>,
) -> Result<(), LockError> {
    let _ = running.send(());
    std::future::pending::<()>().await;
    Ok(())
}

#[tokio::test]
async fn majority_killed_while_held_reaches_the_body_as_lost_within_the_lease() {
    let mut nodes = nodes();
    lock_runtime::init(redlock(&nodes).await).unwrap();
    let key = unique("majority");
    let (tx, rx) = tokio::sync::oneshot::channel();
    let body = tokio::spawn(async move { hold_until_lost(&key, tx).await });
    rx.await.expect("body never ran");
    let killed = Instant::now();
    for n in &mut nodes[..3] {
        n.kill();
    }
    let out = tokio::time::timeout(Duration::from_secs(10), body)
        .await
        .expect("the body never learned the lock was lost")
        .unwrap();
    let after = killed.elapsed();
    println!("majority killed: Err(Lost) reached the body {after:?} later (lease 2s)");
    assert!(matches!(out, Err(LockError::Lost { .. })), "{out:?}");
    // The lease counts from the last renewal, which was before the kill.
    assert!(after < Duration::from_millis(2500), "took {after:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_tasks_exclusive_exact_counter_and_increasing_fences() {
    let nodes = nodes();
    let clients = [redlock(&nodes).await, redlock(&nodes).await];
    let key = unique("tasks");
    let (tasks, rounds) = (12, 15);
    let counter = Arc::new(AtomicU64::new(0));
    let fences = Arc::new(Mutex::new(Vec::new()));
    let mut handles = Vec::new();
    for t in 0..tasks {
        let client = clients[t % 2].clone();
        let (key, counter, fences) = (key.clone(), counter.clone(), fences.clone());
        handles.push(tokio::spawn(async move {
            for _ in 0..rounds {
                let g = client
                    .lock(&key)
                    .wait(Duration::from_secs(30))
                    .await
                    .expect("lock");
                // A read-modify-write that any overlap would break.
                let v = counter.load(Ordering::SeqCst);
                fences.lock().unwrap().push(g.fence());
                tokio::task::yield_now().await;
                counter.store(v + 1, Ordering::SeqCst);
                g.release().await.expect("held to the end");
            }
        }));
    }
    for h in handles {
        h.await.unwrap();
    }
    assert_eq!(counter.load(Ordering::SeqCst), (tasks * rounds) as u64);
    let fences = fences.lock().unwrap();
    assert!(
        fences.windows(2).all(|w| w[0] < w[1]),
        "fences not strictly increasing in lock order: {fences:?}"
    );
    for n in &nodes {
        assert!(!n.exists(&hash(&key)));
    }
}

#[test]
fn processes_exclusive_exact_counter() {
    let nodes = nodes();
    let key = unique("procs");
    let list = urls(&nodes).join(",");
    let (procs, rounds) = (3, 40);
    let children: Vec<_> = (0..procs)
        .map(|_| {
            let mut cmd = Command::new(env!("CARGO_BIN_EXE_lock_worker"));
            cmd.args(["--redlock", "increment", &list, &key, &rounds.to_string()])
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit());
            spawn_tied(cmd).unwrap()
        })
        .collect();
    let mut fences = Vec::new();
    for child in children {
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "worker failed: {:?}", out.status);
        for line in String::from_utf8(out.stdout).unwrap().lines() {
            fences.push(line.strip_prefix("FENCE ").unwrap().parse::<u64>().unwrap());
        }
    }
    let count: i64 = nodes[0].cmd(&["GET", &format!("{key}:counter")]);
    assert_eq!(count, procs * rounds, "lost updates: two holders at once");
    let distinct: HashSet<_> = fences.iter().collect();
    assert_eq!(
        distinct.len(),
        fences.len(),
        "two holders got the same fence"
    );
}

#[tokio::test]
async fn unreachable_majority_is_a_backend_error_naming_the_nodes_within_five_seconds() {
    let up = RedisServer::start();
    let down: Vec<String> = (0..2)
        .map(|_| format!("redis://127.0.0.1:{}", tests::free_port()))
        .collect();
    let started = Instant::now();
    let err = LockClient::redlock([up.url(), down[0].clone(), down[1].clone()])
        .await
        .unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "took {:?}",
        started.elapsed()
    );
    assert!(matches!(err, LockError::Backend(_)), "{err:?}");
    let msg = err.to_string();
    assert!(down.iter().all(|u| msg.contains(u.as_str())), "{msg}");
    let empty: [&str; 0] = [];
    let err = LockClient::redlock(empty).await.unwrap_err();
    assert!(matches!(err, LockError::Config(_)), "{err:?}");
}

/// A Redlock waiter listens on one node, whose lock its busy attempt may
/// not have marked (that answer was lost, or the node was slow): a release
/// that frees the lock there still wakes it.
#[tokio::test]
async fn a_release_of_an_unmarked_lock_wakes_redlock_waiters() {
    let node = RedisServer::start();
    let key = hash(&unique("unmarked"));
    let _: () = node.cmd(&["SET", &key, "a:1", "PX", "30000"]);
    let client = redis::Client::open(node.url()).unwrap();
    let mut sub = client.get_connection().unwrap();
    let mut sub = sub.as_pubsub();
    sub.subscribe(format!("{key}:released")).unwrap();
    sub.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let released = tests::scripts::release(&mut node.conn(), &key, "a:1", "a");
    assert_eq!(released, 1);
    assert!(sub.get_message().is_ok(), "the waiter was not woken");
}

/// Nodes that answer slowly, not refuse: a call with wait left keeps
/// trying, and takes the lock once they answer in time again. Every node
/// behind a proxy that holds replies back for longer than `op_timeout`,
/// then lets them through; nothing else holds the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_with_wait_left_keeps_trying_while_nodes_answer_slowly() {
    tests::init_tracing();
    let nodes: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let proxies: Vec<Proxy> = nodes.iter().map(Proxy::for_server).collect();
    let op_timeout = Duration::from_millis(600);
    let client = LockClient::builder()
        .op_timeout(op_timeout)
        .redlock(proxies.iter().map(Proxy::url).collect::<Vec<_>>())
        .await
        .expect("connect Redlock");
    for p in &proxies {
        p.set(Mode::DelayReplies(op_timeout * 3));
    }
    let key = unique("slow-nodes");
    let wait = Duration::from_secs(12);
    let task = {
        let (client, key) = (client.clone(), key.clone());
        tokio::spawn(async move {
            let started = Instant::now();
            let out = client
                .lock(&key)
                .lease(Duration::from_secs(10))
                .wait(wait)
                .await;
            (out, started.elapsed())
        })
    };
    // Slow for five operation timeouts (each try: a vote, then the undo).
    tokio::time::sleep(op_timeout * 5).await;
    let early = task.is_finished();
    for p in &proxies {
        p.set(Mode::Pass);
    }
    let (out, took) = task.await.unwrap();
    assert!(
        !early,
        "the call ended while the nodes were slow: {out:?} after {took:?}"
    );
    let guard = out.unwrap_or_else(|e| panic!("a call with wait left failed after {took:?}: {e}"));
    println!(
        "took the lock {took:?} after asking, with nodes slow for the first {:?}",
        op_timeout * 5
    );
    assert!(took < wait, "{took:?}");
    guard.release().await.unwrap();
}

/// Every node extends a hold, slowly: replies come 0.6 × `op_timeout`
/// (1 s) late, and the lease (3 s) is under 6 × `op_timeout`. The hold is
/// kept: a renewal may wait for its answers as long as a lock's own sends
/// do. Before, each node's renewal was cut at lease/10 (300 ms), every
/// node's answer counted as none, and the hold was lost at its lease while
/// every node had extended it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewals_answered_within_op_timeout_keep_a_hold_with_a_short_lease() {
    tests::init_tracing();
    let nodes: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let proxies: Vec<Proxy> = nodes.iter().map(Proxy::for_server).collect();
    let op_timeout = Duration::from_secs(1);
    let client = LockClient::builder()
        .op_timeout(op_timeout)
        .redlock(proxies.iter().map(Proxy::url).collect::<Vec<_>>())
        .await
        .expect("connect Redlock");
    let key = unique("slow-renewals");
    let guard = client
        .lock(&key)
        .lease(Duration::from_secs(3))
        .await
        .unwrap();
    for p in &proxies {
        p.set(Mode::DelayReplies(op_timeout * 6 / 10));
    }
    // Time is the subject: two leases with every answer late.
    let lost = tokio::time::timeout(Duration::from_secs(6), guard.lost()).await;
    for p in &proxies {
        p.set(Mode::Pass);
    }
    assert!(
        lost.is_err(),
        "the hold was lost while every node extended it"
    );
    guard.release().await.expect("held to the end");
}

// ---------------------------------------------------------------------------
// Semaphores: a permit needs ⌊N·M/(N+1)⌋ + 1 of the M nodes.

/// A Redlock client over the nodes at `pick`.
async fn redlock_over(nodes: &[RedisServer], pick: &[usize]) -> LockClient {
    LockClient::builder()
        .op_timeout(Duration::from_millis(300))
        .connect_timeout(Duration::from_millis(500))
        .redlock(pick.iter().map(|&i| nodes[i].url()))
        .await
        .expect("connect Redlock")
}

/// Permit holders of `key` on a node (fields of its hash).
fn permit_holders_on(node: &RedisServer, key: &str) -> usize {
    node.cmd::<usize>(&["HLEN", &hash(key)])
}

/// Two permits of three nodes: a history of partitions left one holder on
/// nodes {0,1} and one on {1,2} (each taken by a client that reached only
/// those). Node 1 is full; nodes 0 and 2 each have a permit free. A
/// majority (two nodes) would admit a third holder on {0,2}, and three
/// would hold a semaphore of two. The quorum for two permits of three nodes
/// is all three: node 1 refuses, and the request waits until a permit comes
/// back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_needs_more_than_a_majority_where_a_majority_would_admit_one_too_many() {
    let nodes: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let key = unique("sem-quorum");
    let left = redlock_over(&nodes, &[0, 1]).await;
    let right = redlock_over(&nodes, &[1, 2]).await;
    let a = left
        .semaphore(&key, 2)
        .lease(Duration::from_secs(5))
        .await
        .unwrap();
    let b = right
        .semaphore(&key, 2)
        .lease(Duration::from_secs(5))
        .await
        .unwrap();
    let held: Vec<usize> = nodes.iter().map(|n| permit_holders_on(n, &key)).collect();
    assert_eq!(held, [1, 2, 1], "the arranged history");

    let all = redlock(&nodes).await;
    let third = all
        .semaphore(&key, 2)
        .lease(Duration::from_secs(5))
        .wait(Duration::from_millis(800))
        .await;
    let held: Vec<usize> = nodes.iter().map(|n| permit_holders_on(n, &key)).collect();
    assert!(
        matches!(third, Err(LockError::Timeout { .. })),
        "a third holder of two permits: {third:?} (holders per node now {held:?})"
    );
    // Its partial grants were taken back.
    assert_eq!(held, [1, 2, 1]);

    // A permit comes back: now every node has one free.
    let waiting = tokio::spawn({
        let (all, key) = (all.clone(), key.clone());
        async move {
            all.semaphore(&key, 2)
                .lease(Duration::from_secs(5))
                .wait(Duration::from_secs(10))
                .await
        }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let a_fence = a.fence();
    a.release().await.unwrap();
    let c = waiting.await.unwrap().expect("a permit once one came back");
    assert!(
        c.fence() > b.fence() && b.fence() > a_fence,
        "tokens in grant order"
    );
    let held: Vec<usize> = nodes.iter().map(|n| permit_holders_on(n, &key)).collect();
    assert_eq!(held, [1, 2, 2]);
    c.release().await.unwrap();
    b.release().await.unwrap();
    for n in &nodes {
        assert!(
            n.keys(&format!("{}*", hash(&key))).is_empty(),
            "left behind"
        );
    }
}

/// Many tasks of two clients on three nodes: never more than two bodies at
/// once, two at once often, every token unique, nothing left behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_most_n_bodies_hold_a_redlock_semaphore_at_once() {
    let nodes: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let clients = [redlock(&nodes).await, redlock(&nodes).await];
    let key = unique("sem-bodies");
    let (tasks, rounds) = (6, 10);
    let inside = Arc::new(AtomicU64::new(0));
    let most = Arc::new(AtomicU64::new(0));
    let fences = Arc::new(Mutex::new(Vec::new()));
    let mut handles = Vec::new();
    for t in 0..tasks {
        let client = clients[t % 2].clone();
        let (key, inside, most, fences) =
            (key.clone(), inside.clone(), most.clone(), fences.clone());
        handles.push(tokio::spawn(async move {
            for _ in 0..rounds {
                let g = client
                    .semaphore(&key, 2)
                    .wait(Duration::from_secs(30))
                    .await
                    .expect("a permit");
                let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                fences.lock().unwrap().push(g.fence());
                tokio::time::sleep(Duration::from_millis(5)).await;
                inside.fetch_sub(1, Ordering::SeqCst);
                g.release().await.expect("held to the end");
            }
        }));
    }
    for h in handles {
        h.await.unwrap();
    }
    let most = most.load(Ordering::SeqCst);
    let fences = fences.lock().unwrap();
    let unique_fences: HashSet<u64> = fences.iter().copied().collect();
    println!(
        "Redlock semaphore of 2 on 3 nodes: {} permits, at most {most} bodies at once",
        fences.len()
    );
    assert_eq!(most, 2, "bodies at once");
    assert_eq!(
        unique_fences.len(),
        fences.len(),
        "a token handed out twice"
    );
    for n in &nodes {
        assert!(
            n.keys(&format!("{}*", hash(&key))).is_empty(),
            "left behind"
        );
    }
}

/// The price of the quorum: two permits of three nodes need every node, so
/// one node down refuses permits while locks (a majority) still work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_of_two_on_three_nodes_needs_every_node() {
    let nodes: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let client = redlock(&nodes).await;
    nodes[2].pause();
    let key = unique("sem-down");
    let permit = client
        .semaphore(&key, 2)
        .wait(Duration::from_millis(500))
        .await;
    let lock = client
        .lock(unique("lock-down"))
        .wait(Duration::from_secs(2))
        .await;
    nodes[2].resume();
    assert!(
        permit.is_err(),
        "a permit of two with one node of three down"
    );
    lock.expect("a lock with two nodes of three")
        .release()
        .await
        .unwrap();
    // One permit (a lock's quorum) still works.
    let one = client.semaphore(&key, 1).await.unwrap();
    one.release().await.unwrap();
}

/// Two permits of five nodes need four: a permit outlives its lease by
/// renewals while one node is killed (four left), and is released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_is_renewed_by_its_quorum_while_one_node_of_five_dies() {
    let mut nodes = nodes();
    let client = redlock(&nodes).await;
    let key = unique("sem-renew");
    let g = client
        .semaphore(&key, 2)
        .lease(Duration::from_millis(900))
        .await
        .unwrap();
    nodes[4].kill();
    tokio::time::sleep(Duration::from_millis(2700)).await;
    for n in &nodes[..4] {
        assert_eq!(permit_holders_on(n, &key), 1, "renewed on every live node");
    }
    g.release().await.expect("held to the end");
    for n in &nodes[..4] {
        assert!(
            n.keys(&format!("{}*", hash(&key))).is_empty(),
            "left behind"
        );
    }
}

/// Two overlapping permits never carry one token. Three nodes, two permits
/// (all three nodes grant). The state left by a holder B whose raise landed
/// on node 1 between A's grant there and A's raise: B's permit carries T on
/// node 1, and node 0's counter is just below T, so A is handed T there
/// and T is the highest token A saw. Raising node 1 to T is refused (B
/// has it), and A's token goes above it on every node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_overlapping_permits_never_share_a_token() {
    let nodes: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let key = unique("sem-token");
    let t: u64 = 9_000_000_000_000_000;
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let _: () = nodes[0].cmd(&["SET", "lock:fence", &(t - 1).to_string()]);
    let _: () = nodes[1].cmd(&[
        "HSET",
        &hash(&key),
        "b:s2.1",
        &format!("{} {t}", now_ms + 60_000),
    ]);
    let _: () = nodes[1].cmd(&["PEXPIRE", &hash(&key), "60000"]);
    let client = redlock(&nodes).await;
    let a = client
        .semaphore(&key, 2)
        .lease(Duration::from_secs(5))
        .await
        .expect("a permit: one of two is free on every node");
    println!("B holds token {t}; A was given {}", a.fence());
    assert_ne!(a.fence(), t, "two live permits with one token");
    assert!(a.fence() > t);
    for n in &nodes {
        let fields: Vec<String> = n.cmd(&["HVALS", &hash(&key)]);
        let tokens: HashSet<&str> = fields.iter().filter_map(|v| v.split(' ').nth(1)).collect();
        assert_eq!(
            tokens.len(),
            fields.len(),
            "one token twice on a node: {fields:?}"
        );
        assert!(
            fields
                .iter()
                .any(|v| v.ends_with(&format!(" {}", a.fence()))),
            "{fields:?}"
        );
    }
    a.release().await.unwrap();
}
