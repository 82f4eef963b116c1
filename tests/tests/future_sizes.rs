//! An annotated call's future is its body's plus a bounded amount, in every
//! mode, and nesting adds a bounded amount per level: a handler that
//! connects and locks runs on a small stack in a debug build, and the
//! request futures a caller awaits by hand are bounded too.

use std::future::IntoFuture;
use std::mem::size_of_val;

use lock_runtime::{distributed_lock, LockClient, LockError};
use tests::RedisServer;

const KIB: usize = 1024;

#[distributed_lock(key = "trivial:{id}")]
async fn trivial(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

#[distributed_lock(keys = ["from:{from}", "to:{to}"])]
async fn multi_key(from: u64, to: u64) -> Result<u64, LockError> {
    Ok(from + to)
}

#[distributed_lock(keys = ["from:{from}", "to:{to}"], mode = "read")]
async fn multi_key_read(from: u64, to: u64) -> Result<u64, LockError> {
    Ok(from + to)
}

#[distributed_lock(key = "doc:{id}", mode = "read")]
async fn read(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

#[distributed_lock(key = "render:{id}", permits = 4)]
async fn permits(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

#[distributed_lock(
    key = "job:{id}",
    on_busy = "skip",
    fence = false,
    lease = "5s",
    max_hold = "1m"
)]
async fn skip(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

#[derive(Clone)]
struct State {
    locks: LockClient,
}

#[distributed_lock(key = "state:{id}", client = state.locks)]
async fn from_state(state: State, id: u64) -> Result<u64, LockError> {
    Ok(id)
}

/// What the handlers below do, without the attribute.
async fn connect_and_lock_body(url: &str) -> Result<u64, LockError> {
    let client = LockClient::connect(url).await?;
    let guard = client.lock("inner").await?;
    let fence = guard.fence();
    guard.release().await?;
    Ok(fence)
}

#[distributed_lock(key = "outer:{id}")]
async fn connect_and_lock(id: u64, url: &str) -> Result<u64, LockError> {
    let _ = id;
    let client = LockClient::connect(url).await?;
    let guard = client.lock("inner").await?;
    let fence = guard.fence();
    guard.release().await?;
    Ok(fence)
}

#[derive(Clone)]
struct App {
    locks: LockClient,
    url: String,
}

/// A handler whose client comes from its state, and whose body connects a
/// client of its own and takes a lock with it.
#[distributed_lock(key = "pay:{id}", client = app.locks)]
async fn handler(app: App, id: u64) -> Result<(u64, u64), LockError> {
    let outer = lock_runtime::current_fence().unwrap_or(0);
    let client = LockClient::connect(&app.url).await?;
    let guard = client.lock(format!("ledger:{id}")).await?;
    let inner = guard.fence();
    guard.release().await?;
    Ok((outer, inner))
}

#[distributed_lock(key = "n1:{id}")]
async fn nested_1(id: u64) -> Result<u64, LockError> {
    trivial(id).await
}

#[distributed_lock(key = "n2:{id}")]
async fn nested_2(id: u64) -> Result<u64, LockError> {
    nested_1(id).await
}

#[distributed_lock(key = "n3:{id}")]
async fn nested_3(id: u64) -> Result<u64, LockError> {
    nested_2(id).await
}

/// Each annotated mode's future, with a trivial body, is at most 4 KiB.
#[test]
fn a_trivial_annotated_future_is_small_in_every_mode() {
    let client = LockClient::memory();
    let sizes = [
        ("key", size_of_val(&trivial(1))),
        ("keys", size_of_val(&multi_key(1, 2))),
        ("keys, mode = read", size_of_val(&multi_key_read(1, 2))),
        ("mode = read", size_of_val(&read(1))),
        ("permits", size_of_val(&permits(1))),
        ("on_busy = skip", size_of_val(&skip(1))),
        (
            "client = state.locks",
            size_of_val(&from_state(State { locks: client }, 1)),
        ),
    ];
    println!("annotated, trivial body: {sizes:?}");
    for (mode, size) in sizes {
        assert!(
            size <= 4 * KIB,
            "an annotated fn ({mode}) with a trivial body: {size} bytes; all: {sizes:?}"
        );
    }
    // Skipping a busy lock is a setting, not a second copy of the request
    // (a `mut self` in an `async fn` keeps its argument twice).
    let (key, skip) = (sizes[0].1, sizes[5].1);
    assert!(
        skip <= key + 256,
        "on_busy = skip: {skip} bytes, against {key} for a plain key"
    );
}

/// The annotated fn's future is its body's plus at most 4 KiB, where the
/// body holds futures of its own (a connect and a lock).
#[test]
fn an_annotated_future_is_its_body_plus_a_bounded_amount() {
    let url = "redis://127.0.0.1:1";
    let body = size_of_val(&connect_and_lock_body(url));
    let annotated = size_of_val(&connect_and_lock(1, url));
    println!("connect + lock: body {body} bytes, annotated {annotated}");
    assert!(
        annotated <= body + 4 * KIB,
        "annotated {annotated} bytes, its body alone {body}"
    );
}

/// Four annotated calls nested in one another: at most 16 KiB.
#[test]
fn nested_annotated_futures_grow_by_a_bounded_amount_per_level() {
    let levels = [
        size_of_val(&trivial(1)),
        size_of_val(&nested_1(1)),
        size_of_val(&nested_2(1)),
        size_of_val(&nested_3(1)),
    ];
    println!("1 to 4 levels: {levels:?}");
    assert!(levels[3] <= 16 * KIB, "1 to 4 levels: {levels:?}");
    for pair in levels.windows(2) {
        assert!(pair[1] <= pair[0] + 4 * KIB, "1 to 4 levels: {levels:?}");
    }
}

/// The futures a caller awaits by hand: each request kind, `try_acquire`,
/// and `run` with a trivial body at most 4 KiB; `run` with a large body at
/// most that body plus 4 KiB.
#[test]
fn request_futures_by_hand_are_bounded() {
    let client = LockClient::memory();
    let sizes = [
        ("lock", size_of_val(&client.lock("k").into_future())),
        (
            "read_lock",
            size_of_val(&client.read_lock("k").into_future()),
        ),
        (
            "semaphore",
            size_of_val(&client.semaphore("k", 3).into_future()),
        ),
        (
            "lock_all",
            size_of_val(&client.lock_all(["a", "b"]).into_future()),
        ),
        ("try_acquire", size_of_val(&client.lock("k").try_acquire())),
        (
            "semaphore try_acquire",
            size_of_val(&client.semaphore("k", 3).try_acquire()),
        ),
        ("run", size_of_val(&client.lock("k").run(async {}))),
        (
            "read_lock_all run",
            size_of_val(&client.read_lock_all(["a", "b"]).run(async {})),
        ),
        (
            "semaphore run_or_skip",
            size_of_val(&client.semaphore("k", 3).run_or_skip(async {})),
        ),
    ];
    println!("by hand: {sizes:?}");
    for (what, size) in sizes {
        assert!(size <= 4 * KIB, "{what}: {size} bytes; all: {sizes:?}");
    }
    let url = "redis://127.0.0.1:1";
    let body = size_of_val(&connect_and_lock_body(url));
    let run = size_of_val(&client.lock("k").run(connect_and_lock_body(url)));
    println!("run by hand: body {body} bytes, run {run}");
    assert!(
        run <= body + 4 * KIB,
        "run {run} bytes, its body alone {body}"
    );
}

/// The handler above, spawned on a runtime whose workers have 512 KiB
/// stacks (a quarter of tokio's default), runs to the end: the outer lock
/// and the body's own both taken, and both free afterwards.
#[test]
fn a_handler_that_connects_and_locks_runs_on_a_512_kib_stack() {
    let server = RedisServer::start();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_stack_size(512 * KIB)
        .enable_all()
        .build()
        .unwrap();
    let (outer, inner) = runtime
        .block_on(async {
            let app = App {
                locks: LockClient::connect(&server.url()).await?,
                url: server.url(),
            };
            tokio::spawn(handler(app, 7))
                .await
                .expect("the handler's task")
        })
        .expect("the handler");
    assert!(outer > 0 && inner > 0, "tokens {outer}, {inner}");
    assert_eq!(server.owner_of("pay:7"), None, "outer lock left behind");
    assert_eq!(server.owner_of("ledger:7"), None, "inner lock left behind");
}
