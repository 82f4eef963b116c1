//! Case 6: one client holding 1k, 10k and 100k locks with a short lease.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lock_runtime::{LockClient, LockGuard};

use crate::monitor::{commandstats_calls, reset_stats};
use crate::proxy::Proxy;
use crate::report::Report;
use crate::stats::{fmt_bytes, fmt_count, heap_live, rss_bytes, thread_cpu, threads_named};
use crate::Ctx;

const LEASE: Duration = Duration::from_secs(3);
/// The watchdog renews every lease/3.
const TICK: Duration = Duration::from_secs(1);
const SETUP_TASKS: usize = 64;

struct Outcome {
    n: usize,
    setup: Duration,
    ticks: u64,
    round_trips: u64,
    evalsha: u64,
    renewed: u64,
    cpu: Duration,
    window: Duration,
    heap_per_lock: f64,
    rss_per_lock: f64,
    lost: usize,
    released: usize,
    release_time: Duration,
}

async fn take_all(client: &LockClient, n: usize, tag: &str) -> Vec<LockGuard> {
    let next = Arc::new(AtomicUsize::new(0));
    let held = Arc::new(Mutex::new(Vec::with_capacity(n)));
    let mut tasks = Vec::new();
    for _ in 0..SETUP_TASKS {
        let (client, next, held, tag) =
            (client.clone(), next.clone(), held.clone(), tag.to_owned());
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    break;
                }
                let g = client
                    .lock(format!("{tag}:{i}"))
                    .lease(LEASE)
                    .await
                    .expect("lock");
                held.lock().unwrap().push(g);
            }
        }));
    }
    for t in tasks {
        t.await.expect("setup task");
    }
    Arc::try_unwrap(held)
        .unwrap_or_else(|_| panic!("setup done"))
        .into_inner()
        .unwrap()
}

