//! Redlock reentry through `#[distributed_lock]` (its own binary: the
//! attribute uses the global client). A reentry is counted in the process:
//! it needs no node, and nothing it does (or fails to do) can touch the
//! outer hold or change its token.

use std::time::Duration;

use lock_runtime::{distributed_lock, LockClient, LockError};
use tests::{unique, RedisServer};

fn name(key: &str) -> String {
    format!("lock:{{{key}}}")
}

fn owner_on(node: &RedisServer, key: &str) -> Option<String> {
    node.owner_of(&name(key))
}

#[distributed_lock(key = "{key}", lease = "5s")]
async fn inner(key: &str) -> Result<Option<u64>, LockError> {
    Ok(lock_runtime::current_fence())
}

#[distributed_lock(key = "{key}", lease = "5s")]
async fn outer(key: &str, nodes: &[RedisServer]) -> Result<(), LockError> {
    let fence = lock_runtime::current_fence();
    let owners: Vec<Option<String>> = nodes.iter().map(|n| owner_on(n, key)).collect();
    assert!(
        owners.iter().all(|o| o.is_some() && *o == owners[0]),
        "{owners:?}"
    );

    // Three of five stopped: no majority could grant or undo anything, and
    // none is needed. The reentry has exactly the outer token.
    for n in &nodes[2..] {
        n.pause();
    }
    let again = inner(key).await;
    for n in &nodes[2..] {
        n.resume();
    }
    assert_eq!(again.expect("reentry needs no node"), fence);
    // The outer hold is untouched on every node.
    for n in nodes {
        assert_eq!(owner_on(n, key), owners[0], "the outer hold was touched");
    }
    assert_eq!(lock_runtime::current_fence(), fence);
    tokio::time::sleep(Duration::from_millis(50)).await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reentry_needs_no_node_and_keeps_the_outer_hold_and_token() {
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
        assert!(!n.exists(&name(&key)), "lock left after the outer release");
    }
}
