//! Lock semantics every backend must have. Each check runs against the
//! global client, which each test binary points at a real `redis-server`
//! or at the in-memory backend.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lock_runtime::{distributed_lock, LockClient, LockError};

/// An application error, as users write them.
#[derive(Debug)]
pub enum AppError {
    Lock(LockError),
    Failed(&'static str),
}

impl From<LockError> for AppError {
    fn from(e: LockError) -> Self {
        AppError::Lock(e)
    }
}

fn global() -> LockClient {
    lock_runtime::client().expect("test binary must init the global client")
}

/// A counter whose increments race unless serialised: read, yield, write.
#[derive(Default)]
pub struct SlowCounter {
    value: AtomicU64,
    inside: AtomicU64,
    overlaps: AtomicU64,
}

#[distributed_lock(key = "bump:{key}", wait = "30s")]
async fn bump(key: &str, counter: &SlowCounter) -> Result<(), AppError> {
    if counter.inside.fetch_add(1, Ordering::SeqCst) != 0 {
        counter.overlaps.fetch_add(1, Ordering::SeqCst);
    }
    let v = counter.value.load(Ordering::SeqCst);
    tokio::task::yield_now().await;
    counter.value.store(v + 1, Ordering::SeqCst);
    counter.inside.fetch_sub(1, Ordering::SeqCst);
    Ok(())
}

/// Many tasks, one key: every increment survives, no body overlaps.
pub async fn mutual_exclusion(tasks: usize, rounds: usize) {
    let key: Arc<str> = crate::unique("mx").into();
    let counter = Arc::new(SlowCounter::default());
    let handles: Vec<_> = (0..tasks)
        .map(|_| {
            let (key, counter) = (key.clone(), counter.clone());
            tokio::spawn(async move {
                for _ in 0..rounds {
                    bump(&key, &counter).await.expect("bump");
                }
            })
        })
        .collect();
    for h in handles {
        h.await.unwrap();
    }
    assert_eq!(
        counter.overlaps.load(Ordering::SeqCst),
        0,
        "two bodies ran at once"
    );
    assert_eq!(
        counter.value.load(Ordering::SeqCst),
        (tasks * rounds) as u64
    );
}

/// `wait = 0` on a held lock fails at once with `Timeout`.
pub async fn try_once_fails_fast() {
    let client = global();
    let key = crate::unique("fast");
    let held = client.lock(&key).await.expect("first lock");
    let started = Instant::now();
    let err = client.lock(&key).wait(Duration::ZERO).await.unwrap_err();
    assert!(matches!(err, LockError::Timeout { .. }), "{err:?}");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "try-once took {:?}",
        started.elapsed()
    );
    held.release().await.unwrap();
    client
        .lock(&key)
        .await
        .expect("free after release")
        .release()
        .await
        .unwrap();
}

/// A waiter gets the lock when the holder releases, and the wake-up is the
/// release message: the client's fallback retry is set far beyond the wait
/// and the holder's TTL is 30 s, so only a wake-up can let it in.
pub async fn waiter_woken_by_release(client: &LockClient) {
    let key = crate::unique("wake");
    let held = client
        .lock(&key)
        .lease(Duration::from_secs(30))
        .await
        .unwrap();
    let c2 = client.clone();
    let k2 = key.clone();
    let waiter = tokio::spawn(async move { c2.lock(&k2).wait(Duration::from_secs(10)).await });
    // Release only once the waiter is known to be waiting for the message.
    assert!(
        crate::eventually(Duration::from_secs(5), || client.waiting_here(&key) == 1).await,
        "the waiter never started waiting"
    );
    let released_at = Instant::now();
    held.release().await.unwrap();
    let guard = waiter
        .await
        .unwrap()
        .expect("waiter should get the lock after release");
    let handoff = released_at.elapsed();
    assert!(
        handoff < Duration::from_secs(5),
        "hand-off took {handoff:?}: the waiter was not woken"
    );
    guard.release().await.unwrap();
}

#[distributed_lock(key = "re:{key}")]
async fn outer(key: &str, seen: &AtomicU64) -> Result<u64, AppError> {
    let fence = lock_runtime::current_fence().expect("fence inside body");
    // Same key, same task: re-enters instead of deadlocking.
    let inner_fence = inner(key, seen).await?;
    assert_eq!(inner_fence, fence, "a reentry keeps the outer fence");
    // A manual lock on the held key re-enters too.
    let g = global().lock(format!("re:{key}")).await?;
    assert_eq!(g.fence(), fence);
    g.release().await?;
    // A spawned task is another holder and must contend.
    let k = format!("re:{key}");
    let other =
        tokio::spawn(async move { global().lock(k).wait(Duration::ZERO).await.map(|_| ()) });
    match other.await.unwrap() {
        Err(LockError::Timeout { .. }) => {}
        r => {
            return Err(AppError::Failed(if r.is_ok() {
                "spawned task got a held lock"
            } else {
                "spawned task: wrong error"
            }))
        }
    }
    Ok(fence)
}

