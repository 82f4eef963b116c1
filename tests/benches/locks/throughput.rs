//! Case 3: throughput of 64 concurrent tasks on distinct keys, against the
//! EVALSHA ceiling `redis-benchmark` reaches on the same server.

use std::future::Future;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::captured::Captured;
use crate::command_costs::CommandCosts;
use crate::fenced_floors::{Floors, Kind};
use crate::latency::{empty_body, rslock_cycle};
use crate::report::Report;
use crate::servers;
use crate::stats::{fmt_count, process_cpu};
use crate::unfenced::{self, unfenced};
use crate::Ctx;

const TASKS: usize = 64;

/// Seconds of CPU the Redis server has used (`INFO cpu`: user + system).
fn redis_cpu(port: u16) -> f64 {
    servers::server_cpu(&mut servers::conn(port))
}

/// What one contender did in its window.
#[derive(Clone)]
pub(crate) struct Window {
    pub(crate) per_sec: f64,
    /// Redis CPU seconds per cycle.
    pub(crate) redis_cpu: f64,
    /// This process's CPU seconds per cycle (`getrusage`).
    pub(crate) client_cpu: f64,
    pub(crate) cycles: u64,
    /// `INFO commandstats` over the window.
    pub(crate) costs: CommandCosts,
}

/// Cycles per second of `TASKS` tasks running `op(task, k)` back to back,
/// and the Redis CPU each cycle cost over the same window.
pub(crate) async fn run_tasks<F, Fut>(port: u16, warm: Duration, window: Duration, op: F) -> Window
where
    F: Fn(usize, u64) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    run_n_tasks(port, TASKS, warm, window, op).await
}

