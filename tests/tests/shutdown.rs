//! `LockClient::close`, against a real Redis: a service that stops hands
//! its locks on within a round trip, not a lease; bodies get their grace;
//! a body still running after it is told its lock is lost.

use std::time::{Duration, Instant};

use lock_runtime::{LockClient, LockError, OnLost};
use tests::proxy::{Mode, Proxy};
use tests::{eventually, unique, RedisServer};

/// Long enough that a waiter served by expiry rather than by the close
/// cannot pass for one served by the close.
const LEASE: Duration = Duration::from_secs(30);

/// A Redis, the service's client (leases of [`LEASE`]) and another
/// client of the same Redis.
async fn service_and_other() -> (RedisServer, LockClient, LockClient) {
    let server = RedisServer::start();
    let service = LockClient::builder()
        .lease(LEASE)
        .connect(&server.url())
        .await
        .unwrap();
    let other = LockClient::connect(&server.url()).await.unwrap();
    (server, service, other)
}

/// A service holding 100 locks closes; another client waits on every key.
/// Each waiter gets its key within a few round trips of the close (well
/// under a second; 5 s allowed on a loaded machine), not after the 30 s
/// lease; the closed client then refuses new locks and renews nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closing_hands_100_locks_to_their_waiters_at_once() {
    tests::init_tracing();
    let (_server, service, other) = service_and_other().await;
    let keys: Vec<String> = (0..100).map(|_| unique("closing")).collect();
    let mut held = Vec::new();
    for k in &keys {
        held.push(service.lock(k).await.unwrap());
    }
    let mut waiters = Vec::new();
    for k in &keys {
        let (other, k) = (other.clone(), k.clone());
        waiters.push(tokio::spawn(async move {
            let guard = other.lock(&k).wait(Duration::from_secs(60)).await?;
            let at = Instant::now();
            guard.release().await?;
            Ok::<_, LockError>(at)
        }));
    }
    assert!(
        eventually(Duration::from_secs(20), || keys
            .iter()
            .all(|k| other.waiting_here(k) == 1))
        .await,
        "every waiter queued"
    );
    let closing = Instant::now();
    service.close(Duration::ZERO).await;
    let closed_in = closing.elapsed();
    let mut slowest = Duration::ZERO;
    for w in waiters {
        let at = tokio::time::timeout(Duration::from_secs(40), w)
            .await
            .expect("a waiter got its lock")
            .unwrap()
            .unwrap();
        slowest = slowest.max(at.saturating_duration_since(closing));
    }
    println!("close took {closed_in:?}; the slowest waiter had its lock {slowest:?} after the close began");
    assert!(
        slowest < Duration::from_secs(5),
        "waiters were served {slowest:?} after the close (lease {LEASE:?})"
    );
    for g in held {
        assert!(matches!(g.release().await, Err(LockError::Lost { .. })));
    }
    assert_eq!(service.held_count(), 0, "nothing is renewed after a close");
    assert!(service.is_closed());
    assert!(matches!(
        service.lock(&keys[0]).await,
        Err(LockError::Closed)
    ));
    // A clone shares the closed state.
    assert!(matches!(
        service.clone().lock(unique("after")).await,
        Err(LockError::Closed)
    ));
}

/// A body that ends within the grace period releases as usual and returns
/// its value; meanwhile new requests, and one already waiting, end with
/// `Closed`; the close returns once the body is done, not at the end of
/// its grace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_ends_within_its_grace_releases_normally() {
    tests::init_tracing();
    let server = RedisServer::start();
    let service = LockClient::builder()
        .lease(LEASE)
        .connect(&server.url())
        .await
        .unwrap();
    let key = unique("grace");
    let (started_tx, started) = tokio::sync::oneshot::channel();
    let (finish_tx, finish) = tokio::sync::oneshot::channel::<()>();
    let body = tokio::spawn({
        let (service, key) = (service.clone(), key.clone());
        async move {
            service
                .lock(&key)
                .run(async move {
                    started_tx.send(()).unwrap();
                    finish.await.unwrap();
                    // Re-entering its own hold still works while closing.
                    let again = service.lock(&key).await.map(|g| g.fence());
                    (lock_runtime::current_fence(), again)
                })
                .await
        }
    });
    started.await.unwrap();
    let waiting = tokio::spawn({
        let (service, key) = (service.clone(), key.clone());
        async move { service.lock(&key).wait(Duration::from_secs(60)).await }
    });
    assert!(eventually(Duration::from_secs(10), || service.waiting_here(&key) == 1).await);
    let closing = tokio::spawn({
        let service = service.clone();
        async move {
            let t = Instant::now();
            service.close(Duration::from_secs(60)).await;
            t.elapsed()
        }
    });
    let refused = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the waiter ended")
        .unwrap();
    assert!(
        matches!(refused, Err(LockError::Closed)),
        "a request waiting when the client closed: {refused:?}"
    );
    assert!(matches!(
        service.lock(unique("new")).await,
        Err(LockError::Closed)
    ));
    assert!(!closing.is_finished(), "the close waits for the body");
    finish_tx.send(()).unwrap();
    let (fence, again) = body.await.unwrap().expect("the body kept its lock");
    assert_eq!(again.unwrap(), fence.unwrap(), "re-entered its own hold");
    let took = closing.await.unwrap();
    assert!(took < Duration::from_secs(30), "close took {took:?}");
    assert!(!server.exists(&format!("lock:{{{key}}}")), "released");
}

