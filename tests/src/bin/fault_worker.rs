//! A lock client process for the fault suite (`tests/tests/fault_suite.rs`).
//!
//! `fault_worker LOCK_URL STORE_URL|- PROC_ID KEYS TASKS MODE [SETTINGS]`
//!
//! `LOCK_URL` is one Redis, or `sentinel:MASTER:K:MS@URL,URL,…` for the
//! primary the sentinels at those URLs name, with `replica_acks(K, MS ms)`
//! (`K` 0: without).
//!
//! Runs `TASKS` tasks that loop over: pick one of the comma-separated `KEYS`,
//! acquire it (lease 1 s, wait 2 s), write the fence to the fenced store
//! (`-`: no store), sometimes hold it a while (a target for SIGSTOP), write
//! again, release. `MODE` is `manual` (`client.lock`), `attr`
//! (`#[distributed_lock]`) or `mixed` (a coin per op). One op in four
//! takes the read lock instead (`read_lock`, `mode = "read"`):
//! it shares the key with other readers, writes nothing, and holds it the
//! same way, so the checker sees readers overlap each other and never a
//! writer. `SETTINGS` (`lease_ms=5000,wait_ms=12000,read_pct=60`, any of
//! them) changes the lease, the wait and the share of readers;
//! `long_hold_ms=N` makes the long holds last N to 2N ms (0: 80-200 ms);
//! `permits=N` (N > 0) makes every op take a permit of a semaphore of N
//! instead (`client.semaphore`, whatever `MODE` says): it writes nothing
//! (its holders share the key, each with a token of its own) and holds it
//! the same way.
//!
//! Every step is printed as a history line (`tests::history`), stamped
//! with `CLOCK_MONOTONIC`: a call's wait with its attempt, how long it took
//! and what kind of error it ended with. `E <message>` lines describe
//! errors.
//!
//! Control on stdin: `stop` (or end of input) stops starting new ops; when
//! every task has finished, the worker prints `I <locks still renewed>` and
//! waits for the end of stdin to exit, so the test can watch an idle client.

use std::io::BufRead;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lock_runtime::{distributed_lock, LockClient, LockError, LockGuard};
use tests::fenced::{FencedStore, Write};
use tests::history::{Failure, Kind, Recorder};

/// The lease and wait by default (the literal attributes below say the
/// same).
const LEASE: Duration = Duration::from_secs(1);
const WAIT: Duration = Duration::from_secs(2);
/// One op in this many holds its lock for a while.
const LONG_HOLD_ONE_IN: u32 = 40;

/// How every holder locks (`SETTINGS`).
#[derive(Debug, Clone, Copy)]
struct Settings {
    lease: Duration,
    wait: Duration,
    /// Of every 100 ops, this many take the read lock.
    read_pct: u32,
    /// A long hold lasts this long to twice that (0: 80-200 ms).
    long_hold_ms: u64,
    /// Above 0: every op takes a permit of a semaphore of this many.
    permits: u32,
}

impl Settings {
    fn parse(arg: Option<&str>) -> Settings {
        let mut s = Settings {
            lease: LEASE,
            wait: WAIT,
            read_pct: 25,
            long_hold_ms: 0,
            permits: 0,
        };
        for pair in arg.unwrap_or("").split(',').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').expect("SETTINGS: key=value,...");
            let n: u64 = v.parse().expect("SETTINGS: a number");
            match k {
                "lease_ms" => s.lease = Duration::from_millis(n),
                "wait_ms" => s.wait = Duration::from_millis(n),
                "read_pct" => s.read_pct = n as u32,
                "long_hold_ms" => s.long_hold_ms = n,
                "permits" => s.permits = n as u32,
                _ => panic!("SETTINGS: unknown {k}"),
            }
        }
        s
    }

    /// The attribute's literal lease and wait say the same.
    fn literal(&self) -> bool {
        self.lease == LEASE && self.wait == WAIT
    }
}

struct Ctx {
    rec: Recorder,
    store: Option<FencedStore>,
    proc_id: u32,
    settings: Settings,
}

fn error_line(what: &str, e: &dyn std::fmt::Display) {
    let msg = e.to_string().replace('\n', " ");
    println!("E {what}: {msg}");
}

