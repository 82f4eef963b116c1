//! Semaphore semantics every deployment must have (`docs/SEMAPHORES.md`):
//! each check takes a [`Deployment`] with several clients of it and a way
//! to read what Redis keeps of a key.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lock_runtime::{LockClient, LockError, LockMode};

/// The Redis names kept for a user key, on every node.
pub type Left = Box<dyn Fn(&str) -> Vec<String> + Send + Sync>;

/// A deployment under test.
pub struct Deployment {
    pub name: &'static str,
    /// Clients of the deployment, each its own holder id space.
    pub clients: Vec<LockClient>,
    /// The Redis names kept for a user key (`lock:{key}*`), on every node.
    pub left: Left,
}

impl Deployment {
    fn client(&self, i: usize) -> &LockClient {
        &self.clients[i % self.clients.len()]
    }

    /// Wait until `n` waiters queue for `key` and listen for their grant
    /// (panics after 10 s).
    pub async fn until_waiters(&self, key: &str, n: usize) {
        let c = self.client(0);
        let reached = async {
            loop {
                let waiting = c.inspect(key).await.unwrap().map_or(0, |i| i.waiters);
                let listening: usize = self.clients.iter().map(|c| c.waiting_here(key)).sum();
                if waiting == n && listening == n {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        };
        tokio::time::timeout(Duration::from_secs(10), reached)
            .await
            .unwrap_or_else(|_| panic!("{}: `{key}` never had {n} waiters", self.name));
    }

    /// Nothing of `key` stays in Redis (queue and waiters included).
    pub async fn assert_nothing_left(&self, key: &str) {
        let gone = crate::eventually(Duration::from_secs(5), || (self.left)(key).is_empty()).await;
        assert!(
            gone,
            "{}: left in Redis for `{key}`: {:?}",
            self.name,
            (self.left)(key)
        );
    }
}

/// How many bodies are inside at once, and the most ever seen.
#[derive(Default)]
struct Inside {
    now: AtomicUsize,
    most: AtomicUsize,
}

impl Inside {
    fn enter(&self) -> usize {
        let n = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(n, Ordering::SeqCst);
        n
    }

    fn leave(&self) {
        self.now.fetch_sub(1, Ordering::SeqCst);
    }
}

/// 12 tasks over every client take 3 permits of one key in turns: never
/// more than 3 bodies inside, 3 reached, tokens all different and rising
/// for each task; nothing left after.
pub async fn at_most_n_at_once(d: &Deployment) {
    const N: u32 = 3;
    const TASKS: usize = 12;
    const ROUNDS: usize = 8;
    let key = crate::unique("sem-n");
    let inside = Arc::new(Inside::default());
    let tokens = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for t in 0..TASKS {
        let (c, key, inside, tokens) = (
            d.client(t).clone(),
            key.clone(),
            inside.clone(),
            tokens.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut last = 0;
            for _ in 0..ROUNDS {
                let g = c.semaphore(&key, N).wait(Duration::from_secs(60)).await?;
                let n = inside.enter();
                assert!(n <= N as usize, "{n} bodies inside a semaphore of {N}");
                assert!(g.fence() > last, "a task's tokens must rise");
                last = g.fence();
                tokens.lock().unwrap().push(g.fence());
                tokio::time::sleep(Duration::from_millis(3)).await;
                inside.leave();
                g.release().await?;
            }
            Ok::<(), LockError>(())
        }));
    }
    for t in tasks {
        t.await
            .unwrap()
            .unwrap_or_else(|e| panic!("{}: {e}", d.name));
    }
    let most = inside.most.load(Ordering::SeqCst);
    println!("{}: at most {most} of {N} permits held at once", d.name);
    assert_eq!(
        most, N as usize,
        "{}: the permits were never all in use",
        d.name
    );
    let mut all = tokens.lock().unwrap().clone();
    let n = all.len();
    all.sort_unstable();
    all.dedup();
    assert_eq!(all.len(), n, "{}: a token was handed out twice", d.name);
    assert_eq!(n, TASKS * ROUNDS);
    d.assert_nothing_left(&key).await;
}

