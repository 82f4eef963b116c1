//! The in-memory backend keeps the same semantics as Redis.

use std::time::Duration;

use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use lock_runtime::LockClient;
use tests::semaphores::{self, Deployment};
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

/// The shared semaphore checks, on one in-memory client (its clones share
/// its id, and `Deployment::until_waiters` counts each client's waiters).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn semaphores() {
    let client = LockClient::memory();
    let probe = client.clone();
    let d = Deployment {
        name: "memory",
        clients: vec![client],
        left: Box::new(move |key| {
            let held = at_once(probe.inspect(key)).expect("inspect in memory");
            held.map(|info| vec![info.key]).unwrap_or_default()
        }),
    };
    semaphores::all(&d).await;
}

/// The output of a future that does not wait (the in-memory backend's
/// `inspect` takes a mutex and returns): the checks read what is kept from
/// a plain closure.
fn at_once<T>(fut: impl Future<Output = T>) -> T {
    match pin!(fut).poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(out) => out,
        Poll::Pending => panic!("the in-memory backend's inspect waited"),
    }
}