fn ms(d: Duration) -> u64 {
    d.as_millis() as u64
}

/// A lock call ended without the lock: how long it took, and why.
fn call_failed(ctx: &Ctx, op: u64, key: &str, started: Instant, e: &LockError) {
    let waited = started.elapsed();
    let kind = match e {
        LockError::Timeout { .. } => Kind::Timeout {
            waited_ms: ms(waited),
        },
        LockError::Backend(_) => Kind::Failed {
            waited_ms: ms(waited),
            error: Failure::Backend,
        },
        _ => Kind::Failed {
            waited_ms: ms(waited),
            error: Failure::Other,
        },
    };
    ctx.rec.record(op, key, kind);
    if !matches!(e, LockError::Timeout { .. }) {
        let what = format!(
            "acquire (after {} ms of a {} ms wait)",
            ms(waited),
            ms(ctx.settings.wait)
        );
        error_line(&what, e);
    }
}

/// The holder's work: fenced writes (none for a reader), sometimes a long
/// hold between them.
async fn work(ctx: &Ctx, op: u64, key: &str, fence: u64, read: bool) {
    if !read {
        write(ctx, op, key, fence).await;
    }
    if fastrand::u32(..LONG_HOLD_ONE_IN) == 0 {
        let ms = match ctx.settings.long_hold_ms {
            0 => fastrand::u64(80..200),
            n => fastrand::u64(n..2 * n),
        };
        ctx.rec.record(op, key, Kind::Hold { ms });
        tokio::time::sleep(Duration::from_millis(ms)).await;
    } else {
        tokio::task::yield_now().await;
    }
    if !read {
        write(ctx, op, key, fence).await;
    }
}

async fn write(ctx: &Ctx, op: u64, key: &str, fence: u64) {
    let Some(store) = &ctx.store else { return };
    ctx.rec.record(op, key, Kind::Write { fence });
    let value = format!("{}:{op}", ctx.proc_id);
    let kind = match store.write(key, fence, &value).await {
        Ok(Write::Accepted) => Kind::WriteOk { fence },
        Ok(Write::Rejected { highest }) => Kind::WriteRejected { fence, highest },
        Err(e) => {
            error_line("store write", &e);
            Kind::WriteFailed { fence }
        }
    };
    ctx.rec.record(op, key, kind);
}

fn attempt(ctx: &Ctx, op: u64, key: &str) -> Instant {
    ctx.rec.record(
        op,
        key,
        Kind::Attempt {
            wait_ms: ms(ctx.settings.wait),
        },
    );
    Instant::now()
}

async fn manual_op(client: &LockClient, ctx: &Ctx, op: u64, key: &str, read: bool) {
    let started = attempt(ctx, op, key);
    let request = if read {
        client.read_lock(key)
    } else {
        client.write_lock(key)
    };
    let Settings { lease, wait, .. } = ctx.settings;
    match request.lease(lease).wait(wait).await {
        Ok(guard) => {
            let fence = guard.fence();
            ctx.rec.record(op, key, acquired(fence, read));
            hold_then_release(ctx, op, key, guard, read).await;
        }
        Err(e) => failed(ctx, op, key, started, &e).await,
    }
}

/// A permit of a semaphore of `permits`: held as a lock is, written
/// with nothing.
async fn permit_op(client: &LockClient, ctx: &Ctx, op: u64, key: &str) {
    let Settings {
        lease,
        wait,
        permits,
        ..
    } = ctx.settings;
    ctx.rec.record(
        op,
        key,
        Kind::AttemptPermits {
            wait_ms: ms(wait),
            permits: u64::from(permits),
        },
    );
    let started = Instant::now();
    match client.semaphore(key, permits).lease(lease).wait(wait).await {
        Ok(guard) => {
            ctx.rec.record(
                op,
                key,
                Kind::AcquiredPermit {
                    fence: guard.fence(),
                },
            );
            hold_then_release(ctx, op, key, guard, true).await;
        }
        Err(e) => failed(ctx, op, key, started, &e).await,
    }
}

