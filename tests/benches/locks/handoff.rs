//! Case 4: contended hand-off. 16 tasks on one key, each holding ~1 ms; the
//! time from just before a holder calls release to the next holder's body
//! starting.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::python;
use crate::report::Report;
use crate::stats::{fmt_ns, fmt_opt, Samples};
use crate::Ctx;

const TASKS: usize = 16;
const HOLD: Duration = Duration::from_millis(1);

/// Releases the lock it was made from.
type Release = Pin<Box<dyn Future<Output = ()> + Send>>;

struct Shared {
    epoch: Instant,
    /// When the last holder was about to release (ns since `epoch`, 0: never).
    released_at: AtomicU64,
    /// Bumped by every holder when its body starts.
    generation: watch::Sender<u64>,
    samples: Mutex<Samples>,
    holds: Mutex<Samples>,
}

/// Run `TASKS` tasks against one lock until `window` is over. `acquire`
/// waits for the lock and returns the future that releases it.
async fn contend<A, Fut>(window: Duration, acquire: A) -> (Samples, Samples)
where
    A: Fn() -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Release> + Send,
{
    let shared = Arc::new(Shared {
        epoch: Instant::now(),
        released_at: AtomicU64::new(0),
        generation: watch::channel(0).0,
        samples: Mutex::new(Samples::default()),
        holds: Mutex::new(Samples::default()),
    });
    let deadline = tokio::time::Instant::now() + window;
    let mut handles = Vec::new();
    for _ in 0..TASKS {
        let (shared, acquire) = (shared.clone(), acquire.clone());
        handles.push(tokio::spawn(async move {
            let mut seen = shared.generation.subscribe();
            while tokio::time::Instant::now() < deadline {
                let release = acquire().await;
                let started = shared.epoch.elapsed().as_nanos() as u64;
                let prev = shared.released_at.load(Ordering::SeqCst);
                if prev != 0 {
                    shared
                        .samples
                        .lock()
                        .unwrap()
                        .push_ns(started.saturating_sub(prev));
                }
                let mine = shared.generation.send_modify_return(|g| *g += 1);
                tokio::time::sleep(HOLD).await;
                let at = shared.epoch.elapsed().as_nanos() as u64;
                shared.holds.lock().unwrap().push_ns(at - started);
                shared.released_at.store(at, Ordering::SeqCst);
                release.await;
                // Back of the queue: ask again once someone else has had it.
                tokio::select! {
                    _ = seen.wait_for(|g| *g > mine) => {}
                    _ = tokio::time::sleep_until(deadline) => {}
                }
            }
        }));
    }
    for h in handles {
        h.await.expect("hand-off task panicked");
    }
    let shared = Arc::try_unwrap(shared).ok().expect("tasks are done");
    (
        shared.samples.into_inner().unwrap(),
        shared.holds.into_inner().unwrap(),
    )
}

trait SendModifyReturn {
    fn send_modify_return(&self, f: impl FnOnce(&mut u64)) -> u64;
}

impl SendModifyReturn for watch::Sender<u64> {
    fn send_modify_return(&self, f: impl FnOnce(&mut u64)) -> u64 {
        let mut out = 0;
        self.send_modify(|g| {
            f(g);
            out = *g;
        });
        out
    }
}

struct Row {
    name: String,
    wakeup: String,
    samples: Samples,
    holds: Samples,
}

