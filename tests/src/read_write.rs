//! Read-write lock semantics every deployment must have, run against
//! several clients of one deployment (separate holders, as separate
//! instances of a service would be).
use std::future::IntoFuture;
use std::sync::Arc;
use std::time::{Duration, Instant};

use lock_runtime::{LockClient, LockError, LockGuard};
use tokio::sync::Mutex;

/// How long a test waits for something that takes milliseconds.
const LIMIT: Duration = Duration::from_secs(10);

/// Tasks waiting for `key` across the distinct clients in `clients`.
pub fn waiting(clients: &[LockClient], key: &str) -> usize {
    let mut ids: Vec<&str> = Vec::new();
    let mut sum = 0;
    for c in clients {
        if !ids.contains(&c.id()) {
            ids.push(c.id());
            sum += c.waiting_here(key);
        }
    }
    sum
}

fn busy<T: std::fmt::Debug>(r: Result<T, LockError>) -> bool {
    matches!(r, Err(LockError::Timeout { .. }))
}

/// Readers on different clients hold the key together and see the same
/// token; a writer is refused while any of them holds it, and gets a
/// higher token once the last one left; a reader after a writer has a
/// token no lower than that writer's, and the next writer's is higher.
pub async fn readers_share_and_a_writer_excludes_them(clients: &[LockClient]) {
    let key = crate::unique("rw-share");
    let (a, b) = (&clients[0], &clients[1 % clients.len()]);
    let r1 = a.read_lock(&key).await.expect("first reader");
    let r2 = b.read_lock(&key).await.expect("second reader shares");
    let token = r1.fence();
    assert_eq!(r2.fence(), token, "readers get the current token");
    assert!(
        busy(a.write_lock(&key).wait(Duration::ZERO).await),
        "a writer got in beside readers"
    );
    assert!(
        busy(b.lock(&key).wait(Duration::ZERO).await),
        "lock() is the write lock"
    );
    r1.release().await.expect("first reader leaves");
    assert!(
        busy(a.write_lock(&key).wait(Duration::ZERO).await),
        "a writer got in beside the remaining reader"
    );
    r2.release().await.expect("last reader leaves");
    let w = a.write_lock(&key).await.expect("writer after the readers");
    assert!(w.fence() > token, "a writer's token is new");
    // A writer excludes readers, too.
    assert!(
        busy(b.read_lock(&key).wait(Duration::ZERO).await),
        "a reader got in beside a writer"
    );
    let wt = w.fence();
    w.release().await.expect("writer leaves");
    let r3 = b.read_lock(&key).await.expect("reader after the writer");
    // The first reader of a read hold gets the current token floored at
    // the server's clock, as a writer's is: never below the last writer's.
    assert!(
        r3.fence() >= wt,
        "a reader's token {} is below the last writer's {wt}",
        r3.fence()
    );
    let rt = r3.fence();
    r3.release().await.expect("reader leaves");
    let w2 = a.write_lock(&key).await.expect("writer after the reader");
    assert!(
        w2.fence() > rt,
        "the next writer's token is above the reader's"
    );
    w2.release().await.expect("writer leaves");
}

/// Once a writer waits, new readers queue behind it: with readers holding
/// the key in overlapping turns, a waiting writer gets it as soon as the
/// readers that were in before it leave. Returns the writer's wait.
pub async fn a_waiting_writer_is_not_starved(clients: &[LockClient]) -> Duration {
    let key = crate::unique("rw-starve");
    let n = clients.len();
    let first = clients[0].read_lock(&key).await.expect("first reader");
    // A writer starts waiting behind it.
    let writer = {
        let (c, key) = (clients[1 % n].clone(), key.clone());
        tokio::spawn(async move {
            let started = Instant::now();
            let g = c.write_lock(&key).wait(LIMIT).await?;
            let waited = started.elapsed();
            Ok::<(LockGuard, Duration), LockError>((g, waited))
        })
    };
    assert!(
        crate::eventually(LIMIT, || waiting(clients, &key) == 1).await,
        "the writer never waited"
    );
    // A stream of readers arrives while the first still reads: none of
    // them may get in ahead of the writer.
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut readers = Vec::new();
    for i in 0..4 {
        let (c, key, order) = (clients[(2 + i) % n].clone(), key.clone(), order.clone());
        readers.push(tokio::spawn(async move {
            let g = c.read_lock(&key).wait(LIMIT).await?;
            order.lock().await.push("reader");
            Ok::<LockGuard, LockError>(g)
        }));
    }
    assert!(
        crate::eventually(LIMIT, || waiting(clients, &key) == 5).await,
        "the readers did not all wait behind the writer"
    );
    assert!(
        order.lock().await.is_empty(),
        "a reader got in ahead of the waiting writer"
    );
    first.release().await.expect("first reader leaves");
    let (w, waited) = writer.await.unwrap().expect("the writer gets the lock");
    order.lock().await.push("writer");
    assert!(
        order.lock().await.iter().all(|e| *e == "writer"),
        "a reader got in ahead of the waiting writer: {:?}",
        order.lock().await
    );
    w.release().await.expect("writer leaves");
    for r in readers {
        r.await
            .unwrap()
            .expect("queued readers get the lock after the writer")
            .release()
            .await
            .expect("reader leaves");
    }
    waited
}