/// Permits taken one after another get rising tokens, above a lock's of
/// another key in the same slot counter too; `fence(false)` gives 0.
pub async fn tokens_rise(d: &Deployment) {
    let key = crate::unique("sem-tokens");
    let mut last = 0;
    for i in 0..6 {
        let g = d.client(i).semaphore(&key, 2).await.unwrap();
        assert!(g.fence() > last, "{}: tokens must rise", d.name);
        last = g.fence();
        g.release().await.unwrap();
    }
    let g = d.client(0).semaphore(&key, 2).fence(false).await.unwrap();
    assert_eq!(g.fence(), 0);
    g.release().await.unwrap();
    let none = d.client(0).semaphore(&key, 0).await;
    assert!(matches!(none, Err(LockError::Config(_))), "{none:?}");
    d.assert_nothing_left(&key).await;
}

/// Waiters are handed permits in the order they queued: each returned
/// permit goes to the next of them.
pub async fn waiters_are_served_in_order(d: &Deployment) {
    let key = crate::unique("sem-fifo");
    let mut held = std::collections::VecDeque::new();
    held.push_back(d.client(0).semaphore(&key, 2).await.unwrap());
    held.push_back(d.client(1).semaphore(&key, 2).await.unwrap());
    let (tx, mut served) = tokio::sync::mpsc::unbounded_channel();
    for i in 0..4 {
        let (c, k, tx) = (d.client(i).clone(), key.clone(), tx.clone());
        tokio::spawn(async move {
            let g = c.semaphore(&k, 2).wait(Duration::from_secs(30)).await;
            let _ = tx.send((i, g));
        });
        // Queued before the next one asks.
        d.until_waiters(&key, i + 1).await;
    }
    for want in 0..4 {
        held.pop_front().unwrap().release().await.unwrap();
        let (i, g) = tokio::time::timeout(Duration::from_secs(10), served.recv())
            .await
            .unwrap_or_else(|_| panic!("{}: waiter {want} was not served", d.name))
            .unwrap();
        assert_eq!(i, want, "{}: not first come first served", d.name);
        held.push_back(g.unwrap());
    }
    for g in held {
        g.release().await.unwrap();
    }
    d.assert_nothing_left(&key).await;
}

/// A waiter whose request is dropped leaves the queue at once; a waiter
/// that times out too; nothing stays.
pub async fn a_cancelled_waiter_leaves_nothing(d: &Deployment) {
    let key = crate::unique("sem-cancel");
    let held = d.client(0).semaphore(&key, 1).await.unwrap();
    let waiter = {
        let (c, key) = (d.client(1).clone(), key.clone());
        tokio::spawn(async move { c.semaphore(&key, 1).wait(Duration::from_secs(60)).await })
    };
    d.until_waiters(&key, 1).await;
    waiter.abort();
    let _ = waiter.await;
    d.until_waiters(&key, 0).await;
    let timed_out = d
        .client(1)
        .semaphore(&key, 1)
        .wait(Duration::from_millis(200))
        .await;
    assert!(
        matches!(timed_out, Err(LockError::Timeout { .. })),
        "{timed_out:?}"
    );
    held.release().await.unwrap();
    d.assert_nothing_left(&key).await;
}

/// Two versions of a service, one with 2 permits and one with 3, on one
/// key: a request of N is admitted only while fewer than N hold, so never
/// more than 3 at once, and a request of 2 waits where one of 3 gets in.
pub async fn disagreeing_services_keep_their_own_limits(d: &Deployment) {
    let key = crate::unique("sem-versions");
    let inside = Arc::new(Inside::default());
    let mut tasks = Vec::new();
    for t in 0..10usize {
        let n: u32 = if t % 2 == 0 { 2 } else { 3 };
        let (c, key, inside) = (d.client(t).clone(), key.clone(), inside.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..6 {
                let g = c.semaphore(&key, n).wait(Duration::from_secs(60)).await?;
                let now = inside.enter();
                assert!(
                    now <= 3,
                    "{now} inside, where no request admits more than 3"
                );
                tokio::time::sleep(Duration::from_millis(2)).await;
                inside.leave();
                g.release().await?;
            }
            Ok::<(), LockError>(())
        }));
    }
    for t in tasks {
        t.await
            .unwrap()
            .unwrap_or_else(|e| panic!("{}: {e}", d.name));
    }
    assert!(inside.most.load(Ordering::SeqCst) <= 3);
    // Two held: a request of 2 is busy, one of 3 gets in, and then no one.
    let held = [
        d.client(0).semaphore(&key, 3).await.unwrap(),
        d.client(1).semaphore(&key, 2).await.unwrap(),
    ];
    let two = d.client(2).semaphore(&key, 2).wait(Duration::ZERO).await;
    assert!(
        matches!(two, Err(LockError::Timeout { .. })),
        "{}: {two:?}",
        d.name
    );
    let three = d
        .client(2)
        .semaphore(&key, 3)
        .wait(Duration::ZERO)
        .await
        .unwrap();
    for n in [3, 4] {
        let r = d.client(0).semaphore(&key, n).wait(Duration::ZERO).await;
        if n == 3 {
            assert!(
                matches!(r, Err(LockError::Timeout { .. })),
                "{}: {r:?}",
                d.name
            );
        } else {
            // A request of 4 is admitted beside 3 (its own limit).
            r.unwrap().release().await.unwrap();
        }
    }
    three.release().await.unwrap();
    for g in held {
        g.release().await.unwrap();
    }
    d.assert_nothing_left(&key).await;
}

