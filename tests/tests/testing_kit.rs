//! Written as a user of the crate would test their own code: annotated fns
//! under `#[tokio::test(start_paused = true)]`, each test with its own
//! in-memory client through `with_client` (no `init` anywhere in this
//! binary), time driven by tokio. Waits, leases and renewals of minutes
//! pass in no real time; `MemoryControl` ends holds and cuts calls.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use lock_runtime::{
    current_fence, current_fences, distributed_lock, with_client, LockClient, LockError, LockMode,
};
use tokio::time::{sleep, Instant};

#[derive(Debug)]
enum AppError {
    Lock(LockError),
}

impl From<LockError> for AppError {
    fn from(e: LockError) -> Self {
        AppError::Lock(e)
    }
}

#[distributed_lock(key = "order:{id}", wait = "20s")]
async fn pay(id: u64) -> Result<u64, AppError> {
    let _ = id;
    Ok(current_fence().expect("held"))
}

#[distributed_lock(key = "report:{id}", lease = "30s")]
async fn report(id: u64, work: Duration) -> Result<u64, LockError> {
    let _ = id;
    sleep(work).await;
    Ok(current_fence().expect("held"))
}

#[distributed_lock(key = "stream:{id}")]
async fn consume(id: u64, progress: Arc<AtomicU32>) -> Result<(), LockError> {
    let _ = id;
    loop {
        sleep(Duration::from_secs(1)).await;
        progress.fetch_add(1, Ordering::SeqCst);
    }
}

#[distributed_lock(key = "stream:{id}", on_lost = "continue")]
async fn consume_on(id: u64, steps: u32) -> Result<u32, LockError> {
    let _ = id;
    for _ in 0..steps {
        sleep(Duration::from_secs(1)).await;
    }
    Ok(steps)
}

/// At most two renders at once; `pages` seconds of work each.
#[distributed_lock(key = "render:{tenant}", permits = 2, wait = "60s")]
async fn render(tenant: u64, pages: u32, done: Arc<AtomicU32>) -> Result<u64, LockError> {
    let _ = tenant;
    for _ in 0..pages {
        sleep(Duration::from_secs(1)).await;
        done.fetch_add(1, Ordering::SeqCst);
    }
    Ok(current_fence().expect("held"))
}

/// What a body sees: `current_fence()` and `current_fences()`.
type Seen = (Option<u64>, Vec<(String, u64)>);

#[distributed_lock(keys = ["account:{from}", "account:{to}"])]
async fn transfer(from: u64, to: u64) -> Result<Seen, LockError> {
    let _ = (from, to);
    Ok((current_fence(), current_fences()))
}

#[distributed_lock(key = "who:{id}")]
async fn who(id: u64) -> Result<(String, usize), LockError> {
    let _ = id;
    let client = lock_runtime::client()?;
    Ok((client.id().to_owned(), client.held_count()))
}

