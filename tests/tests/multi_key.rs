//! Multi-key locks (`LockClient::lock_all`, `keys = [...]`) against real
//! servers: all keys or none, sorted order, duplicates once, and keys in
//! different Redis Cluster slots.

use std::future::IntoFuture;
use std::time::{Duration, Instant};

use lock_runtime::{distributed_lock, LockClient, LockError};
use tests::cluster::Cluster;
use tests::proxy::Proxy;
use tests::{eventually, global, unique, RedisServer};

fn name(key: &str) -> String {
    format!("lock:{{{key}}}")
}

#[tokio::test]
async fn all_keys_are_taken_in_sorted_order_duplicates_once_and_released_together() {
    let server = RedisServer::start();
    let client = LockClient::connect(&server.url()).await.unwrap();
    let (a, b) = (unique("acct-a"), unique("acct-b"));
    let guard = client
        .lock_all([b.clone(), a.clone(), b.clone()])
        .await
        .unwrap();
    assert_eq!(guard.keys(), [a.as_str(), b.as_str()]);
    let fences = guard.fences();
    assert_eq!(fences.len(), 2);
    assert_eq!(guard.fence(), fences[0], "fence() is the first key's");
    assert!(server.exists(&name(&a)) && server.exists(&name(&b)));
    // Each key is busy for everyone else.
    assert!(client.lock(&a).try_acquire().await.unwrap().is_none());
    assert!(client.lock(&b).try_acquire().await.unwrap().is_none());
    guard.release().await.unwrap();
    assert!(!server.exists(&name(&a)) && !server.exists(&name(&b)));
}

#[tokio::test]
async fn a_busy_key_times_out_and_leaves_no_other_key_held() {
    let server = RedisServer::start();
    let client = LockClient::connect(&server.url()).await.unwrap();
    let (a, b) = (unique("t-a"), unique("t-b"));
    let held_b = client.lock(&b).await.unwrap();
    let e = client
        .lock_all([a.clone(), b.clone()])
        .lease(Duration::from_secs(30))
        .wait(Duration::from_millis(200))
        .await
        .unwrap_err();
    assert!(
        matches!(&e, LockError::Timeout { key, .. } if *key == b),
        "{e:?}"
    );
    // `a` was taken first and released at once, not left for its lease.
    assert!(!server.exists(&name(&a)), "the other key was left behind");
    held_b.release().await.unwrap();
}

#[tokio::test]
async fn callers_naming_the_keys_in_opposite_orders_do_not_deadlock() {
    let server = RedisServer::start();
    let (a, b) = (unique("d-a"), unique("d-b"));
    let mut tasks = Vec::new();
    for flip in [false, true] {
        let client = LockClient::connect(&server.url()).await.unwrap();
        let keys = if flip {
            [b.clone(), a.clone()]
        } else {
            [a.clone(), b.clone()]
        };
        tasks.push(tokio::spawn(async move {
            for _ in 0..25 {
                let g = client
                    .lock_all(keys.clone())
                    .wait(Duration::from_secs(10))
                    .await?;
                tokio::task::yield_now().await;
                g.release().await?;
            }
            Ok::<(), LockError>(())
        }));
    }
    for t in tasks {
        t.await.unwrap().expect("no deadlock, no timeout");
    }
}

#[tokio::test]
async fn a_dropped_multi_key_request_leaves_no_key_behind() {
    let server = RedisServer::start();
    let client = LockClient::connect(&server.url()).await.unwrap();
    let keys: Vec<String> = (0..4).map(|i| unique(&format!("drop{i}"))).collect();
    for delay in [10u64, 50, 100, 200, 400] {
        let fut = client.lock_all(keys.clone()).into_future();
        let _ = tokio::time::timeout(Duration::from_micros(delay), fut).await;
    }
    let gone = eventually(Duration::from_secs(5), || {
        keys.iter().all(|k| !server.exists(&name(k)))
    })
    .await;
    assert!(gone, "a dropped lock_all left keys behind");
}