/// A body still running when the grace ends has lost its lock: under
/// `on_lost = "abort"` it is stopped with `Lost`, under `"continue"` it
/// runs to its end; either way another client takes the key at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_still_running_after_its_grace_is_told_its_lock_is_lost() {
    tests::init_tracing();
    let (_server, service, other) = service_and_other().await;
    let (aborted, continued) = (unique("abort"), unique("continue"));
    let (go_on_tx, go_on) = tokio::sync::oneshot::channel::<()>();
    let abort = tokio::spawn({
        let (service, key) = (service.clone(), aborted.clone());
        async move {
            service
                .lock(&key)
                .run(tokio::time::sleep(Duration::from_secs(600)))
                .await
        }
    });
    let cont = tokio::spawn({
        let (service, key) = (service.clone(), continued.clone());
        async move {
            service
                .lock(&key)
                .on_lost(OnLost::Continue)
                .run(async move {
                    go_on.await.unwrap();
                    "finished"
                })
                .await
        }
    });
    assert!(eventually(Duration::from_secs(10), || service.held_count() == 2).await);
    let closing = Instant::now();
    service.close(Duration::from_millis(300)).await;
    let stopped = tokio::time::timeout(Duration::from_secs(10), abort)
        .await
        .expect("the aborted body was stopped")
        .unwrap();
    assert!(
        matches!(stopped, Err(LockError::Lost { .. })),
        "{stopped:?}"
    );
    // Both keys are free for others while the `continue` body still runs.
    for k in [&aborted, &continued] {
        let g = other.lock(k).wait(Duration::from_secs(20)).await.unwrap();
        g.release().await.unwrap();
    }
    assert!(
        closing.elapsed() < Duration::from_secs(10),
        "taken over {:?} after the close began",
        closing.elapsed()
    );
    assert!(!cont.is_finished());
    go_on_tx.send(()).unwrap();
    assert_eq!(cont.await.unwrap().unwrap(), "finished");
}

/// A service's client of a Redis reached through a fault proxy.
async fn service_behind_proxy() -> (RedisServer, Proxy, LockClient) {
    let server = RedisServer::start();
    let proxy = Proxy::for_server(&server);
    let service = LockClient::builder()
        .lease(LEASE)
        .connect(&proxy.url())
        .await
        .unwrap();
    (server, proxy, service)
}

/// A body has just ended: its guard's release is on its way to Redis
/// (300 ms away here). `close(60s)` returns only once that release has
/// landed: the key is gone the moment it returns. Before, the hold left
/// the watchdog before the release was sent, and the close, which waited
/// for the watchdog and background work only, returned at once: the
/// process would exit and the lock sit out its lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_returns_only_once_a_finishing_bodys_release_has_landed() {
    tests::init_tracing();
    let (server, proxy, service) = service_behind_proxy().await;
    let key = unique("finishing");
    let guard = service.lock(&key).await.unwrap();
    proxy.set(Mode::Delay(Duration::from_millis(300)));
    let releasing = tokio::spawn(guard.release());
    // The hold has left the watchdog: its release is on the wire.
    assert!(eventually(Duration::from_secs(10), || service.held_count() == 0).await);
    service.close(Duration::from_secs(60)).await;
    assert!(
        !server.exists(&format!("lock:{{{key}}}")),
        "close returned before the body's release reached Redis"
    );
    releasing.await.unwrap().expect("held to the end");
}

/// The close runs once: after a close that was cancelled (a shutdown hook
/// with a short timeout), the next call returns only once the releases the
/// first one started have landed; a call after that returns at once. Before,
/// the cancelled close dropped its releases unsent or half way, and the
/// second call found nothing to wait for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_close_waits_for_the_releases_of_a_cancelled_first_one() {
    tests::init_tracing();
    let (server, proxy, service) = service_behind_proxy().await;
    let keys = [unique("closing-twice"), unique("closing-twice")];
    let mut held = Vec::new();
    for k in &keys {
        held.push(service.lock(k).await.unwrap());
    }
    proxy.set(Mode::Delay(Duration::from_millis(300)));
    let cancelled =
        tokio::time::timeout(Duration::from_millis(50), service.close(Duration::ZERO)).await;
    assert!(cancelled.is_err(), "the first close waited for nothing");
    // Another task closes meanwhile, and this one again.
    let other = tokio::spawn({
        let service = service.clone();
        async move { service.close(Duration::ZERO).await }
    });
    service.close(Duration::ZERO).await;
    for k in &keys {
        assert!(
            !server.exists(&format!("lock:{{{k}}}")),
            "close returned before the first close's releases landed"
        );
    }
    tokio::time::timeout(Duration::from_secs(10), other)
        .await
        .expect("the concurrent close returned")
        .unwrap();
    for g in held {
        assert!(matches!(g.release().await, Err(LockError::Lost { .. })));
    }
}
