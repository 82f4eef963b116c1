//! Looking at locks and clearing them (`inspect`, `force_release`,
//! `locks`) on every deployment: one Redis, Sentinel, Cluster (listing
//! over every primary), Redlock (what a majority says; cleared on every
//! node) and memory. A forced release whose reply is lost, sent again,
//! never clears the holder that came after it.

use std::time::Duration;

use lock_runtime::{LockClient, LockError};
use tests::cluster::{key_slot, Cluster};
use tests::operations as ops;
use tests::proxy::{Mode, Proxy};
use tests::reply_loss::release_sha;
use tests::sentinel::{start_replica, wait_replicas_online, Sentinels, Timing};
use tests::{eventually, unique, RedisServer};

async fn redis_clients(url: &str, n: usize) -> Vec<LockClient> {
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(LockClient::connect(url).await.unwrap());
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_redis() {
    tests::init_tracing();
    let server = RedisServer::start();
    let clients = redis_clients(&server.url(), 3).await;
    ops::a_free_key(&clients[0]).await;
    ops::a_held_key(&clients).await;
    ops::a_read_held_key(&clients).await;
    ops::waiters_of_two_clients(&clients).await;
    let took = ops::a_forced_release_hands_over(&clients).await;
    println!("one Redis: a forced release handed the lock over in {took:?}");
    ops::a_forced_read_release_hands_to_the_writer(&clients, true).await;
    ops::a_conditional_release_leaves_a_holder_that_took_over(&clients, true, true).await;
    ops::the_cleared_holder_learns_at_its_renewal(&clients).await;
    ops::listing(&clients).await;
}

#[tokio::test]
async fn memory() {
    let client = LockClient::memory();
    let clients = [client.clone(), client.clone(), client];
    ops::a_free_key(&clients[0]).await;
    ops::a_held_key(&clients).await;
    ops::a_read_held_key(&clients).await;
    ops::waiters_of_two_clients(&clients).await;
    ops::a_forced_release_hands_over(&clients).await;
    ops::a_forced_read_release_hands_to_the_writer(&clients, true).await;
    ops::a_conditional_release_leaves_a_holder_that_took_over(&clients, true, true).await;
    ops::the_cleared_holder_learns_at_its_renewal(&clients).await;
    ops::listing(&clients).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel() {
    let primary = RedisServer::start();
    let _replica = start_replica(primary.port());
    wait_replicas_online(&primary, 1, Duration::from_secs(10));
    let sentinels = Sentinels::start(3, "mymaster", &primary, Timing::default());
    sentinels.wait_ready(1, Duration::from_secs(20));
    let mut clients = Vec::new();
    for _ in 0..3 {
        clients.push(
            LockClient::sentinel(sentinels.urls(), "mymaster")
                .await
                .unwrap(),
        );
    }
    ops::a_free_key(&clients[0]).await;
    ops::a_held_key(&clients).await;
    ops::waiters_of_two_clients(&clients).await;
    ops::a_forced_release_hands_over(&clients).await;
    ops::a_conditional_release_leaves_a_holder_that_took_over(&clients, false, true).await;
    ops::listing(&clients).await;
}

/// On a Cluster each key is read on its slot's primary, and listing scans
/// every primary: the keys listed live on more than one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster() {
    let cluster = Cluster::start(3, 0, 5000);
    let mut clients = Vec::new();
    for _ in 0..3 {
        clients.push(LockClient::cluster(cluster.urls()).await.unwrap());
    }
    ops::a_free_key(&clients[0]).await;
    ops::a_held_key(&clients).await;
    ops::a_read_held_key(&clients).await;
    ops::waiters_of_two_clients(&clients).await;
    ops::a_forced_release_hands_over(&clients).await;
    ops::a_forced_read_release_hands_to_the_writer(&clients, true).await;
    ops::a_conditional_release_leaves_a_holder_that_took_over(&clients, true, true).await;
    ops::the_cleared_holder_learns_at_its_renewal(&clients).await;
    ops::listing(&clients).await;

    let base = unique("ops-slots");
    let keys: Vec<String> = (0..12).map(|i| format!("{base}:{i}")).collect();
    let mut guards = Vec::new();
    for k in &keys {
        guards.push(clients[0].lock(k).await.unwrap());
    }
    let primaries: std::collections::BTreeSet<usize> = keys
        .iter()
        .map(|k| cluster.slot_owner(key_slot(&format!("lock:{{{k}}}"))))
        .collect();
    assert!(
        primaries.len() > 1,
        "all keys on one primary: {primaries:?}"
    );
    let listed: Vec<String> = clients[1]
        .locks(&format!("{base}:*"))
        .await
        .unwrap()
        .into_iter()
        .map(|l| l.key)
        .collect();
    let mut sorted = keys.clone();
    sorted.sort();
    assert_eq!(listed, sorted, "keys on {} primaries", primaries.len());
    for g in guards {
        g.release().await.unwrap();
    }
}

/// Redlock: a lock is what a majority of the nodes says, and a forced
/// release clears every node, a minority's partial grant too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock() {
    let nodes: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let urls: Vec<String> = nodes.iter().map(RedisServer::url).collect();
    let mut clients = Vec::new();
    for _ in 0..3 {
        clients.push(LockClient::redlock(&urls).await.unwrap());
    }
    ops::a_free_key(&clients[0]).await;
    ops::a_held_key(&clients).await;
    ops::a_read_held_key(&clients).await;
    ops::a_forced_release_hands_over(&clients).await;
    ops::a_forced_read_release_hands_to_the_writer(&clients, true).await;
    ops::a_conditional_release_leaves_a_holder_that_took_over(&clients, true, true).await;
    ops::the_cleared_holder_learns_at_its_renewal(&clients).await;
    ops::listing(&clients).await;

    // Held on one node of three: no majority, not a lock.
    let key = unique("ops-minority");
    let name = format!("lock:{{{key}}}");
    let _: () = nodes[0].cmd(&["SET", &name, "gone:1", "PX", "60000"]);
    assert_eq!(clients[0].inspect(&key).await.unwrap(), None);
    assert!(!clients[0].force_release(&key).await.unwrap());
    assert!(!nodes[0].exists(&name), "the minority's grant was left");

    // Held on two: a lock, with the lease a majority still gives it.
    for (n, ttl) in nodes.iter().zip(["9000", "6000"]) {
        let _: () = n.cmd(&["SET", &name, "held:1", "PX", ttl]);
    }
    let info = clients[0].inspect(&key).await.unwrap().expect("held");
    assert_eq!(info.holders, ["held:1"]);
    let ttl = info.ttl.unwrap();
    assert!(
        ttl <= Duration::from_secs(6) && ttl > Duration::from_secs(3),
        "{ttl:?}"
    );
    assert!(clients[0].force_release(&key).await.unwrap());
    assert!(nodes.iter().all(|n| !n.exists(&name)));
}