/// A writer's release hands the lock to every reader queued behind it at
/// once (they hold it together, with one token: the writer's on Redis, a
/// new one above it on PostgreSQL), and the last reader's release hands it
/// to a writer queued behind them, whose token is above theirs.
pub async fn a_release_wakes_the_readers_together_then_the_writer(clients: &[LockClient]) {
    let key = crate::unique("rw-wake");
    let n = clients.len();
    let w = clients[0].write_lock(&key).await.expect("writer");
    let first = w.fence();
    let all_in = Arc::new(tokio::sync::Barrier::new(4));
    let mut readers = Vec::new();
    for i in 0..3 {
        let (c, key, all_in) = (clients[(1 + i) % n].clone(), key.clone(), all_in.clone());
        readers.push(tokio::spawn(async move {
            let g = c.read_lock(&key).wait(LIMIT).await?;
            // Held together: every reader reaches this point while the
            // others still hold the key.
            all_in.wait().await;
            Ok::<LockGuard, LockError>(g)
        }));
    }
    let waiting = || waiting(clients, &key);
    assert!(
        crate::eventually(LIMIT, || waiting() == 3).await,
        "the readers did not wait"
    );
    // A second writer queues behind the readers.
    let writer = {
        let (c, key) = (clients[n - 1].clone(), key.clone());
        tokio::spawn(async move { c.write_lock(&key).wait(LIMIT).await })
    };
    assert!(
        crate::eventually(LIMIT, || waiting() == 4).await,
        "the second writer did not wait"
    );
    w.release().await.expect("writer leaves");
    tokio::time::timeout(LIMIT, all_in.wait())
        .await
        .expect("the readers were not handed the lock together");
    let mut guards = Vec::new();
    for r in readers {
        guards.push(r.await.unwrap().expect("reader"));
    }
    assert!(!writer.is_finished(), "the writer got in beside readers");
    let tokens: Vec<u64> = guards.iter().map(LockGuard::fence).collect();
    assert!(
        tokens.iter().all(|&t| t == tokens[0] && t >= first),
        "readers handed the lock together: tokens {tokens:?}, the writer's {first}"
    );
    for g in guards {
        g.release().await.expect("reader leaves");
    }
    let w2 = tokio::time::timeout(LIMIT, writer)
        .await
        .expect("the last reader's release did not hand the lock to the writer")
        .unwrap()
        .expect("second writer");
    assert!(
        w2.fence() > tokens[0],
        "the writer after the readers: token {} after theirs {}",
        w2.fence(),
        tokens[0]
    );
    w2.release().await.expect("second writer leaves");
}

