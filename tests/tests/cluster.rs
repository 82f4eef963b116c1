//! Redis Cluster: three primaries with a replica each, made with
//! `redis-cli --cluster create`. Exclusion over keys in every primary's
//! slots; a primary killed mid-run never leaves two holders who were both
//! told they held the lock to the end.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lock_runtime::{LockClient, LockError};
use tests::cluster::Cluster;
use tests::unique;

fn builder() -> lock_runtime::LockClientBuilder {
    LockClient::builder()
        .op_timeout(Duration::from_millis(1500))
        .connect_timeout(Duration::from_millis(500))
        .retry_delay(Duration::from_millis(100))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exclusion_over_keys_in_every_slot_range_exact_counters() {
    tests::init_tracing();
    let cluster = Cluster::start(3, 1, 2000);
    let clients = [
        builder().cluster(cluster.urls()).await.unwrap(),
        builder().cluster(cluster.urls()).await.unwrap(),
    ];
    let base = unique("slots");
    let keys: Vec<String> = (0..24).map(|i| format!("{base}:{i}")).collect();
    let (tasks, rounds) = (8, 30);
    // Per key: the unguarded counter, how often it was locked, the fences in
    // lock order.
    type PerKey = (AtomicU64, AtomicU64, Mutex<Vec<u64>>);
    let state: Arc<HashMap<String, PerKey>> = Arc::new(
        keys.iter()
            .map(|k| (k.clone(), Default::default()))
            .collect(),
    );
    let mut handles = Vec::new();
    for t in 0..tasks {
        let client = clients[t % 2].clone();
        let (keys, state) = (keys.clone(), state.clone());
        handles.push(tokio::spawn(async move {
            for r in 0..rounds {
                let key = &keys[(t * 7 + r * 5) % keys.len()];
                let (counter, locked, fences) = &state[key];
                let g = client
                    .lock(key)
                    .wait(Duration::from_secs(30))
                    .await
                    .unwrap_or_else(|e| panic!("lock: {e:?}"));
                let v = counter.load(Ordering::SeqCst);
                fences.lock().unwrap().push(g.fence());
                tokio::task::yield_now().await;
                counter.store(v + 1, Ordering::SeqCst);
                locked.fetch_add(1, Ordering::SeqCst);
                g.release()
                    .await
                    .unwrap_or_else(|e| panic!("held to the end: {e:?}"));
            }
        }));
    }
    for h in handles {
        h.await.unwrap();
    }
    let mut total = 0;
    for (key, (counter, locked, fences)) in state.iter() {
        let locked = locked.load(Ordering::SeqCst);
        assert_eq!(counter.load(Ordering::SeqCst), locked, "{key}: lost update");
        let fences = fences.lock().unwrap();
        assert!(
            fences.windows(2).all(|w| w[0] < w[1]),
            "{key}: fences not increasing: {fences:?}"
        );
        total += locked;
    }
    assert_eq!(total, (tasks * rounds) as u64);
    // The keys were spread over every primary (each has token counters of
    // its slots), and nothing of the locks is left.
    for port in cluster.primaries_seen_by(0) {
        let node = &cluster.nodes[cluster.index_of(port)];
        let left = node.keys(&format!("lock:{{{base}:*"));
        assert!(left.is_empty(), "left on primary {port}: {left:?}");
        let counters = node.keys("lock:fence{*");
        assert!(!counters.is_empty(), "no key landed on primary {port}");
    }
}

/// One hold as the holder saw it.
struct Hold {
    key: usize,
    from: Instant,
    to: Instant,
    /// `release()` said Ok: the holder was told it held the lock throughout.
    confirmed: bool,
    lost: bool,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn primary_killed_mid_run_each_lock_survives_or_its_holder_is_told() {
    tests::init_tracing();
    let mut cluster = Cluster::start(3, 1, 1000);
    let clients = [
        builder().cluster(cluster.urls()).await.unwrap(),
        builder().cluster(cluster.urls()).await.unwrap(),
    ];
    let base = unique("failover");
    let keys: Arc<Vec<String>> = Arc::new((0..12).map(|i| format!("{base}:{i}")).collect());
    let holds = Arc::new(Mutex::new(Vec::<Hold>::new()));
    let errors = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let mut handles = Vec::new();
    for t in 0..8 {
        let client = clients[t % 2].clone();
        let (keys, holds, errors, stop) =
            (keys.clone(), holds.clone(), errors.clone(), stop.clone());
        handles.push(tokio::spawn(async move {
            let mut r = 0;
            while !stop.load(Ordering::SeqCst) {
                r += 1;
                let key = (t * 5 + r * 7) % keys.len();
                let g = match client
                    .lock(&keys[key])
                    .lease(Duration::from_millis(1500))
                    .wait(Duration::from_secs(5))
                    .await
                {
                    Ok(g) => g,
                    Err(LockError::Timeout { .. }) => continue,
                    Err(_) => {
                        // The primary is gone and not yet replaced.
                        errors.fetch_add(1, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        continue;
                    }
                };
                let from = Instant::now();
                tokio::time::sleep(Duration::from_millis(15)).await;
                let to = Instant::now();
                let out = g.release().await;
                holds.lock().unwrap().push(Hold {
                    key,
                    from,
                    to,
                    confirmed: out.is_ok(),
                    lost: matches!(out, Err(LockError::Lost { .. })),
                });
            }
        }));
    }

    let wait_holds = |n: usize| {
        let holds = holds.clone();
        async move {
            let limit = Instant::now() + Duration::from_secs(30);
            while holds.lock().unwrap().len() < n {
                assert!(Instant::now() < limit, "locks stopped being granted");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    };
    wait_holds(100).await;
    let victim_port = cluster.primaries_seen_by(0)[0];
    let victim = cluster.index_of(victim_port);
    let before = holds.lock().unwrap().len();
    cluster.nodes[victim].kill();
    let killed = Instant::now();
    let survivor = (victim + 1) % cluster.nodes.len();
    // Wait for the replica to take over the dead primary's slots.
    let limit = Instant::now() + Duration::from_secs(30);
    loop {
        let info: String = cluster.nodes[survivor].cmd(&["CLUSTER", "INFO"]);
        if info.contains("cluster_state:ok")
            && !cluster.primaries_seen_by(survivor).contains(&victim_port)
        {
            break;
        }
        assert!(Instant::now() < limit, "no failover within 30 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let failover = killed.elapsed();
    // Locks keep being granted after the failover, on every key.
    let after_failover = holds.lock().unwrap().len() + 100;
    wait_holds(after_failover).await;
    stop.store(true, Ordering::SeqCst);
    for h in handles {
        h.await.unwrap();
    }
    for key in keys.iter() {
        let g = clients[0]
            .lock(key)
            .wait(Duration::from_secs(10))
            .await
            .unwrap_or_else(|e| panic!("every key can be locked after the failover: {e:?}"));
        g.release().await.unwrap();
    }

    let holds = holds.lock().unwrap();
    let mut by_key: HashMap<usize, Vec<&Hold>> = HashMap::new();
    for h in holds.iter() {
        by_key.entry(h.key).or_default().push(h);
    }
    let (mut overlaps, mut unsafe_overlaps) = (0, 0);
    for hs in by_key.values() {
        for (i, a) in hs.iter().enumerate() {
            for b in &hs[i + 1..] {
                if a.from < b.to && b.from < a.to {
                    overlaps += 1;
                    if a.confirmed && b.confirmed {
                        unsafe_overlaps += 1;
                    }
                }
            }
        }
    }
    let lost = holds.iter().filter(|h| h.lost).count();
    let unconfirmed = holds.iter().filter(|h| !h.confirmed).count();
    println!(
        "Cluster failover {failover:?} after a primary was killed; {} holds ({before} before the kill), \
         {lost} told lost, {unconfirmed} not confirmed at release, {} acquire errors during the \
         failover, {overlaps} overlapping holds, {unsafe_overlaps} of them with both holders told \
         they held it",
        holds.len(),
        errors.load(Ordering::SeqCst)
    );
    assert_eq!(
        unsafe_overlaps, 0,
        "two holders were both told they held the same lock at once"
    );
}

#[tokio::test]
async fn unreachable_cluster_is_a_backend_error_within_five_seconds() {
    let urls: Vec<String> = (0..3)
        .map(|_| format!("redis://127.0.0.1:{}", tests::free_port()))
        .collect();
    let started = Instant::now();
    let err = LockClient::cluster(&urls).await.unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "took {:?}",
        started.elapsed()
    );
    assert!(matches!(err, LockError::Backend(_)), "{err:?}");
}

/// Locks in different slots (so on different primaries) are renewed past
/// their lease, and one deleted from outside is reported lost while the
/// others stay held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watchdog_renews_locks_on_every_primary_and_reports_a_deleted_one() {
    let cluster = Cluster::start(3, 0, 2000);
    let client = builder().cluster(cluster.urls()).await.unwrap();
    let base = unique("renew");
    let lease = Duration::from_secs(1);
    let mut guards = Vec::new();
    for i in 0..12 {
        guards.push(
            client
                .lock(format!("{base}:{i}"))
                .lease(lease)
                .await
                .unwrap(),
        );
    }
    // Time is the subject: three and a half leases.
    tokio::time::sleep(lease * 7 / 2).await;
    assert!(
        guards.iter().all(|g| !g.is_lost()),
        "a lock was lost although its primary was up"
    );
    // Delete one lock behind the client's back, on whichever primary owns it.
    let victim = format!("lock:{{{}}}", guards[0].key());
    let mut deleted = 0;
    for url in cluster.urls() {
        let mut conn = redis::Client::open(url.as_str())
            .unwrap()
            .get_connection()
            .unwrap();
        if let Ok(n) = redis::cmd("DEL").arg(&victim).query::<u64>(&mut conn) {
            deleted += n;
        }
    }
    assert_eq!(deleted, 1, "the lock hash was not on exactly one primary");
    let lost = tokio::time::timeout(lease * 3, guards[0].lost()).await;
    assert!(lost.is_ok(), "the deleted lock was not reported lost");
    for g in guards.drain(1..) {
        assert!(!g.is_lost());
        g.release().await.expect("still held");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slot_migration_while_held_follows_ask_and_moved() {
    use tests::cluster::key_slot;
    tests::init_tracing();
    let cluster = Cluster::start(3, 0, 2000);
    // A slot migration is as slow as this test's harness makes it; a
    // TRYAGAIN is retried until the call's wait runs out
    // (`calls_wait_out_a_long_slot_migration` holds one for longer).
    let client = builder()
        .op_timeout(Duration::from_secs(5))
        .cluster(cluster.urls())
        .await
        .unwrap();
    let key = unique("migrate");
    let hash = format!("lock:{{{key}}}");
    let slot = key_slot(&hash);
    let reported: i64 = cluster.nodes[0].cmd(&["CLUSTER", "KEYSLOT", &hash]);
    assert_eq!(slot as i64, reported, "key_slot disagrees with Redis");
    let lease = Duration::from_millis(1500);
    let held = client.lock(&key).lease(lease).await.unwrap();
    let from = cluster.slot_owner(slot);
    let to = (from + 1) % cluster.nodes.len();

    // Mid-migration, the lock hash already moved: renewals and the source's
    // ASK take them to the target.
    cluster.begin_migration(slot, from, to);
    cluster.migrate_keys(from, to, &[&hash]);
    tokio::time::sleep(lease * 2).await;
    assert!(!held.is_lost(), "renewals did not follow ASK");

    // A new lock in the slot needs both its keys (the lock and its slot's
    // token counter, still on the source) on one node: a node says
    // TRYAGAIN until the migration is through, and the acquire waits.
    let other = (0..)
        .map(|i| format!("{key}-ask-{i}"))
        .find(|k| key_slot(&format!("lock:{{{k}}}")) == slot)
        .unwrap();
    let try_agains = || cluster.try_again_errors(from) + cluster.try_again_errors(to);
    let before = try_agains();
    let pending = tokio::spawn({
        let client = client.clone();
        async move { client.lock(&other).await }
    });
    let limit = Instant::now() + Duration::from_secs(5);
    while try_agains() == before {
        assert!(
            Instant::now() < limit,
            "the acquire never met the migration"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    cluster.finish_migration(slot, from, to);
    let g = pending
        .await
        .unwrap()
        .unwrap_or_else(|e| panic!("acquire waited out the migration: {e:?}"));
    assert!(g.fence() > 0);
    g.release().await.unwrap();

    // Migrated: the release follows MOVED to the new owner, and the fence
    // counter moved with the slot.
    assert_eq!(cluster.slot_owner(slot), to);
    let fence = held.fence();
    held.release()
        .await
        .unwrap_or_else(|e| panic!("release after MOVED: {e:?}"));
    let again = client.lock(&key).await.unwrap();
    assert!(again.fence() > fence, "{} after {fence}", again.fence());
    again.release().await.unwrap();
}

/// A release that hands the lock over while its slot starts moving (nothing
/// moved yet): the script must not run halfway, telling the waiter it
/// holds a lock whose value was never written. Every key the release and
/// the waiters' attempts touch is declared, so a moving slot refuses the
/// whole call (`TRYAGAIN`) until the migration is through; then the writer
/// and the reader queued behind it are served in turn (their grant
/// channels follow the slot), and no call fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_off_while_the_slot_moves_is_whole_or_waits() {
    use tests::cluster::key_slot;
    tests::init_tracing();
    let cluster = Cluster::start(3, 0, 2000);
    let connect = || async {
        builder()
            .op_timeout(Duration::from_secs(5))
            .retry_delay(Duration::from_secs(30))
            .cluster(cluster.urls())
            .await
            .unwrap()
    };
    let (holder, writer, reader) = (connect().await, connect().await, connect().await);
    let key = unique("moving-hand-off");
    let slot = key_slot(&format!("lock:{{{key}}}"));
    let held = holder.lock(&key).await.unwrap();
    let w = tokio::spawn({
        let (c, k) = (writer.clone(), key.clone());
        async move { c.lock(&k).wait(Duration::from_secs(30)).await }
    });
    assert!(tests::eventually(Duration::from_secs(5), || writer.waiting_here(&key) == 1).await);
    let r = tokio::spawn({
        let (c, k) = (reader.clone(), key.clone());
        async move { c.read_lock(&k).wait(Duration::from_secs(30)).await }
    });
    assert!(tests::eventually(Duration::from_secs(5), || reader.waiting_here(&key) == 1).await);
    let from = cluster.slot_owner(slot);
    let to = (from + 1) % cluster.nodes.len();
    cluster.begin_migration(slot, from, to);
    let releasing = tokio::spawn(async move { held.release().await });
    // The release meets the moving slot and waits; nobody is told anything.
    let try_agains = || cluster.try_again_errors(from) + cluster.try_again_errors(to);
    assert!(
        tests::eventually(Duration::from_secs(5), || try_agains() > 0).await,
        "the release never met the migration"
    );
    assert!(
        !w.is_finished(),
        "the writer was told it holds the lock mid-migration"
    );
    cluster.finish_migration(slot, from, to);
    let moved = Instant::now();
    releasing
        .await
        .unwrap()
        .unwrap_or_else(|e| panic!("the release failed with the migration: {e:?}"));
    let g = w
        .await
        .unwrap()
        .unwrap_or_else(|e| panic!("the writer's wait failed: {e:?}"));
    assert_eq!(
        cluster.nodes[to]
            .try_get(&format!("lock:{{{key}}}"))
            .map(|v| tests::owner_in(&v).to_owned()),
        Some(g.holder().to_owned()),
        "the writer was handed a lock Redis does not hold for it"
    );
    g.release().await.unwrap();
    let rg = r
        .await
        .unwrap()
        .unwrap_or_else(|e| panic!("the reader's wait failed: {e:?}"));
    rg.release().await.unwrap();
    // The waiters followed their grant channels to the slot's new node (the
    // server ended their subscriptions there): neither waited for its
    // 30-s fallback retry.
    assert!(
        moved.elapsed() < Duration::from_secs(15),
        "the waiters were served {:?} after the migration",
        moved.elapsed()
    );
}

/// Ports in a `CLUSTER SLOTS` reply: every node serving a range.
fn slot_ports(reply: &redis::Value) -> Vec<u16> {
    let redis::Value::Array(ranges) = reply else {
        panic!("CLUSTER SLOTS: {reply:?}")
    };
    let mut ports = Vec::new();
    for range in ranges {
        let redis::Value::Array(fields) = range else {
            panic!("slot range: {range:?}")
        };
        for node in &fields[2..] {
            match node {
                redis::Value::Array(n) => match n[1] {
                    redis::Value::Int(p) => ports.push(p as u16),
                    ref v => panic!("port: {v:?}"),
                },
                v => panic!("slot node: {v:?}"),
            }
        }
    }
    ports
}

/// Clients reach a cluster only through its nodes' proxies: what the nodes
/// announce are proxy ports, and locks on keys all over the slots go
/// through every primary's proxy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_behind_proxies_smoke() {
    tests::init_tracing();
    let (cluster, proxies) = Cluster::start_behind_proxies(3, 1, 2000);
    let proxy_ports: Vec<u16> = proxies.iter().map(|p| p.port()).collect();
    // Replicas show in CLUSTER SLOTS only once gossip carried their
    // replication offset; the primaries are there at once.
    let slots: redis::Value = cluster.nodes[0].cmd(&["CLUSTER", "SLOTS"]);
    let announced = slot_ports(&slots);
    assert!(announced.len() >= 3, "{slots:?}");
    assert!(
        announced.iter().all(|p| proxy_ports.contains(p)),
        "announced {announced:?}, proxies {proxy_ports:?}"
    );
    let nodes: String = cluster.nodes[0].cmd(&["CLUSTER", "NODES"]);
    for line in nodes.lines() {
        let addr = line.split(' ').nth(1).unwrap();
        let port: u16 = addr
            .split('@')
            .next()
            .unwrap()
            .rsplit(':')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        assert!(proxy_ports.contains(&port), "{line}");
    }
    // Replicas dial their primary at its announced address: through its proxy.
    for (i, node) in cluster.nodes.iter().enumerate() {
        let info: String = node.cmd(&["INFO", "replication"]);
        if let Some(port) = info.lines().find_map(|l| l.strip_prefix("master_port:")) {
            let port: u16 = port.trim().parse().unwrap();
            assert!(
                proxy_ports.contains(&port),
                "node {i} replicates from {port}"
            );
        }
    }
    let primaries: Vec<usize> = cluster
        .primaries_seen_by(0)
        .into_iter()
        .map(|port| cluster.index_of_proxy(port))
        .collect();
    assert_eq!(primaries.len(), 3);
    let before: Vec<_> = proxies.iter().map(|p| p.stats()).collect();

    let client = builder().cluster(cluster.proxy_urls()).await.unwrap();
    let base = unique("proxied");
    // Four keys on each primary (names hash anywhere: pick them so).
    let mut per_node = std::collections::BTreeMap::<usize, usize>::new();
    let keys: Vec<String> = (0..)
        .map(|i| format!("{base}:{i}"))
        .filter(|key| {
            let slot = tests::cluster::key_slot(&format!("lock:{{{key}}}"));
            let n = per_node.entry(cluster.slot_owner(slot)).or_default();
            *n += 1;
            *n <= 4
        })
        .take(12)
        .collect();
    for key in keys {
        let g = client.lock(&key).await.unwrap();
        g.release().await.unwrap();
        // slot_owner reads proxy ports from CLUSTER NODES and maps them back.
        // The token came from the counter of the lock's slot, on its owner.
        let slot = tests::cluster::key_slot(&format!("lock:{{{key}}}"));
        let owner = cluster.slot_owner(slot);
        let counters: Vec<String> = cluster.nodes[owner].keys("lock:fence{*");
        assert!(
            counters.iter().any(|c| tests::cluster::key_slot(c) == slot),
            "no token counter of slot {slot} on node {owner}: {counters:?}"
        );
    }
    for i in primaries {
        let (now, then) = (proxies[i].stats(), before[i]);
        assert!(
            now.accepted > then.accepted && now.bytes_forwarded > then.bytes_forwarded,
            "no client traffic through node {i}'s proxy: {then:?} -> {now:?}"
        );
        let counters = cluster.nodes[i].keys("lock:fence{*");
        assert!(!counters.is_empty(), "no key landed on primary {i}");
    }
}

/// A slot with many keys migrated by hand, held half moved for longer
/// than two operation timeouts (default settings). Every lock script
/// declares keys that do not exist yet, so both nodes answer `TRYAGAIN`
/// until the migration is through: the calls must wait it out. A fenced
/// `lock(k).wait(20s)` on a held key and on a free one both succeed; the
/// holder's release sent during the migration lands then or at once
/// (nobody is queued behind it: see
/// `a_held_lock_neither_blocks_nor_slows_a_resharding`), a `min_hold`
/// release (`keep`) once it ends, so nobody waits out a lease and no key of
/// these locks is left behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_wait_out_a_long_slot_migration() {
    use tests::cluster::key_slot;
    tests::init_tracing();
    let cluster = Cluster::start(3, 0, 2000);
    let connect = || async { LockClient::builder().cluster(cluster.urls()).await.unwrap() };
    let (holder, waiter) = (connect().await, connect().await);
    let key = unique("long-migration");
    let hash = format!("lock:{{{key}}}");
    let slot = key_slot(&hash);
    // Two more locks in the same slot: one free, one held with `min_hold`.
    let in_slot = |tag: &str| {
        (0..)
            .map(|i| format!("{key}-{tag}-{i}"))
            .find(|k| key_slot(&format!("lock:{{{k}}}")) == slot)
            .unwrap()
    };
    let (free, kept) = (in_slot("free"), in_slot("kept"));
    let from = cluster.slot_owner(slot);
    let to = (from + 1) % cluster.nodes.len();
    let fillers: Vec<String> = (0..400).map(|i| format!("{{{key}}}:filler:{i}")).collect();
    for f in &fillers {
        let _: () = cluster.nodes[from].cmd(&["SET", f, "x"]);
    }
    let held = holder.lock(&key).await.unwrap();
    let kept_guard = holder
        .lock(&kept)
        .min_hold(Duration::from_secs(3))
        .await
        .unwrap();
    let lease = Duration::from_secs(30);

    // Half the keys moved, the locks' keys still on the source.
    cluster.begin_migration(slot, from, to);
    let half: Vec<&str> = fillers[..200].iter().map(String::as_str).collect();
    cluster.migrate_keys(from, to, &half);
    let began = Instant::now();
    let wait = |k: String| {
        let c = waiter.clone();
        tokio::spawn(async move {
            let g = c.lock(&k).wait(Duration::from_secs(20)).await;
            (g, Instant::now())
        })
    };
    let (on_held, on_free, on_kept) = (wait(key.clone()), wait(free.clone()), wait(kept.clone()));
    let try_agains = || cluster.try_again_errors(from) + cluster.try_again_errors(to);
    assert!(
        tests::eventually(Duration::from_secs(5), || try_agains() > 0).await,
        "nothing met the migration"
    );
    let releasing = tokio::spawn(async move { held.release().await });
    let keeping = tokio::spawn(async move { kept_guard.release().await });
    // Held mixed for more than two operation timeouts.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let mut early = Vec::new();
    let on_held = running("lock(k).wait(20s) on the held key", on_held, &mut early).await;
    let on_free = running("lock(k).wait(20s) on a free key", on_free, &mut early).await;
    assert!(
        early.is_empty(),
        "ended mid-migration, with wait or lease left:\n{}",
        early.join("\n")
    );
    let (on_held, on_free) = (on_held.unwrap(), on_free.unwrap());
    cluster.finish_migration(slot, from, to);
    let finished = Instant::now();
    eprintln!("migration held for {:?}", finished - began);

    releasing
        .await
        .unwrap()
        .unwrap_or_else(|e| panic!("the release sent during the migration failed: {e:?}"));
    keeping
        .await
        .unwrap()
        .unwrap_or_else(|e| panic!("the min_hold release sent during the migration failed: {e:?}"));
    for (what, t) in [("held", on_held), ("free", on_free), ("kept", on_kept)] {
        let (g, at) = t.await.unwrap();
        let g = g.unwrap_or_else(|e| panic!("lock(k).wait(20s) on the {what} key: {e:?}"));
        // The released lock was not left to its lease: taken soon after the
        // migration ended.
        assert!(
            at.duration_since(finished) < lease / 3,
            "the {what} key was taken {:?} after the migration",
            at.duration_since(finished)
        );
        assert!(g.fence() > 0);
        g.release().await.unwrap();
    }
    let s = slot.to_string();
    let left: Vec<String> = cluster.nodes[to].cmd(&["CLUSTER", "GETKEYSINSLOT", &s, "1000"]);
    let left: Vec<&String> = left
        .iter()
        .filter(|k| k.contains(&key) && !k.contains(":filler:"))
        .collect();
    assert!(left.is_empty(), "keys left behind: {left:?}");
}

/// `task`, if still running; if it ended, how, in `early`.
async fn running<T: std::fmt::Debug>(
    what: &str,
    task: tokio::task::JoinHandle<T>,
    early: &mut Vec<String>,
) -> Option<tokio::task::JoinHandle<T>> {
    if !task.is_finished() {
        return Some(task);
    }
    let out = task.await.unwrap();
    early.push(format!("{what}: {out:?}"));
    None
}

/// An operator's resharding of a slot of 10 000 keys (100 keys per
/// `MIGRATE`, 50 ms apart, as `redis-cli --cluster reshard` moves them),
/// with two locks of that slot held when it starts and released during it:
/// one whose keys the move lists first (they are on the target by then),
/// one whose keys it lists last (still on the source). Each release returns
/// `Ok` while the move still runs, and leaves no key of its lock on either
/// node; the move is not slowed (compared with the same move alone, back,
/// with a generous margin) and meets no error; the keys are free after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_lock_neither_blocks_nor_slows_a_resharding() {
    use tests::cluster::key_slot;
    tests::init_tracing();
    let cluster = Arc::new(Cluster::start(3, 0, 2000));
    let connect = || async { LockClient::builder().cluster(cluster.urls()).await.unwrap() };
    let (holder, other) = (connect().await, connect().await);
    let key = unique("reshard");
    let slot = key_slot(&format!("lock:{{{key}}}"));
    let early = (0..)
        .map(|i| format!("{key}-first-{i}"))
        .find(|k| key_slot(&format!("lock:{{{k}}}")) == slot)
        .unwrap();
    let a = cluster.slot_owner(slot);
    let b = (a + 1) % cluster.nodes.len();
    let reshard = |from: usize, to: usize| {
        let cluster = cluster.clone();
        tokio::task::spawn_blocking(move || {
            let (pause, limit) = (Duration::from_millis(50), Duration::from_secs(90));
            cluster.reshard(slot, (from, to), 100, pause, limit)
        })
    };
    let lease = Duration::from_secs(12);
    // A slot lists its newest keys first: taken before the slot's other
    // keys are written, the first lock's keys move last; the second's first.
    let last = holder.lock(&key).lease(lease).await.unwrap();
    cluster.fill(a, &key, 10_000);
    let first = holder.lock(&early).lease(lease).await.unwrap();
    let moving = reshard(a, b);
    assert!(
        tests::eventually(Duration::from_secs(10), || cluster.keys_in_slot(b, slot)
            >= 2000)
        .await,
        "the move did not start"
    );
    for (what, k, g) in [("listed first", &early, first), ("listed last", &key, last)] {
        g.release()
            .await
            .unwrap_or_else(|e| panic!("the release of the lock {what}, during the move: {e:?}"));
        assert!(
            !moving.is_finished(),
            "the release of the lock {what} waited for the move to end"
        );
        let hash = format!("lock:{{{k}}}");
        for i in [a, b] {
            assert!(
                cluster.nodes[i].keys(&hash).is_empty(),
                "the lock {what} is still on node {i} after its release"
            );
        }
    }
    let with_locks = moving.await.unwrap();
    let with_locks = with_locks.unwrap_or_else(|e| panic!("the move with locks held: {e}"));
    let alone = reshard(b, a).await.unwrap().unwrap();
    eprintln!("the move alone: {alone:?}; with locks released during it: {with_locks:?}");
    // Generous: the move's own time varies with the machine's load; a
    // lease's wait does not hide in it.
    assert!(
        with_locks.took < alone.took * 2 + Duration::from_secs(3),
        "the move took {:?} with locks held, {:?} alone",
        with_locks.took,
        alone.took
    );
    assert!(
        with_locks.errors.is_empty(),
        "the move met errors: {:?}",
        with_locks.errors
    );
    for k in [&key, &early] {
        let g = other
            .lock(k)
            .wait(Duration::from_secs(2))
            .await
            .unwrap_or_else(|e| panic!("the key was not free after the move: {e:?}"));
        g.release().await.unwrap();
    }
}

/// A lock that vanished under its holder (deleted here; after a shard
/// failover that lost its `SET`, the same): its release says `Lost`, as on
/// one Redis, fenced or not, and however the release is sent. A release
/// whose reply is lost and that is sent again still returns `Ok`
/// (`tests::reply_loss` covers every deployment).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn releasing_a_vanished_lock_is_lost() {
    use tests::cluster::key_slot;
    tests::init_tracing();
    let cluster = Cluster::start(3, 0, 2000);
    let client = builder().cluster(cluster.urls()).await.unwrap();
    for fence in [true, false] {
        let key = unique("vanished");
        let hash = format!("lock:{{{key}}}");
        let node = cluster.slot_owner(key_slot(&hash));
        let g = client.lock(&key).fence(fence).await.unwrap();
        let _: i64 = cluster.nodes[node].cmd(&["DEL", &hash]);
        let out = g.release().await;
        assert!(
            matches!(out, Err(LockError::Lost { .. })),
            "fence({fence}): releasing a vanished lock returned {out:?}"
        );
    }
}

/// An attempt that took a lock mid-migration (on the importing node, by
/// `ASK`) but whose caller went away before the answer came: its undo meets
/// the slot on the move and must still land, not leave the lock held for
/// nobody for its lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_undo_mid_migration_leaves_nothing_held() {
    use tests::cluster::key_slot;
    tests::init_tracing();
    let (cluster, proxies) = Cluster::start_behind_proxies(3, 0, 2000);
    let client = builder()
        .op_timeout(Duration::from_secs(5))
        .cluster(cluster.proxy_urls())
        .await
        .unwrap();
    let key = unique("undo-moving");
    let hash = format!("lock:{{{key}}}");
    let slot = key_slot(&hash);
    let from = cluster.slot_owner(slot);
    let to = (from + 1) % cluster.nodes.len();
    cluster.fill(from, &key, 200);
    cluster.begin_migration(slot, from, to);
    let half: Vec<String> = (0..100).map(|i| format!("{{{key}}}:filler:{i}")).collect();
    let half: Vec<&str> = half.iter().map(String::as_str).collect();
    cluster.migrate_keys(from, to, &half);

    // The attempt lands on the importing node; its answer comes 3 s late.
    proxies[to].slow_connection_of(b"SET", Duration::ZERO, Duration::from_secs(3));
    let lease = Duration::from_secs(30);
    let attempt = tokio::time::timeout(
        Duration::from_secs(1),
        std::future::IntoFuture::into_future(client.lock(&key).fence(false).lease(lease)),
    )
    .await;
    assert!(attempt.is_err(), "the attempt was answered: {attempt:?}");
    // Only that answer is late; what follows it on the connection is not.
    proxies[to].end_slow_spell();
    let on = |i: usize| !cluster.nodes[i].keys(&hash).is_empty();
    assert!(
        tests::eventually(Duration::from_secs(5), || on(to)).await,
        "the attempt never took the lock: nothing to undo"
    );
    // Still mid-migration: the undo lands now, not at the lease's end.
    let gone = tests::eventually(Duration::from_secs(10), || !on(from) && !on(to)).await;
    cluster.finish_migration(slot, from, to);
    assert!(gone, "the lock taken by the undone attempt is still held");
}