#[distributed_lock(keys = ["account:{from}", "account:{to}"], wait = "5s")]
async fn transfer(from: u64, to: u64) -> Result<(u64, Vec<(String, u64)>), LockError> {
    let _ = (from, to);
    Ok((
        lock_runtime::current_fence().expect("held"),
        lock_runtime::current_fences(),
    ))
}

#[tokio::test]
async fn the_attribute_takes_every_key_and_the_body_sees_the_first_token() {
    let server = global::redis().await;
    let (x, y) = (fastrand::u64(1..1 << 40), fastrand::u64(1 << 41..1 << 42));
    let (fence, fences) = transfer(y, x).await.unwrap();
    // The first key in sorted order holds the token the body saw; keys are
    // taken in that order, so its token is the lower one.
    let mut keys = [format!("account:{x}"), format!("account:{y}")];
    keys.sort();
    let seen: Vec<&str> = fences.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(seen, keys);
    assert_eq!(fence, fences[0].1);
    assert!(fences[0].1 < fences[1].1, "{fences:?}");
    assert!(!server.exists(&name(&format!("account:{x}"))));
    assert!(!server.exists(&name(&format!("account:{y}"))));
}

#[tokio::test]
async fn on_a_cluster_the_keys_may_live_in_different_slots() {
    let cluster = Cluster::start(3, 0, 2000);
    let client = LockClient::cluster(cluster.urls()).await.unwrap();
    let keys: Vec<String> = (0..6).map(|i| unique(&format!("slot{i}"))).collect();
    let t = Instant::now();
    let guard = client.lock_all(keys.clone()).await.unwrap();
    assert_eq!(guard.fences().len(), 6);
    assert!(t.elapsed() < Duration::from_secs(5));
    guard.release().await.unwrap();
    let again = client.lock_all(keys).await.unwrap();
    again.release().await.unwrap();
}

#[tokio::test]
async fn in_memory_the_same_rules_hold() {
    let client = LockClient::memory();
    let held = client.lock("m-b").await.unwrap();
    let e = client
        .lock_all(["m-a", "m-b"])
        .wait(Duration::from_millis(50))
        .await
        .unwrap_err();
    assert!(matches!(e, LockError::Timeout { .. }));
    assert!(client.lock("m-a").try_acquire().await.unwrap().is_some());
    held.release().await.unwrap();
}

/// A pattern that matches the script calls on `key`'s lock.
fn call_on(key: &str) -> Vec<u8> {
    name(key).into_bytes()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_reply_on_one_key_neither_fails_the_lock_nor_leaves_a_key() {
    let server = RedisServer::start();
    let proxy = Proxy::for_server(&server);
    let client = LockClient::connect(&proxy.url()).await.unwrap();
    let rival = LockClient::connect(&server.url()).await.unwrap();
    for round in 0..5 {
        let (a, b) = (
            unique(&format!("rl{round}-a")),
            unique(&format!("rl{round}-b")),
        );
        // The second key's acquire runs, and its reply is lost.
        proxy.lose_reply_to(&call_on(&b));
        let guard = client
            .lock_all([a.clone(), b.clone()])
            .wait(Duration::from_secs(5))
            .await
            .unwrap_or_else(|e| panic!("round {round}: {e}"));
        assert!(!proxy.armed(), "round {round}: the loss did not fire");
        let fences = guard.fences();
        assert_eq!(fences.len(), 2);
        for k in [&a, &b] {
            assert!(server.exists(&name(k)), "round {round}: {k} not held");
            assert!(
                rival
                    .lock(k.as_str())
                    .try_acquire()
                    .await
                    .unwrap()
                    .is_none(),
                "round {round}: {k} was free"
            );
        }
        // The first key's release runs, and its reply is lost.
        proxy.lose_reply_to(&call_on(&a));
        guard
            .release()
            .await
            .unwrap_or_else(|e| panic!("round {round}: release: {e}"));
        assert!(
            !server.exists(&name(&a)) && !server.exists(&name(&b)),
            "round {round}: a key was left behind"
        );
    }
}