fn through_proxy() -> lock_runtime::LockClientBuilder {
    LockClient::builder()
        .op_timeout(Duration::from_secs(3))
        .connect_timeout(Duration::from_millis(500))
}

/// The forced release hands the lock to the waiter, and its reply is lost:
/// sent again, it finds the waiter holding the lock and leaves it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forced_release_sent_again_leaves_the_waiter_it_served() {
    tests::init_tracing();
    let server = RedisServer::start();
    let proxy = Proxy::for_server(&server);
    let operator = through_proxy().connect(&proxy.url()).await.unwrap();
    let clients = redis_clients(&server.url(), 2).await;
    let key = unique("ops-lost-reply");
    let stuck = clients[0]
        .lock(&key)
        .lease(Duration::from_secs(30))
        .await
        .unwrap();
    let waiter = {
        let (c, key) = (clients[1].clone(), key.clone());
        tokio::spawn(async move { c.lock(&key).wait(Duration::from_secs(30)).await })
    };
    assert!(
        eventually(Duration::from_secs(10), || clients[1].waiting_here(&key)
            == 1)
        .await
    );
    proxy.lose_reply_to(&release_sha());
    assert!(operator.force_release(&key).await.unwrap());
    assert_eq!(proxy.stats().replies_lost, 1, "no reply was lost");
    let next = waiter.await.unwrap().unwrap();
    assert_eq!(
        server.owner_of(&format!("lock:{{{key}}}")).as_deref(),
        Some(next.holder())
    );
    assert!(matches!(stuck.release().await, Err(LockError::Lost { .. })));
    next.release().await.expect("the waiter kept the lock");
}

/// The forced release deletes the lock (nobody waits), and its reply is
/// lost; before it is sent again, someone else takes the lock. The second
/// send must leave that new holder alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forced_release_sent_again_leaves_a_new_holder() {
    tests::init_tracing();
    let server = RedisServer::start();
    let proxy = Proxy::for_server(&server);
    let operator = through_proxy().connect(&proxy.url()).await.unwrap();
    let clients = redis_clients(&server.url(), 2).await;
    let key = unique("ops-new-holder");
    let name = format!("lock:{{{key}}}");
    let stuck = clients[0]
        .lock(&key)
        .lease(Duration::from_secs(30))
        .await
        .unwrap();
    // Once the reply is lost, nothing gets through until the new holder
    // has the lock.
    proxy.lose_reply_to_then(&release_sha(), Mode::Refuse);
    let forced = {
        let key = key.clone();
        tokio::spawn(async move { operator.force_release(&key).await })
    };
    assert!(
        eventually(Duration::from_secs(5), || !server.exists(&name)).await,
        "the forced release did not run"
    );
    let new = clients[1].lock(&key).await.unwrap();
    proxy.set(Mode::Pass);
    assert!(forced.await.unwrap().unwrap(), "the hold it removed");
    assert_eq!(proxy.stats().replies_lost, 1, "no reply was lost");
    assert_eq!(server.owner_of(&name).as_deref(), Some(new.holder()));
    assert!(matches!(stuck.release().await, Err(LockError::Lost { .. })));
    new.release().await.expect("the new holder kept the lock");
}