#[allow(clippy::async_yields_async)] // each acquire yields its release future
pub fn run(ctx: &Ctx, report: &mut Report) {
    let fast = Duration::from_secs(if ctx.quick { 2 } else { 4 });
    let slow = Duration::from_secs(if ctx.quick { 3 } else { 8 });
    let mut rows = Vec::new();

    let ours = ctx.ours.clone();
    let (s, h) = ctx.rt.block_on(contend(fast, move || {
        let ours = ours.clone();
        async move {
            let guard = ours
                .lock("c4:ours")
                .wait(Duration::from_secs(60))
                .await
                .expect("lock");
            Box::pin(async move { guard.release().await.expect("release") }) as Release
        }
    }));
    rows.push(Row {
        name: "ours".into(),
        wakeup: "pub/sub release message (fallback retry ≤ 1 s + 0–50 ms jitter)".into(),
        samples: s,
        holds: h,
    });

    let mgr = ctx.rslock.clone();
    let (s, h) = ctx.rt.block_on(contend(slow, move || {
        let mgr = mgr.clone();
        async move {
            let guard = mgr
                .acquire("c4:rslock", Duration::from_secs(30))
                .await
                .expect("rslock acquire");
            Box::pin(guard.release()) as Release
        }
    }));
    rows.push(Row {
        name: "rslock".into(),
        wakeup: "polling, defaults: `acquire` loops `lock()`, which tries 3 times with a random 0–200 ms pause in between".into(),
        samples: s,
        holds: h,
    });

    let mut py_err = None;
    if let Some(p) = &ctx.py {
        match p.run(
            ctx.server.port(),
            "handoff",
            &[
                ("tasks", TASKS.to_string()),
                ("seconds", slow.as_secs_f64().to_string()),
                ("hold-ms", (HOLD.as_secs_f64() * 1000.0).to_string()),
                ("tag", "c4:py".into()),
            ],
        ) {
            Ok(v) => rows.push(Row {
                name: p.describe.clone(),
                wakeup: "polling, default `sleep=0.1` (100 ms) between attempts; 16 threads".into(),
                samples: python::samples(&v, "samples_ns"),
                holds: python::samples(&v, "holds_ns"),
            }),
            Err(e) => py_err = Some(e),
        }
    }

    if std::env::var_os("LOCKBENCH_DEBUG").is_some() {
        for r in &rows {
            let q = |p: f64| fmt_opt(r.samples.pct(p));
            eprintln!(
                "{}: p10 {} p25 {} p50 {} p75 {} p90 {} p95 {} p98 {} p99 {} p99.9 {} max {}",
                r.name,
                q(0.10),
                q(0.25),
                q(0.5),
                q(0.75),
                q(0.9),
                q(0.95),
                q(0.98),
                q(0.99),
                q(0.999),
                q(1.0)
            );
        }
    }
    report.heading("Case 4 — contended hand-off: 16 tasks on one key, each holding ~1 ms");
    report.para(&format!(
        "Hand-off = from just before the holder calls release to the next holder's body starting (one monotonic \
         clock shared by the tasks; for redis-py, by the threads inside the Python process). A task that released \
         asks again only after another task has held the lock, so every hand-off goes to a waiter. Ours: {}-s run; \
         polling contenders: {}-s runs, each with its library's default retry timing.",
        fast.as_secs(),
        slow.as_secs()
    ));
    let ours_p50 = rows[0].samples.p50().unwrap_or(0) as f64;
    let ours_p99 = rows[0].samples.p99().unwrap_or(0) as f64;
    let table: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            let x = |a: Option<u64>, b: f64| {
                a.map_or("n/a".into(), |a| format!("{:.0}×", a as f64 / b.max(1.0)))
            };
            vec![
                r.name.clone(),
                r.wakeup.clone(),
                r.samples.len().to_string(),
                fmt_opt(r.samples.p50()),
                fmt_opt(r.samples.p99()),
                format!(
                    "{} / {}",
                    x(r.samples.p50(), ours_p50),
                    x(r.samples.p99(), ours_p99)
                ),
                r.holds.mean().map_or("n/a".into(), |m| fmt_ns(m as u64)),
            ]
        })
        .collect();
    report.table(
        &[
            "contender",
            "wake-up",
            "hand-offs",
            "p50",
            "p99",
            "÷ ours (p50 / p99)",
            "mean hold",
        ],
        &table,
    );
    if let Some(e) = py_err {
        report.para(&format!("redis-py: {e}"));
    } else if ctx.py.is_none() {
        report.para("redis-py: not installed.");
    }

    report.target(
        "4",
        "ours hand-off p99 ≤ 2 ms",
        fmt_opt(rows[0].samples.p99()),
        rows[0].samples.p99().map(|p| p <= 2_000_000),
    );
    for r in &rows[1..] {
        for (label, theirs, ours) in [
            ("p50", r.samples.p50(), ours_p50),
            ("p99", r.samples.p99(), ours_p99),
        ] {
            let x = theirs.map(|t| t as f64 / ours.max(1.0));
            report.target(
                "4",
                format!("≥ 20× better than {} ({label})", r.name),
                x.map_or("n/a".into(), |x| {
                    format!("{x:.1}× ({} vs {})", fmt_opt(theirs), fmt_ns(ours as u64))
                }),
                x.map(|x| x >= 20.0),
            );
        }
    }
}