/// In a scope that holds the write lock, a read lock of the same key
/// re-enters it (same token); in one that holds the read lock, asking for
/// the write lock is refused at once, however long the wait.
pub async fn reentry_and_upgrade(client: &LockClient) {
    let key = crate::unique("rw-reenter");
    let c = client.clone();
    let k = key.clone();
    let (outer, inner) = client
        .write_lock(&key)
        .run(async move {
            let outer = lock_runtime::current_fence();
            let g = c.read_lock(&k).await.expect("read inside write re-enters");
            let inner = g.fence();
            g.release().await.expect("inner release");
            (outer, inner)
        })
        .await
        .expect("write lock");
    assert_eq!(Some(inner), outer, "the reentry shares the outer token");
    let c = client.clone();
    let k = key.clone();
    let refused = client
        .read_lock(&key)
        .run(async move {
            let started = Instant::now();
            let e = c.write_lock(&k).wait(LIMIT).await.unwrap_err();
            // A read inside the read hold re-enters it.
            let again = c.read_lock(&k).await.expect("read inside read re-enters");
            again.release().await.expect("inner release");
            (e, started.elapsed())
        })
        .await
        .expect("read lock");
    assert!(
        matches!(&refused.0, LockError::UpgradeRefused { key: k } if *k == key),
        "{:?}",
        refused.0
    );
    assert!(
        refused.1 < Duration::from_secs(1),
        "the upgrade was refused only after {:?}",
        refused.1
    );
    // Nothing is left held.
    client
        .write_lock(&key)
        .await
        .expect("free again")
        .release()
        .await
        .unwrap();
}

/// A reader whose lease is renewed keeps the key through several leases.
pub async fn a_reader_is_renewed(client: &LockClient, other: &LockClient) {
    let key = crate::unique("rw-renew");
    // Renewed every 500 ms: a second of stall still renews in time.
    let lease = Duration::from_millis(1500);
    let r = client.read_lock(&key).lease(lease).await.expect("reader");
    tokio::time::sleep(lease * 2).await;
    assert!(
        busy(other.write_lock(&key).wait(Duration::ZERO).await),
        "the read hold lapsed"
    );
    r.release().await.expect("still held at release");
}

/// Read-lock futures dropped at any point leave nothing held.
pub async fn dropped_read_requests_leave_nothing(clients: &[LockClient]) {
    let key = crate::unique("rw-cancel");
    for i in 0..20u64 {
        let c = &clients[i as usize % clients.len()];
        let fut = c
            .read_lock(&key)
            .lease(Duration::from_secs(30))
            .into_future();
        let _ = tokio::time::timeout(Duration::from_micros(200 * i), fut).await;
    }
    let c = &clients[0];
    let ok = async {
        for _ in 0..200 {
            match c.write_lock(&key).wait(Duration::ZERO).await {
                Ok(g) => return Some(g),
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
        None
    }
    .await;
    ok.expect("a dropped read request left the key held")
        .release()
        .await
        .unwrap();
}

/// A queued writer that gives up lets the readers queued only behind it
/// in at once: its withdrawal serves them. `clients` must have a retry
/// delay far above 10 s and a lease of 30 s, so that no reader gets in by
/// asking again.
pub async fn a_writer_giving_up_lets_the_readers_behind_it_in(clients: &[LockClient]) {
    let key = crate::unique("rw-gave-up");
    let (a, b) = (&clients[0], &clients[1 % clients.len()]);
    let first = a.read_lock(&key).await.expect("first reader");
    let writer = {
        let (c, key) = (b.clone(), key.clone());
        tokio::spawn(async move { c.write_lock(&key).wait(Duration::from_secs(2)).await })
    };
    assert!(
        crate::eventually(LIMIT, || waiting(clients, &key) == 1).await,
        "the writer did not wait"
    );
    let readers: Vec<_> = (0..2)
        .map(|i| {
            let (c, key) = (clients[i % clients.len()].clone(), key.clone());
            tokio::spawn(async move { c.read_lock(&key).wait(Duration::from_secs(60)).await })
        })
        .collect();
    assert!(
        crate::eventually(LIMIT, || waiting(clients, &key) == 3).await,
        "the readers did not queue behind the writer"
    );
    assert!(busy(writer.await.unwrap()), "the writer got in");
    // (Asking again on their own, they would wait out the first reader's
    // 30 s lease.)
    assert!(
        crate::eventually(LIMIT, || readers.iter().all(|r| r.is_finished())).await,
        "the readers still wait after the writer ahead of them gave up"
    );
    for r in readers {
        let g = r
            .await
            .unwrap()
            .expect("a reader queued behind a writer that gave up");
        assert_eq!(g.fence(), first.fence(), "readers get the current token");
        g.release().await.unwrap();
    }
    first.release().await.unwrap();
}