/// The user's own code under test: a lock call that failed on the backend
/// is tried again, 10 s later, up to three times.
async fn pay_with_retries(id: u64, tries: &AtomicU32) -> Result<u64, AppError> {
    loop {
        let n = tries.fetch_add(1, Ordering::SeqCst) + 1;
        match pay(id).await {
            Err(AppError::Lock(LockError::Backend(_))) if n < 3 => {
                sleep(Duration::from_secs(10)).await
            }
            other => return other,
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_20_second_wait_passes_on_tokios_clock() {
    let client = LockClient::memory();
    let held = client.lock("order:1").await.unwrap();
    let release_at = Instant::now() + Duration::from_secs(15);
    let holder = tokio::spawn(async move {
        sleep(Duration::from_secs(15)).await;
        held.release().await.unwrap();
    });
    let fence = with_client(client.clone(), pay(1)).await.unwrap();
    assert!(Instant::now() >= release_at, "served before the release");
    assert!(fence > 0);
    holder.await.unwrap();

    // Held past the whole wait: Timeout after 20 s of tokio time.
    let _held = client.lock("order:2").await.unwrap();
    let started = Instant::now();
    match with_client(client.clone(), pay(2)).await {
        Err(AppError::Lock(LockError::Timeout { waited, .. })) => {
            assert!(waited >= Duration::from_secs(20), "{waited:?}");
            assert!(started.elapsed() >= Duration::from_secs(20));
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn a_10_minute_hold_is_kept_alive_by_the_watchdog() {
    let client = LockClient::memory();
    let job = tokio::spawn(with_client(
        client.clone(),
        report(1, Duration::from_secs(600)),
    ));
    // 9 minutes in (18 leases of 30 s): still held.
    sleep(Duration::from_secs(540)).await;
    let probe = client.lock("report:1").try_acquire().await.unwrap();
    assert!(
        probe.is_none(),
        "the hold lapsed: renewals did not follow tokio's clock"
    );
    let fence = job.await.unwrap().expect("the hold was lost");
    // Released at the end: free at once.
    let next = client.lock("report:1").wait(Duration::ZERO).await.unwrap();
    assert!(next.fence() > fence);
}

#[tokio::test(start_paused = true)]
async fn expire_makes_the_body_stop_with_lost() {
    let (client, control) = LockClient::memory_with_control();
    let progress = Arc::new(AtomicU32::new(0));
    let task = tokio::spawn(with_client(client.clone(), consume(1, progress.clone())));
    sleep(Duration::from_millis(5_500)).await;
    assert!(control.expire("stream:1"), "it was held");
    assert!(!control.expire("stream:1"), "and is no longer");
    let expired_at = Instant::now();
    let out = task.await.unwrap();
    assert!(matches!(out, Err(LockError::Lost { .. })), "{out:?}");
    // Found at the next renewal (every lease/3 = 10 s), and stopped there.
    assert!(expired_at.elapsed() <= Duration::from_secs(10));
    let at_loss = progress.load(Ordering::SeqCst);
    sleep(Duration::from_secs(5)).await;
    assert_eq!(progress.load(Ordering::SeqCst), at_loss, "the body ran on");

    // `on_lost = "continue"`: the body finishes and its result stands.
    let task = tokio::spawn(with_client(client.clone(), consume_on(2, 30)));
    sleep(Duration::from_secs(2)).await;
    assert!(control.expire("stream:2"));
    assert_eq!(task.await.unwrap().unwrap(), 30);
}

#[tokio::test(start_paused = true)]
async fn expire_on_a_semaphore_ends_its_oldest_permit() {
    let (client, control) = LockClient::memory_with_control();
    let pages = || Arc::new(AtomicU32::new(0));
    let (a_pages, b_pages, c_pages) = (pages(), pages(), pages());
    let render_on = |pages: u32, done: &Arc<AtomicU32>| {
        tokio::spawn(with_client(client.clone(), render(1, pages, done.clone())))
    };
    let a = render_on(100, &a_pages);
    sleep(Duration::from_secs(1)).await;
    let b = render_on(100, &b_pages);
    sleep(Duration::from_secs(1)).await;
    // Both permits are taken: the third render waits.
    let c = render_on(3, &c_pages);
    sleep(Duration::from_secs(2)).await;
    assert_eq!(c_pages.load(Ordering::SeqCst), 0, "a third render ran");
    let info = client.inspect("render:1").await.unwrap().unwrap();
    assert_eq!(info.mode, LockMode::Semaphore { permits: 2 });
    assert_eq!((info.holders.len(), info.waiters), (2, 1), "{info:?}");

    // One permit ends, the one taken first: `a`'s. The waiter gets it at once.
    assert!(control.expire("render:1"));
    let expired_at = Instant::now();
    c.await.unwrap().expect("the waiter rendered");
    assert!(
        expired_at.elapsed() < Duration::from_secs(4),
        "the waiter's 3 pages took {:?}: it was not served at once",
        expired_at.elapsed()
    );
    assert!(matches!(a.await.unwrap(), Err(LockError::Lost { .. })));
    assert!(
        expired_at.elapsed() <= Duration::from_secs(10),
        "found at a renewal"
    );
    assert!(!b.is_finished(), "`b` kept its permit");
    let b_before = b_pages.load(Ordering::SeqCst);

    // Then the oldest left: `b`'s.
    assert!(control.expire("render:1"));
    assert!(matches!(b.await.unwrap(), Err(LockError::Lost { .. })));
    assert!(
        b_pages.load(Ordering::SeqCst) > b_before,
        "`b` ran on until then"
    );
    assert!(!control.expire("render:1"), "nothing is held any more");
    assert_eq!(client.inspect("render:1").await.unwrap(), None);
}

#[tokio::test(start_paused = true)]
async fn a_cut_connection_exercises_the_callers_retries() {
    let (client, control) = LockClient::memory_with_control();
    // A few failed calls are ridden out inside the lock call.
    control.fail_next(3);
    assert!(with_client(client.clone(), pay(1)).await.is_ok());

    // An outage of 25 s: the first call gives up after its 20 s wait with
    // a backend error, the caller's retry 10 s later succeeds.
    control.fail_next(usize::MAX);
    let ends = tokio::spawn({
        let control = control.clone();
        async move {
            sleep(Duration::from_secs(25)).await;
            control.fail_next(0);
        }
    });
    let tries = AtomicU32::new(0);
    let out = with_client(client.clone(), pay_with_retries(2, &tries)).await;
    assert!(out.is_ok(), "{out:?}");
    assert_eq!(tries.load(Ordering::SeqCst), 2);
    ends.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn renewals_that_keep_failing_end_in_on_lost() {
    let (client, control) = LockClient::memory_with_control();
    let job = tokio::spawn(with_client(
        client.clone(),
        report(1, Duration::from_secs(600)),
    ));
    sleep(Duration::from_secs(5)).await;
    control.fail_next(usize::MAX);
    let cut_at = Instant::now();
    let out = job.await.unwrap();
    assert!(matches!(out, Err(LockError::Lost { .. })), "{out:?}");
    // Lost when the 30 s lease ran out unrenewed, not before.
    assert!(cut_at.elapsed() >= Duration::from_secs(20));
    control.fail_next(0);
}

#[tokio::test(start_paused = true)]
async fn max_hold_is_its_own_error() {
    #[distributed_lock(key = "hung:{id}", lease = "30s", max_hold = "2m")]
    async fn hung(id: u64) -> Result<(), LockError> {
        let _ = id;
        std::future::pending::<()>().await;
        Ok(())
    }
    let client = LockClient::memory();
    let started = Instant::now();
    match with_client(client, hung(1)).await {
        Err(LockError::MaxHoldReached { key, max_hold }) => {
            assert_eq!(key, "hung:1");
            assert_eq!(max_hold, Duration::from_secs(120));
            assert!(started.elapsed() >= max_hold);
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn scopes_nest_and_fall_back_to_the_global_client() {
    // No `init` in this binary: outside any scope there is no client.
    assert!(matches!(
        lock_runtime::client(),
        Err(LockError::NotInitialized)
    ));
    assert!(matches!(who(1).await, Err(LockError::NotInitialized)));
    let (a, b) = (LockClient::memory(), LockClient::memory());
    with_client(a.clone(), async {
        let (id, held) = who(1).await.unwrap();
        assert_eq!(
            (id.as_str(), held),
            (a.id(), 1),
            "the scope's client holds it"
        );
        with_client(b.clone(), async {
            assert_eq!(who(2).await.unwrap().0, b.id(), "the innermost scope wins");
        })
        .await;
        assert_eq!(who(3).await.unwrap().0, a.id());
        // A spawned task starts outside the scope.
        let spawned = tokio::spawn(async { lock_runtime::client().is_err() });
        assert!(spawned.await.unwrap());
    })
    .await;
    assert!(lock_runtime::client().is_err());
}

#[tokio::test(start_paused = true)]
async fn a_multi_key_body_sees_every_token() {
    let client = LockClient::memory();
    let (first, fences) = with_client(client, transfer(9, 1)).await.unwrap();
    let keys: Vec<&str> = fences.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(keys, ["account:1", "account:9"]);
    assert_eq!(first, Some(fences[0].1));
    assert!(fences.iter().all(|(_, f)| *f > 0));
    assert!(current_fences().is_empty(), "outside a body");
}

#[test]
fn bad_settings_on_memory_are_an_error() {
    let err = LockClient::builder()
        .lease(Duration::ZERO)
        .memory()
        .unwrap_err();
    assert!(matches!(err, LockError::Config(_)), "{err:?}");
    let err = LockClient::builder()
        .replica_acks(1, Duration::from_secs(1))
        .memory()
        .unwrap_err();
    assert!(matches!(err, LockError::Config(_)), "{err:?}");
}

fn runtime(paused: bool) -> tokio::runtime::Runtime {
    let mut b = tokio::runtime::Builder::new_current_thread();
    b.enable_all();
    if paused {
        b.start_paused(true);
    }
    b.build().unwrap()
}

/// One client, many runtimes: the watchdog ran on the runtime the client
/// was made in; once that is gone, holds taken in the next are renewed
/// there (on its paused clock).
#[test]
fn a_memory_client_outlives_the_runtime_it_was_made_in() {
    let first = runtime(false);
    let client = first.block_on(async {
        let client = LockClient::memory();
        client.lock("a").await.unwrap().release().await.unwrap();
        client
    });
    drop(first);
    runtime(true).block_on(async {
        let guard = client
            .lock("b")
            .lease(Duration::from_secs(3))
            .await
            .unwrap();
        sleep(Duration::from_secs(60)).await;
        assert!(
            !guard.is_lost(),
            "not renewed after its first runtime went away"
        );
        guard.release().await.unwrap();
    });
}

/// A hold taken in a runtime that then goes away is still renewed.
#[test]
fn a_hold_outlives_the_runtime_it_was_taken_in() {
    let first = runtime(false);
    let (client, guard) = first.block_on(async {
        let client = LockClient::memory();
        let guard = client
            .lock("c")
            .lease(Duration::from_millis(1_500))
            .await
            .unwrap();
        (client, guard)
    });
    drop(first);
    runtime(false).block_on(async {
        // Several leases of real time: renewals went on meanwhile.
        sleep(Duration::from_secs(4)).await;
        assert!(!guard.is_lost(), "renewals stopped with the first runtime");
        guard.release().await.unwrap();
        assert!(client.lock("c").wait(Duration::ZERO).await.is_ok());
    });
}
