//! Redlock reentry through `#[distributed_lock]` (its own binary: the
//! attribute uses the global client). A reentry must find the outer hold on
//! a majority, like any acquire.

use std::time::Duration;

use lock_runtime::{distributed_lock, LockClient, LockError};
use tests::{unique, RedisServer};

fn hash(key: &str) -> String {
    format!("lock:{{{key}}}")
}

fn count_on(node: &RedisServer, key: &str) -> Vec<i64> {
    node.cmd(&["HVALS", &hash(key)])
}

#[distributed_lock(key = "{key}", lease = "5s")]
async fn inner(key: &str) -> Result<Option<u64>, LockError> {
    Ok(lock_runtime::current_fence())
}

#[distributed_lock(key = "{key}", lease = "5s")]
async fn outer(key: &str, nodes: &[RedisServer]) -> Result<(), LockError> {
    let fence = lock_runtime::current_fence();
    // Two of five stopped: the reentry still has a majority.
    nodes[3].pause();
    nodes[4].pause();
    let again = inner(key).await;
    nodes[3].resume();
    nodes[4].resume();
    assert_eq!(again.expect("reentry with a majority up"), fence);
    for n in nodes {
        assert_eq!(
            count_on(n, key),
            vec![1],
            "reentry not undone on every node"
        );
    }

    // Three of five stopped: no majority, the reentry fails and is undone
    // where it was granted; the outer hold is untouched.
    for n in &nodes[2..] {
        n.pause();
    }
    let err = inner(key).await.unwrap_err();
    for n in &nodes[2..] {
        n.resume();
    }
    assert!(
        matches!(err, LockError::Lost { .. } | LockError::Backend(_)),
        "{err:?}"
    );
    // Stopped nodes run the queued reentry and its undo once resumed.
    let undone = tests::eventually(Duration::from_secs(2), || {
        nodes.iter().all(|n| count_on(n, key) == vec![1])
    })
    .await;
    assert!(undone, "failed reentry left a count");
    assert_eq!(lock_runtime::current_fence(), fence);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reentry_needs_a_majority_and_is_undone_when_it_fails() {
    let nodes: Vec<RedisServer> = (0..5).map(|_| RedisServer::start()).collect();
    let client = LockClient::builder()
        .op_timeout(Duration::from_millis(150))
        .redlock(nodes.iter().map(RedisServer::url))
        .await
        .unwrap();
    lock_runtime::init(client).unwrap();
    let key = unique("reentry");
    outer(&key, &nodes)
        .await
        .expect("outer hold kept to the end");
    for n in &nodes {
        assert!(!n.exists(&hash(&key)), "lock left after the outer release");
    }
}
