//! The reply-loss nemesis (`tests/src/reply_loss.rs`) against every
//! deployment: one Redis, Redlock over three, Sentinel, and Cluster, each
//! node behind a fault proxy that lets a chosen command run and cuts off
//! its reply. `FAULT_FULL=1` repeats each run more times.

use std::sync::Mutex;
use std::time::Duration;

use lock_runtime::LockClient;
use tests::cluster::Cluster;
use tests::proxy::Proxy;
use tests::reply_loss::{self, Row, Target};
use tests::sentinel::{start_replica, wait_replicas_online, Sentinels, Timing};
use tests::{global, unique, RedisServer};

fn rounds() -> usize {
    if std::env::var("FAULT_FULL").is_ok_and(|v| v != "0" && !v.is_empty()) {
        20
    } else {
        2
    }
}

static ROWS: Mutex<Vec<Row>> = Mutex::new(Vec::new());

fn builder() -> lock_runtime::LockClientBuilder {
    LockClient::builder()
        .wait(Duration::ZERO) // tries once unless a request says otherwise
        .op_timeout(Duration::from_millis(500))
        .connect_timeout(Duration::from_millis(500))
}

async fn run_rounds(target: &Target<'_>) {
    global::memory().await;
    let key = unique(target.name);
    // Scripts cached on the key's node first (a cluster node loads them on
    // first use), so that the armed command is the one that runs.
    // (With a wait: this runtime's first command opens its connections,
    // which a Redlock node's share of a short lease may not cover.) One
    // renewal (at a third of the lease) caches the renewal script too.
    let warm = target
        .client
        .lock(&key)
        .lease(Duration::from_secs(1))
        .wait(Duration::from_secs(5))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut tokens = vec![warm.fence()];
    warm.release().await.unwrap();
    let mut rows = Vec::new();
    for _ in 0..rounds() {
        rows.extend(
            reply_loss::run(target, &key, &mut tokens)
                .await
                .unwrap_or_else(|e| panic!("{e}")),
        );
    }
    reply_loss::print(&rows);
    ROWS.lock().unwrap().extend(rows);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_redis() {
    let server = RedisServer::start();
    let proxy = Proxy::for_server(&server);
    let client = builder().connect(&proxy.url()).await.unwrap();
    let rival = builder().connect(&server.url()).await.unwrap();
    let target = Target {
        name: "one Redis",
        client,
        rival,
        proxies: vec![&proxy],
        owners: Box::new(|k| vec![server.owner_of(k)]),
        quorum: 1,
    };
    run_rounds(&target).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock() {
    let nodes: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let proxies: Vec<Proxy> = nodes.iter().map(Proxy::for_server).collect();
    let client = builder()
        .redlock(proxies.iter().map(Proxy::url))
        .await
        .unwrap();
    let rival = builder()
        .redlock(nodes.iter().map(RedisServer::url))
        .await
        .unwrap();
    let target = Target {
        name: "Redlock",
        client,
        rival,
        proxies: proxies.iter().collect(),
        owners: Box::new(|k| nodes.iter().map(|n| n.owner_of(k)).collect()),
        quorum: 2,
    };
    run_rounds(&target).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel() {
    let primary = RedisServer::start();
    let _replica = start_replica(primary.port());
    wait_replicas_online(&primary, 1, Duration::from_secs(10));
    // The sentinels know the primary by its proxy, and hand that address to
    // the client.
    let proxy = Proxy::for_server(&primary);
    let sentinels = Sentinels::start_at(3, "mymaster", proxy.port(), Timing::default());
    sentinels.wait_ready(1, Duration::from_secs(20));
    let client = builder()
        .sentinel(sentinels.urls(), "mymaster")
        .await
        .unwrap();
    let rival = builder().connect(&primary.url()).await.unwrap();
    let target = Target {
        name: "Sentinel",
        client,
        rival,
        proxies: vec![&proxy],
        owners: Box::new(|k| vec![primary.owner_of(k)]),
        quorum: 1,
    };
    run_rounds(&target).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster() {
    let (cluster, proxies) = Cluster::start_behind_proxies(3, 0, 5000);
    let client = builder().cluster(cluster.proxy_urls()).await.unwrap();
    let rival = builder().cluster(cluster.proxy_urls()).await.unwrap();
    let nodes = &cluster.nodes;
    let target = Target {
        name: "Cluster",
        client,
        rival,
        proxies: proxies.iter().collect(),
        owners: Box::new(|k| nodes.iter().map(|n| n.owner_of(k)).collect()),
        quorum: 1,
    };
    run_rounds(&target).await;
}