/// Inside a body that holds a permit, a permit request of the same key
/// re-enters it (same token, no second permit), also when every permit is
/// in use; a lock request of that key is refused at once.
pub async fn reentry_with_all_permits_in_use(d: &Deployment) {
    let key = crate::unique("sem-reenter");
    let c = d.client(0).clone();
    let other = d.client(1).semaphore(&key, 2).await.unwrap();
    let body = {
        let (c, key) = (c.clone(), key.clone());
        async move {
            let inner = c
                .semaphore(&key, 2)
                .wait(Duration::ZERO)
                .await
                .expect("re-entry");
            let fence = inner.fence();
            let lock = c.lock(&key).wait(Duration::from_secs(10)).await;
            assert!(matches!(lock, Err(LockError::Config(_))), "{lock:?}");
            inner.release().await.unwrap();
            (fence, lock_runtime::current_fence())
        }
    };
    let (inner, current) = c
        .semaphore(&key, 2)
        .run(body)
        .await
        .unwrap_or_else(|e| panic!("{}: {e}", d.name));
    assert!(
        inner > 0 && current == Some(inner),
        "{}: {inner} {current:?}",
        d.name
    );
    // Still exactly two holders after the re-entry ended: the outer body
    // released its permit, `other` keeps its own.
    let info = c.inspect(&key).await.unwrap().unwrap();
    assert_eq!(info.holders, [other.holder()], "{}", d.name);
    other.release().await.unwrap();
    d.assert_nothing_left(&key).await;
}

/// `inspect` shows the semaphore with every holder; `force_release_if`
/// ends one holder's permit, `force_release` all of them; their holders
/// find out at the next renewal, and a waiter is served.
pub async fn operations(d: &Deployment) {
    let key = crate::unique("sem-ops");
    let c = d.client(0);
    let lease = Duration::from_millis(600);
    let a = c.semaphore(&key, 2).lease(lease).await.unwrap();
    let b = d.client(1).semaphore(&key, 2).lease(lease).await.unwrap();
    let info = c.inspect(&key).await.unwrap().expect("held");
    assert_eq!(info.mode, LockMode::Semaphore { permits: 2 });
    assert_eq!(info.mode.to_string(), "semaphore(2)");
    let mut holders = info.holders.clone();
    holders.sort();
    let mut want = vec![a.holder().to_owned(), b.holder().to_owned()];
    want.sort();
    assert_eq!(holders, want, "{}", d.name);
    assert_eq!(info.fence, Some(a.fence().max(b.fence())));
    assert!(info.ttl.is_some_and(|t| t <= lease));
    assert_eq!(info.waiters, 0);
    let listed = c.locks("sem-ops*").await.unwrap();
    assert!(listed.iter().any(|i| i.key == key), "{listed:?}");

    let waiter = {
        let (c, key) = (d.client(2).clone(), key.clone());
        tokio::spawn(async move {
            c.semaphore(&key, 2)
                .lease(lease)
                .wait(Duration::from_secs(30))
                .await
        })
    };
    d.until_waiters(&key, 1).await;
    assert!(!c.force_release_if(&key, "nobody:s2.1").await.unwrap());
    assert!(c.force_release_if(&key, a.holder()).await.unwrap());
    let w = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the waiter was not served after force_release_if")
        .unwrap()
        .unwrap();
    tokio::time::timeout(lease * 3, a.lost())
        .await
        .expect("the forced-out holder did not find out");
    assert!(c.force_release(&key).await.unwrap());
    tokio::time::timeout(lease * 3, b.lost())
        .await
        .expect("a forced-out holder did not find out");
    assert!(w.is_lost() || tokio::time::timeout(lease * 3, w.lost()).await.is_ok());
    assert_eq!(c.inspect(&key).await.unwrap(), None);
    assert!(!c.force_release(&key).await.unwrap());
    assert!(matches!(a.release().await, Err(LockError::Lost { .. })));
    let _ = b.release().await;
    let _ = w.release().await;
    d.assert_nothing_left(&key).await;
}

