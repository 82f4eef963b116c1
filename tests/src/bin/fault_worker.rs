//! A lock client process for the fault suite (`tests/tests/fault_suite.rs`).
//!
//! `fault_worker LOCK_URL STORE_URL|- PROC_ID KEYS TASKS MODE`
//!
//! Runs `TASKS` tasks that loop over: pick one of the comma-separated `KEYS`,
//! acquire it (lease 1 s, wait 2 s), write the fence to the fenced store
//! (`-`: no store), sometimes hold it a while (a target for SIGSTOP), write
//! again, release. `MODE` is `manual` (`client.lock`), `attr`
//! (`#[distributed_lock]`) or `mixed` (a coin per op). One op in
//! `READ_ONE_IN` takes the read lock instead (`read_lock`, `mode = "read"`):
//! it shares the key with other readers, writes nothing, and holds it the
//! same way, so the checker sees readers overlap each other and never a
//! writer. Every step is printed
//! as a history line (`tests::history`), stamped with `CLOCK_MONOTONIC`;
//! `E <message>` lines describe errors.
//!
//! Control on stdin: `stop` (or end of input) stops starting new ops; when
//! every task has finished, the worker prints `I <locks still renewed>` and
//! waits for the end of stdin to exit, so the test can watch an idle client.

use std::io::BufRead;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use lock_runtime::{distributed_lock, LockClient, LockError};
use tests::fenced::{FencedStore, Write};
use tests::history::{Kind, Recorder};

/// The lease every holder uses (the attribute below says the same).
const LEASE: Duration = Duration::from_secs(1);
const WAIT: Duration = Duration::from_secs(2);
/// One op in this many is a reader.
const READ_ONE_IN: u32 = 4;
/// One op in this many holds its lock for a while.
const LONG_HOLD_ONE_IN: u32 = 40;

struct Ctx {
    rec: Recorder,
    store: Option<FencedStore>,
    proc_id: u32,
}

fn error_line(what: &str, e: &dyn std::fmt::Display) {
    let msg = e.to_string().replace('\n', " ");
    println!("E {what}: {msg}");
}

/// The holder's work: fenced writes (none for a reader), sometimes a long
/// hold between them.
async fn work(ctx: &Ctx, op: u64, key: &str, fence: u64, read: bool) {
    if !read {
        write(ctx, op, key, fence).await;
    }
    if fastrand::u32(..LONG_HOLD_ONE_IN) == 0 {
        let ms = fastrand::u64(80..200);
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

async fn manual_op(client: &LockClient, ctx: &Ctx, op: u64, key: &str, read: bool) {
    ctx.rec.record(op, key, Kind::Attempt);
    let request = if read {
        client.read_lock(key)
    } else {
        client.write_lock(key)
    };
    match request.lease(LEASE).wait(WAIT).await {
        Ok(guard) => {
            let fence = guard.fence();
            ctx.rec.record(op, key, acquired(fence, read));
            let lost = guard.lost();
            let finished = tokio::select! {
                biased;
                () = lost => false,
                () = work(ctx, op, key, fence, read) => true,
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
        Err(LockError::Timeout { .. }) => ctx.rec.record(op, key, Kind::Timeout),
        Err(e) => {
            ctx.rec.record(op, key, Kind::Failed);
            error_line("acquire", &e);
            tokio::time::sleep(Duration::from_millis(fastrand::u64(20..60))).await;
        }
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

async fn attr_op(ctx: &Ctx, op: u64, key: &str, read: bool) {
    ctx.rec.record(op, key, Kind::Attempt);
    let out = if read {
        attributed_read(key, op, ctx).await
    } else {
        attributed(key, op, ctx).await
    };
    match out {
        Ok(()) => {}
        // The body was stopped: the lock was lost while it ran.
        Err(OpError::Lock(LockError::Lost { .. })) => ctx.rec.record(op, key, Kind::Lost),
        Err(OpError::Lock(LockError::Timeout { .. })) => ctx.rec.record(op, key, Kind::Timeout),
        Err(e) => {
            ctx.rec.record(op, key, Kind::Failed);
            error_line("attributed acquire", &format!("{e:?}"));
            tokio::time::sleep(Duration::from_millis(fastrand::u64(20..60))).await;
        }
    }
}

async fn connect(url: &str) -> LockClient {
    // Redis (or the proxy in front of it) may be faulted right now.
    let mut last = None;
    for _ in 0..60 {
        match LockClient::builder()
            .lease(LEASE)
            .wait(WAIT)
            .connect(url)
            .await
        {
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
    assert_eq!(
        args.len(),
        7,
        "usage: fault_worker LOCK_URL STORE_URL|- PROC_ID KEYS TASKS MODE"
    );
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
        let client = connect(&lock_url).await;
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
                        let read = fastrand::u32(..READ_ONE_IN) == 0;
                        if attr {
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