async fn release_all(guards: Vec<LockGuard>) -> usize {
    let guards = Arc::new(Mutex::new(guards));
    let ok = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..SETUP_TASKS {
        let (guards, ok) = (guards.clone(), ok.clone());
        tasks.push(tokio::spawn(async move {
            loop {
                let Some(g) = guards.lock().unwrap().pop() else {
                    break;
                };
                if g.release().await.is_ok() {
                    ok.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    for t in tasks {
        t.await.expect("release task");
    }
    ok.load(Ordering::Relaxed)
}

fn one(ctx: &Ctx, n: usize, ticks: u64) -> Outcome {
    let rt = &ctx.rt;
    let mut admin = ctx.server.conn();
    // A proxy with no delay, only to see how many request bursts (round
    // trips) the client sends per tick.
    let proxy = Proxy::start(ctx.server.port(), Duration::ZERO).expect("proxy");
    let before_threads = threads_named("lock-runtime-io");
    let client = rt
        .block_on(LockClient::builder().lease(LEASE).connect(&proxy.url()))
        .expect("connect");
    let io_tid = threads_named("lock-runtime-io")
        .into_iter()
        .find(|t| !before_threads.contains(t))
        .expect("the client's I/O thread");
    // Settle, then the baseline.
    std::thread::sleep(Duration::from_millis(200));
    let (heap0, rss0) = (heap_live(), rss_bytes());

    let t0 = Instant::now();
    let guards = rt.block_on(take_all(&client, n, &format!("c6:{n}")));
    let setup = t0.elapsed();
    assert_eq!(client.held_count(), n);

    // Line the window up with the ticks: wait for one, then start half a
    // tick later, in the quiet between two.
    let b = proxy.bursts();
    let wait_from = Instant::now();
    while proxy.bursts() == b && wait_from.elapsed() < 3 * TICK {
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(TICK / 2);
    reset_stats(&mut admin);
    let (b0, cpu0, w0) = (proxy.bursts(), thread_cpu(io_tid), Instant::now());
    std::thread::sleep(TICK * ticks as u32);
    let (b1, cpu1, window) = (proxy.bursts(), thread_cpu(io_tid), w0.elapsed());
    let evalsha = commandstats_calls(&mut admin, "evalsha");
    let renewed = commandstats_calls(&mut admin, "pexpire");
    let (heap1, rss1) = (heap_live(), rss_bytes());

    let lost = guards.iter().filter(|g| g.is_lost()).count();
    let t1 = Instant::now();
    let released = rt.block_on(release_all(guards));
    let release_time = t1.elapsed();
    drop(client);
    Outcome {
        n,
        setup,
        ticks,
        round_trips: b1 - b0,
        evalsha,
        renewed,
        cpu: cpu1.saturating_sub(cpu0),
        window,
        heap_per_lock: (heap1 - heap0) as f64 / n as f64,
        rss_per_lock: (rss1 as f64 - rss0 as f64) / n as f64,
        lost,
        released,
        release_time,
    }
}

pub fn run(ctx: &Ctx, report: &mut Report) {
    let sizes: &[usize] = if ctx.quick {
        &[1_000, 10_000]
    } else {
        &[1_000, 10_000, 100_000]
    };
    let ticks = if ctx.quick { 3 } else { 6 };
    let outcomes: Vec<Outcome> = sizes.iter().map(|&n| one(ctx, n, ticks)).collect();

    report.heading("Case 6 — watchdog scale: one client holding many locks, 3-s lease");
    report.para(&format!(
        "The client takes N locks (lease {} s, so the watchdog ticks every {} s) with {SETUP_TASKS} concurrent \
         tasks, holds them for a window of {ticks} ticks placed between ticks, then releases them all. Round trips \
         per tick: request bursts the client sent through a zero-delay proxy (a burst = writes with no 100 ms gap), \
         divided by the ticks in the window. EVALSHA and renewals per tick: `INFO commandstats` over the window \
         (`pexpire` runs once per renewed lock inside the renew script). CPU: user + system time of the client's \
         `lock-runtime-io` thread (where the watchdog runs) over the window ÷ the window. Memory: live heap bytes \
         (a counting global allocator) and RSS, after the window minus before the first lock, ÷ N — this includes \
         the `LockGuard` the caller keeps for each lock.",
        LEASE.as_secs(),
        TICK.as_secs()
    ));
    let rows: Vec<Vec<String>> = outcomes
        .iter()
        .map(|o| {
            vec![
                fmt_count(o.n as f64),
                format!("{:.1} s", o.setup.as_secs_f64()),
                format!("{:.2}", o.round_trips as f64 / o.ticks as f64),
                format!("{:.1}", o.evalsha as f64 / o.ticks as f64),
                fmt_count(o.renewed as f64 / o.ticks as f64),
                format!(
                    "{:.2} %",
                    100.0 * o.cpu.as_secs_f64() / o.window.as_secs_f64()
                ),
                fmt_bytes(o.heap_per_lock),
                fmt_bytes(o.rss_per_lock),
                format!(
                    "{} lost, {} of {} released Ok ({:.1} s)",
                    o.lost,
                    o.released,
                    o.n,
                    o.release_time.as_secs_f64()
                ),
            ]
        })
        .collect();
    report.table(
        &[
            "locks held",
            "setup (take all)",
            "round trips / tick",
            "EVALSHA / tick",
            "renewals / tick",
            "I/O thread CPU",
            "heap / lock",
            "RSS / lock",
            "none lost?",
        ],
        &rows,
    );
    report.para(
        "CPU time comes from `/proc/self/task/<tid>/stat` in clock ticks (10 ms), so shares under ~0.3 % of a \
         6-s window read as 0.",
    );
    for o in &outcomes {
        let rtt = o.round_trips as f64 / o.ticks as f64;
        let cpu = o.cpu.as_secs_f64() / o.window.as_secs_f64();
        let mem = o.heap_per_lock.max(o.rss_per_lock);
        report.target(
            "6",
            format!("{}: one pipelined round trip per tick, < 5 % of a core, < 1 KiB per lock, none lost", fmt_count(o.n as f64)),
            format!(
                "{rtt:.2} RT/tick, {:.2} % CPU, {} heap / {} RSS per lock, {} lost, {}/{} released",
                100.0 * cpu,
                fmt_bytes(o.heap_per_lock),
                fmt_bytes(o.rss_per_lock),
                o.lost,
                o.released,
                o.n
            ),
            Some((rtt - 1.0).abs() < 0.01 && cpu < 0.05 && mem < 1024.0 && o.lost == 0 && o.released == o.n),
        );
        let per_renewal = o.cpu.as_secs_f64() / (o.ticks as f64 * o.n as f64);
        let mut why = Vec::new();
        if cpu >= 0.05 {
            why.push(format!(
                "with a {:.0}-s lease the watchdog renews all {} locks every second: {:.2} µs of I/O-thread CPU \
                 per renewal (building the script call's keys and owner ids, reading the replies, moving each \
                 deadline); the CPU reading has a 10 ms grain, ±{:.2} points over this window. What would meet \
                 it: fewer bytes per renewal (a server-side set of the client's locks renewed by one call, at the \
                 cost of tracking it in Redis), or a lease of {:.1} s or more, which renews proportionally less often",
                LEASE.as_secs_f64(),
                fmt_count(o.n as f64),
                per_renewal * 1e6,
                100.0 * 0.01 / o.window.as_secs_f64(),
                LEASE.as_secs_f64() * cpu / 0.05
            ));
        }
        if mem >= 1024.0 {
            why.push(format!(
                "{} heap and {} RSS per lock: the heap figure is what the lock costs (the caller's guard, the \
                 hold, its watchdog entry and names); RSS also moves with whole pages and allocator arenas, which \
                 weigh most when few locks are held. What would meet it: a smaller hold (fewer per-lock fields, \
                 names shared with the watchdog entry)",
                fmt_bytes(o.heap_per_lock),
                fmt_bytes(o.rss_per_lock),
            ));
        }
        if !why.is_empty() {
            report.why(why.join("; "));
        }
    }
}