/// A lock and a semaphore of one key exclude each other: each finds the
/// other busy (and neither queues nor fails otherwise).
pub async fn locks_and_semaphores_exclude_each_other(d: &Deployment) {
    let key = crate::unique("sem-mixed");
    let s = d.client(0).semaphore(&key, 3).await.unwrap();
    for r in [
        d.client(1)
            .lock(&key)
            .wait(Duration::from_millis(100))
            .await,
        d.client(1)
            .read_lock(&key)
            .wait(Duration::from_millis(100))
            .await,
        // Unfenced: its first try is not the script, and finds the key busy
        // all the same, with and without time to wait.
        d.client(1)
            .lock(&key)
            .fence(false)
            .wait(Duration::from_millis(100))
            .await,
        d.client(1)
            .lock(&key)
            .fence(false)
            .wait(Duration::ZERO)
            .await,
    ] {
        assert!(
            matches!(r, Err(LockError::Timeout { .. })),
            "{}: {r:?}",
            d.name
        );
    }
    s.release().await.unwrap();
    for fence in [true, false] {
        let l = d.client(0).lock(&key).fence(fence).await.unwrap();
        let r = d
            .client(1)
            .semaphore(&key, 3)
            .wait(Duration::from_millis(100))
            .await;
        assert!(
            matches!(r, Err(LockError::Timeout { .. })),
            "{} (fence {fence}): {r:?}",
            d.name
        );
        assert_eq!(
            d.client(1).inspect(&key).await.unwrap().unwrap().mode,
            LockMode::Write
        );
        l.release().await.unwrap();
    }
    // An unfenced lock waiting on a semaphore's key gets it once the
    // permits go.
    let s = d.client(0).semaphore(&key, 3).await.unwrap();
    let lock = {
        let (c, key) = (d.client(1).clone(), key.clone());
        tokio::spawn(async move {
            c.lock(&key)
                .fence(false)
                .wait(Duration::from_secs(20))
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    s.release().await.unwrap();
    let l = tokio::time::timeout(Duration::from_secs(15), lock)
        .await
        .expect("the unfenced lock was not taken after the semaphore emptied")
        .unwrap()
        .unwrap();
    l.release().await.unwrap();
    // A lock waiting on a semaphore's key gets it once the permits go.
    let s = d.client(0).semaphore(&key, 3).await.unwrap();
    let lock = {
        let (c, key) = (d.client(1).clone(), key.clone());
        tokio::spawn(async move { c.lock(&key).wait(Duration::from_secs(20)).await })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    s.release().await.unwrap();
    let l = tokio::time::timeout(Duration::from_secs(15), lock)
        .await
        .expect("the lock was not taken after the semaphore emptied")
        .unwrap()
        .unwrap();
    l.release().await.unwrap();
    d.assert_nothing_left(&key).await;
}

/// A permit released early under `min_hold` stays counted until then.
pub async fn min_hold_keeps_the_permit_counted(d: &Deployment) {
    let key = crate::unique("sem-min-hold");
    let g = d
        .client(0)
        .semaphore(&key, 1)
        .min_hold(Duration::from_millis(700))
        .await
        .unwrap();
    g.release().await.unwrap();
    let r = d.client(1).semaphore(&key, 1).wait(Duration::ZERO).await;
    assert!(
        matches!(r, Err(LockError::Timeout { .. })),
        "{}: {r:?}",
        d.name
    );
    let g = d
        .client(1)
        .semaphore(&key, 1)
        .wait(Duration::from_secs(10))
        .await
        .unwrap();
    g.release().await.unwrap();
    d.assert_nothing_left(&key).await;
}

/// The watchdog keeps a permit with a short lease for as long as its body
/// runs (renewed in the watchdog's round beside a lock's), and stops at
/// `max_hold`: the permit lapses and the holder is told. (A lease of 1 s:
/// on PostgreSQL each renewal is a commit that waits for the WAL flush,
/// and 300 ms lapsed on a loaded machine.)
pub async fn renewals_keep_a_permit_until_max_hold(d: &Deployment) {
    let key = crate::unique("sem-renew");
    let lease = Duration::from_secs(1);
    let lock_key = crate::unique("sem-renew-lock");
    let lock = d.client(0).lock(&lock_key).lease(lease).await.unwrap();
    let g = d
        .client(0)
        .semaphore(&key, 1)
        .lease(lease)
        .max_hold(Duration::from_secs(4))
        .await
        .unwrap();
    tokio::time::sleep(lease * 3).await;
    assert!(!g.is_lost() && !lock.is_lost(), "{}: not renewed", d.name);
    let r = d.client(1).semaphore(&key, 1).wait(Duration::ZERO).await;
    assert!(
        matches!(r, Err(LockError::Timeout { .. })),
        "{}: {r:?}",
        d.name
    );
    tokio::time::timeout(Duration::from_secs(5), g.lost())
        .await
        .unwrap_or_else(|_| panic!("{}: max_hold did not end the permit", d.name));
    let next = d
        .client(1)
        .semaphore(&key, 1)
        .wait(Duration::from_secs(5))
        .await
        .unwrap();
    next.release().await.unwrap();
    assert!(matches!(
        g.release().await,
        Err(LockError::MaxHoldReached { .. } | LockError::Lost { .. })
    ));
    lock.release().await.unwrap();
    d.assert_nothing_left(&key).await;
}

/// Requests dropped at every stage (before the send, queued, granted but
/// not yet handed back) leave no permit and no queue entry behind, and
/// never let more than N bodies in.
pub async fn cancelled_requests_leave_nothing(d: &Deployment) {
    const N: u32 = 2;
    let key = crate::unique("sem-cancel-fuzz");
    let inside = Arc::new(Inside::default());
    let mut tasks = Vec::new();
    for t in 0..8usize {
        let (c, key, inside) = (d.client(t).clone(), key.clone(), inside.clone());
        tasks.push(tokio::spawn(async move {
            for i in 0..25u64 {
                let give_up = Duration::from_micros(fastrand::u64(0..3000));
                let request = c.semaphore(&key, N).wait(Duration::from_secs(30));
                match tokio::time::timeout(give_up, request).await {
                    Ok(Ok(g)) => {
                        let n = inside.enter();
                        assert!(n <= N as usize, "{n} inside a semaphore of {N}");
                        tokio::time::sleep(Duration::from_micros(300 * (i % 4))).await;
                        inside.leave();
                        if i % 3 == 0 {
                            drop(g); // released in the background
                        } else {
                            g.release().await.unwrap();
                        }
                    }
                    Ok(Err(e)) => panic!("{e}"),
                    Err(_) => {}
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    // Everything dropped is taken back within moments, not a lease.
    d.assert_nothing_left(&key).await;
    let g = d
        .client(0)
        .semaphore(&key, N)
        .wait(Duration::ZERO)
        .await
        .unwrap();
    let h = d
        .client(1)
        .semaphore(&key, N)
        .wait(Duration::ZERO)
        .await
        .unwrap();
    g.release().await.unwrap();
    h.release().await.unwrap();
    d.assert_nothing_left(&key).await;
}

/// Every check above, in turn.
pub async fn all(d: &Deployment) {
    at_most_n_at_once(d).await;
    tokens_rise(d).await;
    waiters_are_served_in_order(d).await;
    a_cancelled_waiter_leaves_nothing(d).await;
    disagreeing_services_keep_their_own_limits(d).await;
    reentry_with_all_permits_in_use(d).await;
    operations(d).await;
    locks_and_semaphores_exclude_each_other(d).await;
    min_hold_keeps_the_permit_counted(d).await;
    renewals_keep_a_permit_until_max_hold(d).await;
    cancelled_requests_leave_nothing(d).await;
}