/// [`run_tasks`] with `tasks` tasks instead of `TASKS`.
pub(crate) async fn run_n_tasks<F, Fut>(
    port: u16,
    tasks: usize,
    warm: Duration,
    window: Duration,
    op: F,
) -> Window
where
    F: Fn(usize, u64) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let done = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let mut handles = Vec::new();
    for t in 0..tasks {
        let (done, stop, op) = (done.clone(), stop.clone(), op.clone());
        handles.push(tokio::spawn(async move {
            let mut k = 0;
            while !stop.load(Ordering::Relaxed) {
                op(t, k).await;
                k += 1;
                done.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    tokio::time::sleep(warm).await;
    let cpu0 = redis_cpu(port);
    let costs0 = CommandCosts::read(&mut servers::conn(port));
    let (c0, t0, p0) = (done.load(Ordering::Relaxed), Instant::now(), process_cpu());
    tokio::time::sleep(window).await;
    let (c1, t1, p1) = (done.load(Ordering::Relaxed), Instant::now(), process_cpu());
    let costs1 = CommandCosts::read(&mut servers::conn(port));
    let cpu1 = redis_cpu(port);
    stop.store(true, Ordering::Relaxed);
    for h in handles {
        h.await.expect("throughput task panicked");
    }
    Window {
        per_sec: (c1 - c0) as f64 / (t1 - t0).as_secs_f64(),
        redis_cpu: (cpu1 - cpu0) / (c1 - c0).max(1) as f64,
        client_cpu: p1.saturating_sub(p0).as_secs_f64() / (c1 - c0).max(1) as f64,
        cycles: c1 - c0,
        costs: costs1.since(&costs0),
    }
}

/// `redis-benchmark` of our client's acquire (`EVALSHA` of the acquire
/// script, as captured) on random fresh keys, `TASKS` connections: requests
/// per second.
fn redis_benchmark(port: u16, acquire: &Captured, requests: u64) -> Result<f64, String> {
    let out = Command::new("redis-benchmark")
        .args([
            "-h",
            "127.0.0.1",
            "-p",
            &port.to_string(),
            "-c",
            &TASKS.to_string(),
        ])
        .args(["-n", &requests.to_string(), "-r", "100000000", "--csv"])
        .args(acquire.args_for("rb:__rand_int__"))
        .output()
        .map_err(|e| format!("cannot run redis-benchmark (apt-get install redis-tools): {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    // "test","rps",… then "EVALSHA …","84245.99",…
    text.lines()
        .filter(|l| {
            l.to_uppercase()
                .starts_with(&format!("\"{}", acquire.name()))
        })
        .find_map(|l| {
            l.split("\",\"")
                .nth(1)?
                .trim_matches('"')
                .parse::<f64>()
                .ok()
        })
        .ok_or_else(|| {
            format!(
                "unexpected redis-benchmark output: {text} {}",
                String::from_utf8_lossy(&out.stderr)
            )
        })
}

pub fn run(ctx: &Ctx, report: &mut Report) {
    let rounds = if ctx.quick { 1 } else { 2 };
    let warm = Duration::from_millis(500);
    let window = Duration::from_secs(if ctx.quick { 1 } else { 3 });
    let bench_requests = if ctx.quick { 50_000 } else { 200_000 };
    let port = ctx.server.port();

    let mut ceiling = Vec::new();
    let mut bench_err = None;
    let (mut manual, mut attr, mut rs, mut py) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let has_unfenced = unfenced::available(&ctx.ours);
    let mut bare = Vec::new();
    let mut py_err = None;
    let attr_ok = ctx.rt.block_on(empty_body(u64::MAX - 1)).unwrap_or(false);
    let floors = ctx.rt.block_on(Floors::connect(port));
    let mut fenced_floors: Vec<Vec<Window>> = vec![Vec::new(); Kind::ALL.len()];
    for r in 0..rounds {
        match redis_benchmark(port, &ctx.acquire, bench_requests) {
            Ok(x) => ceiling.push(x),
            Err(e) => bench_err = Some(e),
        }
        let ours = ctx.ours.clone();
        manual.push(ctx.rt.block_on(run_tasks(port, warm, window, move |t, k| {
            let ours = ours.clone();
            async move {
                let guard = ours
                    .lock(format!("c3:manual:{r}:{t}:{k}"))
                    .await
                    .expect("lock");
                guard.release().await.expect("release");
            }
        })));
        if has_unfenced {
            let ours = ctx.ours.clone();
            bare.push(ctx.rt.block_on(run_tasks(port, warm, window, move |t, k| {
                let request = unfenced(ours.lock(format!("c3:bare:{r}:{t}:{k}")));
                async move {
                    let request = request.expect("unfenced locks in this build");
                    let guard = request.await.expect("lock");
                    guard.release().await.expect("release");
                }
            })));
        }
        if attr_ok {
            attr.push(
                ctx.rt
                    .block_on(run_tasks(port, warm, window, move |t, k| async move {
                        empty_body(((r as u64 * 1000 + t as u64) << 32) + k + (1 << 62))
                            .await
                            .expect("attribute");
                    })),
            );
        }
        let mgr = ctx.rslock.clone();
        rs.push(ctx.rt.block_on(run_tasks(port, warm, window, move |t, k| {
            let mgr = mgr.clone();
            async move { rslock_cycle(&mgr, &format!("c3:rslock:{r}:{t}"), k).await }
        })));
        for (i, kind) in Kind::ALL.into_iter().enumerate() {
            let floors = floors.clone();
            fenced_floors[i].push(ctx.rt.block_on(run_tasks(port, warm, window, move |t, k| {
                let floors = floors.clone();
                async move {
                    let key = format!("c3:floor{i}:{r}:{t}:{k}");
                    floors.cycle(kind, &key, &key).await
                }
            })));
        }
        if let Some(p) = &ctx.py {
            match p.run(
                port,
                "throughput",
                &[
                    ("tasks", TASKS.to_string()),
                    ("seconds", window.as_secs_f64().to_string()),
                    ("warmup-seconds", warm.as_secs_f64().to_string()),
                    ("tag", format!("c3:py:{r}")),
                ],
            ) {
                Ok(v) => {
                    let ops = v["ops"].as_f64().unwrap_or(0.0);
                    let secs = v["seconds"].as_f64().unwrap_or(f64::NAN);
                    py.push(ops / secs);
                }
                Err(e) => py_err = Some(e),
            }
        }
    }
    // Keep the server small for the cases after this one.
    let _: () = redis::cmd("FLUSHALL")
        .query(&mut ctx.server.conn())
        .expect("FLUSHALL");

    let mean = |v: &[f64]| (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64);
    let rate = |v: &[Window]| v.iter().map(|w| w.per_sec).collect::<Vec<f64>>();
    let cpu_us = |v: &[Window]| mean(&v.iter().map(|w| w.redis_cpu * 1e6).collect::<Vec<f64>>());
    let client_us =
        |v: &[Window]| mean(&v.iter().map(|w| w.client_cpu * 1e6).collect::<Vec<f64>>());
    let (manual_cpu, attr_cpu, rs_cpu, bare_cpu) =
        (cpu_us(&manual), cpu_us(&attr), cpu_us(&rs), cpu_us(&bare));
    let (manual_client, attr_client, rs_client, bare_client) = (
        client_us(&manual),
        client_us(&attr),
        client_us(&rs),
        client_us(&bare),
    );
    // What each cycle ran, in the first round.
    let commands = |v: &[Window]| {
        v.first()
            .map_or("n/a".into(), |w| w.costs.per_cycle(w.cycles))
    };
    let (manual_commands, rs_commands) = (commands(&manual), commands(&rs));
    let (manual, attr, rs, bare) = (rate(&manual), rate(&attr), rate(&rs), rate(&bare));
    let ceil = mean(&ceiling);
    let half = ceil.map(|c| c / 2.0);
    let rs_rate = mean(&rs);
    let us = |c: Option<f64>| c.map_or_else(|| "n/a".into(), |c| format!("{c:.1} µs"));
    let row = |name: &str, v: &[f64], cpu: Option<f64>, client: Option<f64>| -> Vec<String> {
        match mean(v) {
            Some(x) => vec![
                name.into(),
                fmt_count(x),
                half.map_or_else(|| "n/a".into(), |h| format!("{:.0} %", 100.0 * x / h)),
                rs_rate.map_or_else(|| "n/a".into(), |r| format!("{:.2}×", x / r)),
                us(cpu),
                us(client),
            ],
            None => vec![
                name.into(),
                "n/a".into(),
                "n/a".into(),
                "n/a".into(),
                "n/a".into(),
                "n/a".into(),
            ],
        }
    };
    report.heading("Case 3 — throughput, 64 concurrent tasks on distinct keys");
    report.para(&format!(
        "Lock + unlock cycles per second, a fresh key per cycle, {}-s window after {} ms warm-up, mean of {rounds} \
         round(s) interleaved across contenders. Ceiling: `redis-benchmark -c 64 -r 100000000 EVALSHA <acquire \
         script> …` on random fresh keys against the same server, in the same rounds; a cycle is two EVALSHAs, so \
         the column compares with half the ceiling. All Rust contenders run in one tokio runtime with {} worker \
         threads; ours sends from the caller's task over one multiplexed connection (its driver on the client's I/O \
         thread), rslock over one multiplexed connection; redis-py uses 64 threads and a connection pool.",
        window.as_secs(),
        warm.as_millis(),
        ctx.workers
    ));
    let mut rows = vec![
        match (ceil, &bench_err) {
            (Some(c), _) => vec![
                "`redis-benchmark` EVALSHA acquire (ceiling, requests/s)".into(),
                fmt_count(c),
                "200 %".into(),
                "—".into(),
                "—".into(),
                "—".into(),
            ],
            (None, e) => vec![
                format!("redis-benchmark: {}", e.clone().unwrap_or_default()),
                "n/a".into(),
                "n/a".into(),
                "—".into(),
                "—".into(),
                "—".into(),
            ],
        },
        row("ours, manual API", &manual, manual_cpu, manual_client),
        if has_unfenced {
            row(
                "ours, unfenced (`fence(false)`)",
                &bare,
                bare_cpu,
                bare_client,
            )
        } else {
            let mut r = vec![
                "ours, unfenced (`fence(false)`)".into(),
                unfenced::MISSING.into(),
            ];
            r.extend(std::iter::repeat_n(String::new(), 4));
            r
        },
        if attr_ok {
            row(
                "ours, `#[distributed_lock]` empty body",
                &attr,
                attr_cpu,
                attr_client,
            )
        } else {
            let mut r = vec!["ours, `#[distributed_lock]` (does not lock yet)".to_owned()];
            r.extend(std::iter::repeat_n("n/a".to_owned(), 5));
            r
        },
        row("rslock", &rs, rs_cpu, rs_client),
    ];
    for (kind, windows) in Kind::ALL.into_iter().zip(&fenced_floors) {
        rows.push(row(
            kind.describe(),
            &rate(windows),
            cpu_us(windows),
            client_us(windows),
        ));
    }
    let na = |name: String| {
        let mut r = vec![name];
        r.extend(std::iter::repeat_n("n/a".to_owned(), 5));
        r
    };
    match (&ctx.py, &py_err) {
        (Some(p), None) => rows.push(row(&p.describe, &py, None, None)),
        (_, Some(e)) => rows.push(na(format!("redis-py: {e}"))),
        (None, None) => rows.push(na("redis-py: not installed".into())),
    }
    report.table(
        &[
            "contender",
            "cycles / s",
            "of EVALSHA ceiling ÷ 2",
            "÷ rslock",
            "Redis CPU / cycle",
            "client CPU / cycle",
        ],
        &rows,
    );
    report.para(
        "Redis CPU / cycle: the server's user + system CPU time (`INFO cpu`) over the contender's window, divided by \
         the cycles in it. The contenders share this machine's cores with the server, so where the server is busy \
         most of the window this column, not the client, sets the throughput. Client CPU / cycle: this bench \
         process's user + system CPU (`getrusage(RUSAGE_SELF)`) over the same window ÷ cycles (the Rust contenders \
         run one at a time; redis-py is another process, not counted). Case 9 has both on Redis and Valkey, \
         fenced and unfenced, fresh and reused keys, with the commands behind them.",
    );
    report.para(
        "The fenced floors are the smallest fenced locks one could write by hand, on one multiplexed \
         connection as rslock uses (`locks/fenced_floors.rs`): each hands out a token with the grant and \
         releases with rslock's compare-and-delete script, and none has a queue, a hand-off, a watchdog or a \
         check against a command sent twice. The first two give tokens from a bare `INCR`: a counter that \
         loses increments (a failover, a restart without persistence) hands out tokens already used, which \
         ours, floored at the server's clock, never does (docs/FENCING.md). The third runs our fenced \
         acquire's commands with nothing checked. They bound what any fenced lock on this server reaches \
         against rslock's unfenced one.",
    );
    let ours = mean(&manual);
    report.target(
        "3",
        "≥ 80 % of (EVALSHA ceiling ÷ 2)",
        match (ours, half) {
            (Some(o), Some(h)) => format!(
                "{:.0} % ({} of {} cycles/s)",
                100.0 * o / h,
                fmt_count(o),
                fmt_count(h)
            ),
            _ => "n/a".into(),
        },
        ours.zip(half).map(|(o, h)| o >= 0.8 * h),
    );
    report.target(
        "3",
        "ours ≥ 1.0 × rslock cycles/s (same run)",
        match (ours, rs_rate) {
            (Some(o), Some(r)) => format!(
                "{:.2}× ({} vs {} cycles/s; Redis CPU per cycle {} vs {})",
                o / r,
                fmt_count(o),
                fmt_count(r),
                manual_cpu.map_or("n/a".into(), |c| format!("{c:.1} µs")),
                rs_cpu.map_or("n/a".into(), |c| format!("{c:.1} µs"))
            ),
            _ => "n/a".into(),
        },
        ours.zip(rs_rate).map(|(o, r)| o >= r),
    );
    // Ours against the fenced floors: what a fenced lock with each token
    // reaches here at all.
    let floor_rate = |kind: Kind| {
        Kind::ALL
            .iter()
            .position(|&k| k == kind)
            .and_then(|i| mean(&rate(&fenced_floors[i])))
    };
    let floors = match (
        ours,
        rs_rate,
        floor_rate(Kind::ClockFloor),
        floor_rate(Kind::Incr),
    ) {
        (Some(o), Some(r), Some(clock), Some(incr)) => format!(
            "Fenced locks by hand reach {:.2}× rslock with our token (floored at the server's clock) and \
             {:.2}× with a bare `INCR` (no floor); ours is {:.2}× the first. ",
            clock / r,
            incr / r,
            o / clock
        ),
        _ => String::new(),
    };
    if let (Some(o), Some(r), Some(oc), Some(rc)) = (ours, rs_rate, manual_cpu, rs_cpu) {
        report.why(format!(
            "the client and Redis share this machine's 2 cores, and Redis does the larger share of the work: \
             it was busy {:.0} % of a core during ours and {:.0} % during rslock's run, \
             and spent {oc:.1} µs of CPU per cycle on ours against {rc:.1} µs on rslock's ({:.2}×). Per \
             cycle, ours ran {manual_commands}; rslock ran {rs_commands} (calls × µs per call, `INFO \
             commandstats`). At rslock's Redis CPU per cycle ours would reach about {} cycles/s ({:.2}× \
             rslock). {floors}What would meet it: Redis work per cycle at rslock's level (case 9 has it \
             fenced and unfenced, on Redis and Valkey), or spreading keys over more Redis cores (Cluster).",
            100.0 * o * oc / 1e6,
            100.0 * r * rc / 1e6,
            oc / rc,
            fmt_count(o * oc / rc),
            o * oc / rc / r
        ));
    }
}
