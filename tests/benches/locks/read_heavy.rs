//! Case 8: read-heavy work on one hot key: 64 tasks taking its read lock
//! against the same tasks taking its exclusive lock, and how long a writer
//! waits while readers keep overlapping.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::report::Report;
use crate::stats::{fmt_count, fmt_opt, ratio, Samples};
use crate::throughput::run_tasks;
use crate::Ctx;

/// The body each holder runs: reading a document, say.
const BODY: Duration = Duration::from_millis(1);
const WAIT: Duration = Duration::from_secs(60);

pub fn run(ctx: &Ctx, report: &mut Report) {
    let warm = Duration::from_millis(500);
    let window = Duration::from_secs(if ctx.quick { 1 } else { 3 });
    let port = ctx.server.port();
    let ours = ctx.ours.clone();

    let cycle = |read: bool, tag: &'static str| {
        let ours = ours.clone();
        move |_t: usize, _k: u64| {
            let ours = ours.clone();
            async move {
                let key = format!("c8:{tag}");
                let request = if read {
                    ours.read_lock(key)
                } else {
                    ours.write_lock(key)
                };
                let guard = request.wait(WAIT).await.expect("lock");
                tokio::time::sleep(BODY).await;
                guard.release().await.expect("release");
            }
        }
    };
    let readers = ctx
        .rt
        .block_on(run_tasks(port, warm, window, cycle(true, "read")));
    let exclusive = ctx
        .rt
        .block_on(run_tasks(port, warm, window, cycle(false, "write")));

    // 63 readers overlapping without pause, and one writer every 20 ms:
    // with writers not preferred it would wait for a gap that never comes.
    let waits = Arc::new(Mutex::new(Samples::with_capacity(256)));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (ours, waits, stop) = (ours.clone(), waits.clone(), stop.clone());
        ctx.rt.spawn(async move {
            tokio::time::sleep(warm).await;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let asked = Instant::now();
                let guard = ours
                    .write_lock("c8:mixed")
                    .wait(WAIT)
                    .await
                    .expect("writer");
                waits.lock().unwrap().push(asked.elapsed());
                tokio::time::sleep(BODY).await;
                guard.release().await.expect("writer release");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    let mixed_readers = {
        let ours = ours.clone();
        ctx.rt.block_on(run_tasks(port, warm, window, move |t, _k| {
            let ours = ours.clone();
            async move {
                if t == 0 {
                    // The writer's slot.
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    return;
                }
                let guard = ours.read_lock("c8:mixed").wait(WAIT).await.expect("reader");
                tokio::time::sleep(BODY).await;
                guard.release().await.expect("reader release");
            }
        }))
    };
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    ctx.rt.block_on(writer).expect("writer task");
    let waits = waits.lock().unwrap().clone();
    let longest = waits.pct(100.0);

    report.heading("Case 8 — read-heavy: one hot key, read locks vs the exclusive lock");
    report.para(&format!(
        "64 tasks on one key, each cycle: lock, a {} ms body (`tokio::time::sleep`), release; {}-s window after \
         {} ms warm-up. Readers share the key, so their cycles overlap; exclusive holders take turns through the \
         queue. Then 63 tasks read without pause while one task takes the write lock every 20 ms: its wait is how \
         long a writer is held up by a stream of overlapping readers (new readers queue behind a waiting writer).",
        BODY.as_millis(),
        window.as_secs(),
        warm.as_millis(),
    ));
    report.table(
        &[
            "64 tasks, one key",
            "cycles/s",
            "÷ exclusive",
            "Redis CPU / cycle",
        ],
        &[
            vec![
                "read lock".into(),
                fmt_count(readers.per_sec),
                ratio(readers.per_sec, exclusive.per_sec),
                format!("{:.1} µs", readers.redis_cpu * 1e6),
            ],
            vec![
                "exclusive lock".into(),
                fmt_count(exclusive.per_sec),
                "1.00×".into(),
                format!("{:.1} µs", exclusive.redis_cpu * 1e6),
            ],
            vec![
                "63 readers + 1 writer every 20 ms (reader cycles)".into(),
                fmt_count(mixed_readers.per_sec),
                ratio(mixed_readers.per_sec, exclusive.per_sec),
                format!("{:.1} µs", mixed_readers.redis_cpu * 1e6),
            ],
        ],
    );
    report.table(
        &[
            "writer among 63 overlapping readers",
            "writes",
            "wait p50",
            "wait p99",
            "longest",
        ],
        &[vec![
            "write lock, wait for the readers in before it".into(),
            waits.len().to_string(),
            fmt_opt(waits.p50()),
            fmt_opt(waits.p99()),
            fmt_opt(longest),
        ]],
    );
    // Our own bars: sharing must pay off many times over on a 1 ms body,
    // and a writer must never wait for a gap in the readers (starvation),
    // only for the readers already in.
    let shared = readers.per_sec / exclusive.per_sec.max(1.0);
    report.target(
        "8",
        "read locks ÷ exclusive, 64 tasks on one key, 1 ms body: ≥ 10×",
        format!("{shared:.1}×"),
        Some(shared >= 10.0),
    );
    report.why(format!(
        "readers reached {} cycles/s at {:.1} µs of Redis CPU each: Redis-bound below 64 tasks × 1 ms",
        fmt_count(readers.per_sec),
        readers.redis_cpu * 1e6
    ));
    let limit = Duration::from_millis(50);
    report.target(
        "8",
        "longest writer wait among 63 overlapping readers: ≤ 50 ms",
        fmt_opt(longest),
        longest.map(|l| Duration::from_nanos(l) <= limit),
    );
    report.why(format!(
        "p50 {} over {} writes: the longest wait is an outlier of the machine, not starvation, when p50 is a few ms",
        fmt_opt(waits.p50()),
        waits.len()
    ));
}