#[distributed_lock(key = "re:{key}", wait = "0s")]
async fn inner(key: &str, seen: &AtomicU64) -> Result<u64, AppError> {
    seen.fetch_add(1, Ordering::SeqCst);
    Ok(lock_runtime::current_fence().unwrap())
}

/// Nested annotated calls re-enter; the lock is free after the outermost.
pub async fn reentrancy() -> String {
    let key = crate::unique("re");
    let seen = AtomicU64::new(0);
    outer(&key, &seen).await.expect("reentrant call chain");
    assert_eq!(seen.load(Ordering::SeqCst), 1);
    // Free now: a fresh holder gets it at once.
    let g = global()
        .lock(format!("re:{key}"))
        .await
        .expect("free after outermost returned");
    g.release().await.unwrap();
    format!("re:{key}")
}

#[distributed_lock(key = "exit:{key}")]
async fn fails_with_question_mark(key: &str) -> Result<(), AppError> {
    Err(AppError::Failed("early"))?;
    Ok(())
}

#[distributed_lock(key = "exit:{key}")]
async fn panics(key: &str) -> Result<(), AppError> {
    panic!("body panicked on {key}");
}

#[distributed_lock(key = "exit:{key}")]
async fn hangs(key: &str, entered: tokio::sync::oneshot::Sender<()>) -> Result<(), AppError> {
    let _ = entered.send(());
    std::future::pending::<()>().await;
    Ok(())
}

/// The lock is free again soon after `?`, a panic, and cancellation.
/// Returns the lock names used, for backend-specific checks.
pub async fn release_on_every_exit() -> Vec<String> {
    let client = global();
    let mut used = Vec::new();

    let key = crate::unique("q");
    assert!(matches!(
        fails_with_question_mark(&key).await,
        Err(AppError::Failed("early"))
    ));
    // Normal exits await the release: free immediately.
    client
        .lock(format!("exit:{key}"))
        .await
        .expect("free after ?")
        .release()
        .await
        .unwrap();
    used.push(format!("exit:{key}"));

    let key = crate::unique("panic");
    let k = key.clone();
    let res = tokio::spawn(async move { panics(&k).await }).await;
    assert!(res.unwrap_err().is_panic(), "the panic propagates");
    // Panic paths release in the background; the waiter is woken by it.
    client
        .lock(format!("exit:{key}"))
        .wait(Duration::from_secs(5))
        .await
        .expect("free after panic")
        .release()
        .await
        .unwrap();
    used.push(format!("exit:{key}"));

    let key = crate::unique("cancel");
    let (tx, rx) = tokio::sync::oneshot::channel();
    let k = key.clone();
    let task = tokio::spawn(async move { hangs(&k, tx).await });
    rx.await.expect("body entered");
    task.abort();
    assert!(task.await.unwrap_err().is_cancelled());
    client
        .lock(format!("exit:{key}"))
        .wait(Duration::from_secs(5))
        .await
        .expect("free after cancellation")
        .release()
        .await
        .unwrap();
    used.push(format!("exit:{key}"));
    used
}

#[distributed_lock(key = "{key}", lease = "1s")]
async fn long_body(key: &str, done: &AtomicBool) -> Result<(), AppError> {
    // Three leases long: only renewals keep the lock.
    tokio::time::sleep(Duration::from_millis(3500)).await;
    done.store(true, Ordering::SeqCst);
    Ok(())
}

/// The watchdog keeps a 1 s lease alive through a 3.5 s body.
pub async fn watchdog_keeps_lease() {
    let key = crate::unique("wd");
    let done = Arc::new(AtomicBool::new(false));
    let (k, d) = (key.clone(), done.clone());
    let body = tokio::spawn(async move { long_body(&k, &d).await });
    // Probe while the body runs, well past the first lease.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let probe = global().lock(&key).wait(Duration::ZERO).await;
    assert!(
        matches!(probe, Err(LockError::Timeout { .. })),
        "lock was free 2.5 s into a 1 s lease: the watchdog did not renew ({probe:?})"
    );
    body.await.unwrap().expect("body finished holding its lock");
    assert!(done.load(Ordering::SeqCst));
    global()
        .lock(&key)
        .await
        .expect("free after the body")
        .release()
        .await
        .unwrap();
}

/// Fencing tokens strictly increase across holders and clients of one key.
pub async fn fences_increase(clients: &[LockClient]) {
    let key = crate::unique("fence");
    let mut last = 0;
    for round in 0..20 {
        let c = &clients[round % clients.len()];
        let g = c.lock(&key).await.unwrap();
        assert!(g.fence() > last, "fence {} after {last}", g.fence());
        last = g.fence();
        g.release().await.unwrap();
    }
}

/// An empty key is a typed error, not a panic or a lock on "".
pub async fn empty_key_rejected() {
    let err = global().lock("").await.unwrap_err();
    assert!(matches!(err, LockError::InvalidKey { .. }), "{err:?}");
}
