//! Looking at locks and clearing them (`inspect`, `force_release`,
//! `locks`), as every deployment must do it, run against several clients
//! of one deployment (separate holders, as separate instances of a service
//! would be).

use std::collections::BTreeSet;
use std::future::Future;
use std::time::{Duration, Instant};

use lock_runtime::{LockClient, LockError, LockGuard, LockInfo, LockMode};

use crate::read_write::waiting;

/// How long a test waits for something that takes milliseconds.
const LIMIT: Duration = Duration::from_secs(10);

/// The lease of a hold that is force-released: long enough that its next
/// renewal (a third of it) comes well after what the test checks first,
/// on a loaded machine too.
const STUCK_LEASE: Duration = Duration::from_secs(15);

/// Poll an async condition until it holds; false on time-out.
pub async fn until<F, Fut>(limit: Duration, mut cond: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + limit;
    loop {
        if cond().await {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn info(client: &LockClient, key: &str) -> Option<LockInfo> {
    client.inspect(key).await.expect("inspect")
}

fn lost<T: std::fmt::Debug>(r: Result<T, LockError>) -> bool {
    matches!(r, Err(LockError::Lost { .. }))
}

/// A key nobody ever locked, and one whose only trace is its fence
/// counter: neither is a lock, and clearing them removes nothing.
pub async fn a_free_key(client: &LockClient) {
    let key = crate::unique("ops-free");
    assert_eq!(info(client, &key).await, None);
    assert!(!client.force_release(&key).await.unwrap());
    client.lock(&key).await.unwrap().release().await.unwrap();
    assert_eq!(info(client, &key).await, None, "released: not a lock");
    assert!(!client.force_release(&key).await.unwrap());
    assert!(matches!(
        client.inspect("").await,
        Err(LockError::InvalidKey { .. })
    ));
}

/// A held key shows its one holder, its lease left and its token, to any
/// client; looking at it changes nothing.
pub async fn a_held_key(clients: &[LockClient]) {
    let key = crate::unique("ops-held");
    let lease = Duration::from_secs(30);
    let g = clients[0].lock(&key).lease(lease).await.unwrap();
    for c in clients {
        let i = info(c, &key).await.expect("held");
        assert_eq!(i.key, key);
        assert_eq!(i.mode, LockMode::Write);
        assert_eq!(i.holders, [g.holder()]);
        assert!(i.holders[0].starts_with(clients[0].id()));
        let ttl = i.ttl.expect("a lease left");
        assert!(ttl <= lease && ttl > lease / 2, "{ttl:?} left of {lease:?}");
        assert_eq!(i.waiters, 0);
        assert_eq!(i.fence, Some(g.fence()));
    }
    g.release().await.expect("looking changed nothing");
    assert_eq!(info(&clients[1], &key).await, None);
}

/// A key read-held by readers of two clients shows both, in read mode,
/// with the token they share.
pub async fn a_read_held_key(clients: &[LockClient]) {
    let key = crate::unique("ops-read");
    let r1 = clients[0].read_lock(&key).await.unwrap();
    let r2 = clients[1].read_lock(&key).await.unwrap();
    let i = info(&clients[2], &key).await.expect("read-held");
    assert_eq!(i.mode, LockMode::Read);
    let holders: BTreeSet<&str> = i.holders.iter().map(String::as_str).collect();
    assert_eq!(holders, BTreeSet::from([r1.holder(), r2.holder()]));
    assert!(i.ttl.is_some());
    assert_eq!(i.fence, Some(r1.fence()));
    r1.release().await.unwrap();
    let i = info(&clients[2], &key).await.expect("still read-held");
    assert_eq!(i.holders, [r2.holder()]);
    r2.release().await.unwrap();
    assert_eq!(info(&clients[2], &key).await, None);
}

/// Waiters of two clients queued behind a holder are counted, whoever
/// looks; once they gave up, they are not.
pub async fn waiters_of_two_clients(clients: &[LockClient]) {
    let key = crate::unique("ops-waiters");
    let g = clients[0].lock(&key).await.unwrap();
    let mut tasks = Vec::new();
    for c in &clients[1..3] {
        let (c, key) = (c.clone(), key.clone());
        tasks.push(tokio::spawn(async move {
            c.lock(&key).wait(Duration::from_secs(3)).await
        }));
    }
    assert!(
        until(LIMIT, || async { waiting(clients, &key) == 2 }).await,
        "the two waiters did not queue"
    );
    for c in clients {
        let i = info(c, &key).await.expect("held");
        assert_eq!(i.waiters, 2, "{i:?}");
        assert_eq!(i.holders, [g.holder()]);
    }
    for t in tasks {
        assert!(matches!(t.await.unwrap(), Err(LockError::Timeout { .. })));
    }
    // (They leave the queue in the background, right after giving up.)
    assert!(
        until(LIMIT, || async {
            info(&clients[0], &key).await.expect("held").waiters == 0
        })
        .await,
        "waiters that gave up are still counted"
    );
    g.release().await.unwrap();
}

/// A waiter on `client` for `key`, and when it got the lock.
fn wait_for(
    client: &LockClient,
    key: &str,
) -> tokio::task::JoinHandle<Result<(LockGuard, Instant), LockError>> {
    let (c, key) = (client.clone(), key.to_owned());
    tokio::spawn(async move {
        let g = c.lock(&key).wait(Duration::from_secs(60)).await?;
        Ok((g, Instant::now()))
    })
}

/// A stuck holder cleared by a third client: the waiter of another client
/// gets the lock at once (not at the end of the stuck lease) with a higher
/// token, and the stuck holder's own release says `Lost` and leaves the
/// new holder alone. Returns how long the hand-off took.
pub async fn a_forced_release_hands_over(clients: &[LockClient]) -> Duration {
    let key = crate::unique("ops-force");
    let (holder, waiter, operator) = (&clients[0], &clients[1], &clients[2]);
    let stuck = holder.lock(&key).lease(STUCK_LEASE).await.unwrap();
    let task = wait_for(waiter, &key);
    assert!(until(LIMIT, || async { waiter.waiting_here(&key) == 1 }).await);
    let forced_at = Instant::now();
    assert!(operator.force_release(&key).await.unwrap());
    let (next, got_at) = tokio::time::timeout(LIMIT, task)
        .await
        .expect("the waiter was not served")
        .unwrap()
        .unwrap();
    let took = got_at - forced_at;
    assert!(
        took < STUCK_LEASE / 3,
        "the waiter got the lock {took:?} after the forced release"
    );
    assert!(next.fence() > stuck.fence());
    let i = info(operator, &key).await.expect("held by the waiter");
    assert_eq!(i.holders, [next.holder()]);
    assert_eq!(i.fence, Some(next.fence()));
    // Before its next renewal: only the release itself can tell.
    assert!(!stuck.is_lost(), "the test ran past the stuck renewal");
    assert!(lost(stuck.release().await));
    assert_eq!(
        info(operator, &key).await.expect("still held").holders,
        [next.holder()],
        "the old holder's release touched the new holder"
    );
    next.release().await.expect("the new holder kept it");
    assert_eq!(info(operator, &key).await, None);
    took
}

/// What an operator's compare-and-clear does: it ends the hold of the
/// holder it names, and only while that holder holds. The interleaving it
/// exists for: the operator looks, the holder it saw releases, another
/// takes the key, the operator clears by the id it saw. `force_release`
/// there evicts the healthy new holder (asserted below, as the contrast);
/// `force_release_if` leaves it. A reader named among several readers is
/// the only one cleared.
///
/// `release_tells`: whether a cleared holder's own release says `Lost`
/// (see [`a_forced_read_release_hands_to_the_writer`]).
pub async fn a_conditional_release_leaves_a_holder_that_took_over(
    clients: &[LockClient],
    with_readers: bool,
    release_tells: bool,
) {
    let cleared = |r: Result<(), LockError>| !release_tells || lost(r);
    let key = crate::unique("ops-force-if");
    let (a, b, operator) = (&clients[0], &clients[1], &clients[2]);
    let first = a.lock(&key).lease(STUCK_LEASE).await.unwrap();
    let seen = info(operator, &key).await.expect("held").holders[0].clone();
    assert_eq!(seen, first.holder());
    first.release().await.unwrap();
    let next = b.lock(&key).lease(STUCK_LEASE).await.unwrap();

    assert!(!operator.force_release_if(&key, &seen).await.unwrap());
    let i = info(operator, &key).await.expect("still held");
    assert_eq!(i.holders, [next.holder()], "the new holder was cleared");
    assert_eq!(i.fence, Some(next.fence()));
    assert!(!next.is_lost());

    // The same interleaving with the unconditional call: the new holder
    // goes. (What the conditional one is for.)
    assert!(operator.force_release(&key).await.unwrap());
    assert!(cleared(next.release().await));

    // The named holder, while it holds: cleared, and a waiter is served.
    let held = a.lock(&key).lease(STUCK_LEASE).await.unwrap();
    let task = wait_for(b, &key);
    assert!(until(LIMIT, || async { b.waiting_here(&key) == 1 }).await);
    assert!(operator
        .force_release_if(&key, held.holder())
        .await
        .unwrap());
    let (served, _) = tokio::time::timeout(LIMIT, task)
        .await
        .expect("the waiter was not served")
        .unwrap()
        .unwrap();
    assert!(served.fence() > held.fence());
    let held_by = held.holder().to_owned();
    assert!(cleared(held.release().await));
    // A second send (a lost reply's retry) finds it someone else's.
    assert!(!operator.force_release_if(&key, &held_by).await.unwrap());
    assert_eq!(
        info(operator, &key).await.expect("held").holders,
        [served.holder()]
    );
    served.release().await.unwrap();

    if with_readers {
        let r1 = a.read_lock(&key).lease(STUCK_LEASE).await.unwrap();
        let r2 = b.read_lock(&key).lease(STUCK_LEASE).await.unwrap();
        assert!(operator.force_release_if(&key, r1.holder()).await.unwrap());
        let i = info(operator, &key).await.expect("still read-held");
        assert_eq!(
            (i.mode, i.holders),
            (LockMode::Read, vec![r2.holder().to_owned()])
        );
        assert!(cleared(r1.release().await));
        r2.release().await.expect("the other reader kept its hold");
    }
    assert_eq!(info(operator, &key).await, None);
}

/// A read-held key cleared while a writer waits: every reader's hold ends,
/// the writer gets the key, and each reader's release says `Lost`.
///
/// `release_tells`: whether a reader's release alone tells it was lost
/// (every deployment now; `false` has the readers wait for their renewal
/// first).
pub async fn a_forced_read_release_hands_to_the_writer(
    clients: &[LockClient],
    release_tells: bool,
) {
    let key = crate::unique("ops-force-read");
    let lease = if release_tells {
        STUCK_LEASE
    } else {
        Duration::from_secs(3)
    };
    let r1 = clients[0].read_lock(&key).lease(lease).await.unwrap();
    let r2 = clients[1].read_lock(&key).lease(lease).await.unwrap();
    let task = wait_for(&clients[2], &key);
    assert!(until(LIMIT, || async { clients[2].waiting_here(&key) == 1 }).await);
    assert!(clients[2].force_release(&key).await.unwrap());
    let (w, _) = tokio::time::timeout(LIMIT, task)
        .await
        .expect("the writer was not served")
        .unwrap()
        .unwrap();
    let i = info(&clients[0], &key).await.expect("written");
    assert_eq!(
        (i.mode, i.holders.clone()),
        (LockMode::Write, vec![w.holder().to_owned()])
    );
    if !release_tells {
        for r in [&r1, &r2] {
            tokio::time::timeout(lease * 3, r.lost())
                .await
                .expect("a cleared reader's watchdog did not notice");
        }
    }
    assert!(lost(r1.release().await));
    assert!(lost(r2.release().await));
    w.release().await.expect("the writer kept it");
}

/// A holder cleared while its body runs: its next renewal finds the lock
/// gone, and the body is stopped with `Lost` (`on_lost = "abort"`) at
/// about a third of the lease, not at its end.
pub async fn the_cleared_holder_learns_at_its_renewal(clients: &[LockClient]) {
    let key = crate::unique("ops-renewal");
    let lease = Duration::from_secs(3);
    let (started_tx, started) = tokio::sync::oneshot::channel();
    let body = {
        let (c, key) = (clients[0].clone(), key.clone());
        tokio::spawn(async move {
            c.lock(&key)
                .lease(lease)
                .run(async move {
                    let _ = started_tx.send(());
                    std::future::pending::<()>().await
                })
                .await
        })
    };
    started.await.expect("the body never ran");
    assert!(clients[1].force_release(&key).await.unwrap());
    let out = tokio::time::timeout(lease * 3, body)
        .await
        .expect("the loss was never reported")
        .unwrap();
    assert!(matches!(out, Err(LockError::Lost { .. })), "{out:?}");
}

/// `locks` lists the held and read-held keys matching a pattern, sorted,
/// each once (whatever side names it has), and not a key that only kept
/// its fence counter.
pub async fn listing(clients: &[LockClient]) -> Vec<LockInfo> {
    let base = crate::unique("ops-list");
    let w = clients[0].lock(format!("{base}:w")).await.unwrap();
    let w2 = clients[1].lock(format!("{base}:w2")).await.unwrap();
    let r1 = clients[0].read_lock(format!("{base}:r")).await.unwrap();
    let r2 = clients[1].read_lock(format!("{base}:r")).await.unwrap();
    // Awaited too: its queue and waiters are names of the same key.
    let task = {
        let (c, key) = (clients[2].clone(), format!("{base}:w"));
        tokio::spawn(async move { c.lock(&key).wait(Duration::from_secs(3)).await })
    };
    assert!(
        until(LIMIT, || async {
            waiting(clients, &format!("{base}:w")) == 1
        })
        .await
    );
    clients[2]
        .lock(format!("{base}:f"))
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let all = clients[2].locks(&format!("{base}:*")).await.unwrap();
    let keys: Vec<&str> = all.iter().map(|l| l.key.as_str()).collect();
    assert_eq!(
        keys,
        [
            format!("{base}:r"),
            format!("{base}:w"),
            format!("{base}:w2")
        ]
    );
    assert_eq!(all[0].mode, LockMode::Read);
    assert_eq!(all[0].holders.len(), 2);
    assert_eq!(all[1].holders, [w.holder()]);
    assert_eq!(all[2].holders, [w2.holder()]);
    let one = clients[0].locks(&format!("{base}:w")).await.unwrap();
    assert_eq!(one.len(), 1, "{one:?}");
    assert_eq!(
        (&one[0].key, &one[0].holders),
        (&all[1].key, &all[1].holders)
    );
    assert!(clients[0]
        .locks(&format!("{base}:none*"))
        .await
        .unwrap()
        .is_empty());
    assert!(matches!(
        task.await.unwrap(),
        Err(LockError::Timeout { .. })
    ));
    for g in [w, w2, r1, r2] {
        g.release().await.unwrap();
    }
    // The waiter that timed out leaves the queue from the background: a
    // release that reached Redis first handed it `w`, which its undo then
    // gives back.
    assert!(
        until(LIMIT, || async {
            clients[1]
                .locks(&format!("{base}:*"))
                .await
                .unwrap()
                .is_empty()
        })
        .await,
        "{:?}",
        clients[1].locks(&format!("{base}:*")).await
    );
    all
}
