//! The in-memory backend keeps the same semantics as Redis.

use std::time::Duration;

use lock_runtime::LockClient;
use tests::{global, semantics};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mutual_exclusion_many_tasks() {
    global::memory().await;
    semantics::mutual_exclusion(32, 20).await;
}

#[tokio::test]
async fn try_once_fails_fast() {
    global::memory().await;
    semantics::try_once_fails_fast().await;
}

#[tokio::test]
async fn waiter_is_woken_by_release() {
    let client = LockClient::builder()
        .retry_delay(Duration::from_secs(600))
        .memory()
        .unwrap();
    semantics::waiter_woken_by_release(&client).await;
}

#[tokio::test]
async fn reentrancy() {
    global::memory().await;
    semantics::reentrancy().await;
}

#[tokio::test]
async fn release_on_every_exit() {
    global::memory().await;
    semantics::release_on_every_exit().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watchdog_keeps_a_one_second_lease_alive() {
    global::memory().await;
    semantics::watchdog_keeps_lease().await;
}

#[tokio::test]
async fn fences_increase() {
    global::memory().await;
    semantics::fences_increase(&[lock_runtime::client().unwrap()]).await;
}

#[tokio::test]
async fn empty_key_is_invalid() {
    global::memory().await;
    semantics::empty_key_rejected().await;
}