/// The body's work under `guard` until it ends or the hold is lost,
/// then the release, each step recorded.
async fn hold_then_release(ctx: &Ctx, op: u64, key: &str, guard: LockGuard, read: bool) {
    let lost = guard.lost();
    let finished = tokio::select! {
        biased;
        () = lost => false,
        () = work(ctx, op, key, guard.fence(), read) => true,
    };
    ctx.rec.record(
        op,
        key,
        if finished {
            Kind::Releasing
        } else {
            Kind::Lost
        },
    );
    let kind = match guard.release().await {
        Ok(()) => Kind::Released,
        Err(LockError::Lost { .. }) => Kind::ReleaseLost,
        Err(e) => {
            error_line("release", &e);
            Kind::ReleaseFailed
        }
    };
    ctx.rec.record(op, key, kind);
}

/// A call that ended without a hold; after anything but a timeout, a
/// short pause before the next.
async fn failed(ctx: &Ctx, op: u64, key: &str, started: Instant, e: &LockError) {
    call_failed(ctx, op, key, started, e);
    if !matches!(e, LockError::Timeout { .. }) {
        tokio::time::sleep(Duration::from_millis(fastrand::u64(20..60))).await;
    }
}

#[derive(Debug)]
enum OpError {
    Lock(LockError),
    NoFence,
}

impl From<LockError> for OpError {
    fn from(e: LockError) -> Self {
        OpError::Lock(e)
    }
}

fn acquired(fence: u64, read: bool) -> Kind {
    if read {
        Kind::AcquiredRead { fence }
    } else {
        Kind::Acquired { fence }
    }
}

/// The body of both attributed ops.
async fn body(key: &str, op: u64, ctx: &Ctx, read: bool) -> Result<(), OpError> {
    let fence = lock_runtime::current_fence().ok_or(OpError::NoFence)?;
    ctx.rec.record(op, key, acquired(fence, read));
    work(ctx, op, key, fence, read).await;
    ctx.rec.record(op, key, Kind::BodyEnd);
    Ok(())
}

#[distributed_lock(key = "{key}", lease = "1s", wait = "2s")]
async fn attributed(key: &str, op: u64, ctx: &Ctx) -> Result<(), OpError> {
    body(key, op, ctx, false).await
}

#[distributed_lock(key = "{key}", lease = "1s", wait = "2s", mode = "read")]
async fn attributed_read(key: &str, op: u64, ctx: &Ctx) -> Result<(), OpError> {
    body(key, op, ctx, true).await
}

/// With the client's lease and wait (`SETTINGS`).
#[distributed_lock(key = "{key}")]
async fn attributed_configured(key: &str, op: u64, ctx: &Ctx) -> Result<(), OpError> {
    body(key, op, ctx, false).await
}

#[distributed_lock(key = "{key}", mode = "read")]
async fn attributed_configured_read(key: &str, op: u64, ctx: &Ctx) -> Result<(), OpError> {
    body(key, op, ctx, true).await
}

async fn attr_op(ctx: &Ctx, op: u64, key: &str, read: bool) {
    let started = attempt(ctx, op, key);
    let out = match (read, ctx.settings.literal()) {
        (true, true) => attributed_read(key, op, ctx).await,
        (false, true) => attributed(key, op, ctx).await,
        (true, false) => attributed_configured_read(key, op, ctx).await,
        (false, false) => attributed_configured(key, op, ctx).await,
    };
    match out {
        Ok(()) => {}
        // The body was stopped: the lock was lost while it ran.
        Err(OpError::Lock(LockError::Lost { .. })) => ctx.rec.record(op, key, Kind::Lost),
        Err(OpError::Lock(e)) => failed(ctx, op, key, started, &e).await,
        Err(OpError::NoFence) => {
            ctx.rec.record(
                op,
                key,
                Kind::Failed {
                    waited_ms: ms(started.elapsed()),
                    error: Failure::Other,
                },
            );
            println!("E attributed body: ran without a token");
        }
    }
}

/// `sentinel:MASTER:K:MS@URL,URL,…` (see the module docs).
async fn connect_sentinel(
    spec: &str,
    builder: lock_runtime::LockClientBuilder,
) -> Result<LockClient, LockError> {
    let (head, urls) = spec.split_once('@').expect("sentinel:MASTER:K:MS@URLS");
    let parts: Vec<&str> = head.split(':').collect();
    let [master, k, ms] = parts[..] else {
        panic!("sentinel:MASTER:K:MS@URLS, got {spec}");
    };
    let k: usize = k.parse().expect("K");
    let builder = match k {
        0 => builder,
        k => builder.replica_acks(k, Duration::from_millis(ms.parse().expect("MS"))),
    };
    builder.sentinel(urls.split(','), master).await
}

async fn connect(url: &str, settings: Settings) -> LockClient {
    // Redis (or the proxy in front of it) may be faulted right now.
    let mut last = None;
    for _ in 0..60 {
        let builder = LockClient::builder()
            .lease(settings.lease)
            .wait(settings.wait);
        let client = match url.strip_prefix("sentinel:") {
            Some(spec) => connect_sentinel(spec, builder).await,
            None => builder.connect(url).await,
        };
        match client {
            Ok(c) => return c,
            Err(e) => {
                last = Some(e);
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        }
    }
    panic!("cannot connect to {url}: {last:?}");
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    assert!(
        matches!(args.len(), 7 | 8),
        "usage: fault_worker LOCK_URL STORE_URL|- PROC_ID KEYS TASKS MODE [SETTINGS]"
    );
    let settings = Settings::parse(args.get(7).map(String::as_str));
    let (lock_url, store_url) = (args[1].clone(), args[2].clone());
    let proc_id: u32 = args[3].parse().expect("PROC_ID");
    let keys: Vec<String> = args[4].split(',').map(str::to_owned).collect();
    let tasks: usize = args[5].parse().expect("TASKS");
    let mode = args[6].clone();
    assert!(
        matches!(mode.as_str(), "manual" | "attr" | "mixed"),
        "MODE: manual, attr or mixed"
    );

    // stdin: `stop`, then end of input.
    let stop = Arc::new(AtomicBool::new(false));
    let (eof_tx, eof_rx) = tokio::sync::oneshot::channel::<()>();
    {
        let stop = stop.clone();
        std::thread::spawn(move || {
            for line in std::io::stdin().lock().lines() {
                match line {
                    Ok(l) if l.trim() == "stop" => stop.store(true, Ordering::SeqCst),
                    Ok(_) => {}
                    Err(_) => break,
                }
            }
            stop.store(true, Ordering::SeqCst);
            let _ = eof_tx.send(());
        });
    }

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async move {
        let client = connect(&lock_url, settings).await;
        lock_runtime::init(client.clone()).expect("init");
        let store = if store_url == "-" {
            None
        } else {
            Some(
                FencedStore::connect(&store_url)
                    .await
                    .expect("connect to the fenced store"),
            )
        };
        let ctx = Arc::new(Ctx {
            rec: Recorder::stdout(proc_id),
            store,
            proc_id,
            settings,
        });
        let next_op = Arc::new(AtomicU64::new(1));
        let handles: Vec<_> = (0..tasks)
            .map(|_| {
                let (client, ctx, keys, stop, next_op, mode) = (
                    client.clone(),
                    ctx.clone(),
                    keys.clone(),
                    stop.clone(),
                    next_op.clone(),
                    mode.clone(),
                );
                tokio::spawn(async move {
                    while !stop.load(Ordering::SeqCst) {
                        let key = &keys[fastrand::usize(..keys.len())];
                        let op = next_op.fetch_add(1, Ordering::Relaxed);
                        let attr = match mode.as_str() {
                            "attr" => true,
                            "mixed" => fastrand::bool(),
                            _ => false,
                        };
                        let read = fastrand::u32(..100) < ctx.settings.read_pct;
                        if ctx.settings.permits > 0 {
                            permit_op(&client, &ctx, op, key).await;
                        } else if attr {
                            attr_op(&ctx, op, key, read).await;
                        } else {
                            manual_op(&client, &ctx, op, key, read).await;
                        }
                    }
                })
            })
            .collect();
        for h in handles {
            h.await.expect("worker task panicked");
        }
        println!("I {}", client.held_count());
        let _ = eof_rx.await;
    });
}
