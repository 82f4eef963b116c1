//! Case 9: what a lock + unlock cycle costs the server and the client, ours
//! (fenced and unfenced) against rslock, on Redis and on Valkey, on fresh
//! keys and on one key per task reused: server CPU (`INFO cpu`), the
//! commands behind it (`INFO commandstats`), and the bench process's own
//! CPU (`getrusage`), each over one contender's window.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lock_runtime::LockClient;

use crate::command_costs::CommandCosts;
use crate::report::Report;
use crate::servers;
use crate::stats::{fmt_count, process_cpu, ratio};
use crate::unfenced::{self, unfenced};
use crate::Ctx;

const TASKS: usize = 64;
const LEASE: Duration = Duration::from_secs(30);

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Keys {
    /// A new key name every cycle.
    Fresh,
    /// One key per task, locked again every cycle (64 keys).
    Reused,
}

impl Keys {
    fn label(self) -> &'static str {
        match self {
            Keys::Fresh => "fresh keys",
            Keys::Reused => "one key per task, reused",
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Who {
    Fenced,
    Unfenced,
    Rslock,
}

impl Who {
    fn label(self) -> &'static str {
        match self {
            Who::Fenced => "ours, fenced (default)",
            Who::Unfenced => "ours, `fence(false)`",
            Who::Rslock => "rslock",
        }
    }

    fn tag(self) -> &'static str {
        match self {
            Who::Fenced => "f",
            Who::Unfenced => "u",
            Who::Rslock => "r",
        }
    }
}

/// A server (by index), a key pattern and a contender.
type Cell = (usize, Keys, Who);

/// One server and the contenders connected to it.
struct Server {
    /// `Redis 7.0.15`.
    name: String,
    port: u16,
    ours: LockClient,
    rslock: rslock::LockManager,
}

/// What one contender did, summed over its windows.
#[derive(Default, Clone)]
pub struct Measure {
    pub cycles: u64,
    pub secs: f64,
    /// Server CPU seconds.
    pub server_cpu: f64,
    /// This process's CPU.
    pub client_cpu: Duration,
    /// The server's socket reads and writes.
    pub reads: u64,
    pub writes: u64,
    pub costs: CommandCosts,
}

impl Measure {
    fn add(&mut self, m: Measure) {
        self.cycles += m.cycles;
        self.secs += m.secs;
        self.server_cpu += m.server_cpu;
        self.client_cpu += m.client_cpu;
        self.reads += m.reads;
        self.writes += m.writes;
        for (k, c) in m.costs.0 {
            let e = self.costs.0.entry(k).or_default();
            e.calls += c.calls;
            e.usec += c.usec;
        }
    }

    pub fn per_sec(&self) -> f64 {
        self.cycles as f64 / self.secs.max(1e-9)
    }

    /// Server CPU µs per cycle.
    pub fn server_us(&self) -> Option<f64> {
        (self.cycles > 0).then(|| self.server_cpu * 1e6 / self.cycles as f64)
    }

    /// Client CPU µs per cycle.
    pub fn client_us(&self) -> Option<f64> {
        (self.cycles > 0).then(|| self.client_cpu.as_secs_f64() * 1e6 / self.cycles as f64)
    }

    /// Share of one core the server was busy.
    fn server_busy(&self) -> f64 {
        self.server_cpu / self.secs.max(1e-9)
    }
}

/// `TASKS` tasks running `op(task, k)` back to back on an emptied server:
/// after `warm`, everything over `window`.
pub fn window<F, Fut>(ctx: &Ctx, port: u16, warm: Duration, window: Duration, op: F) -> Measure
where
    F: Fn(usize, u64) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let mut admin = servers::conn(port);
    servers::flushall(&mut admin);
    let done = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let handles: Vec<_> = (0..TASKS)
        .map(|t| {
            let (done, stop, op) = (done.clone(), stop.clone(), op.clone());
            ctx.rt.spawn(async move {
                let mut k = 0;
                while !stop.load(Ordering::Relaxed) {
                    op(t, k).await;
                    k += 1;
                    done.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    // The readings run on this thread, not on the runtime's workers.
    std::thread::sleep(warm);
    let cpu0 = servers::server_cpu(&mut admin);
    let costs0 = CommandCosts::read(&mut admin);
    let io0 = servers::io_calls(&mut admin);
    let (c0, t0, p0) = (done.load(Ordering::Relaxed), Instant::now(), process_cpu());
    std::thread::sleep(window);
    let (c1, t1, p1) = (done.load(Ordering::Relaxed), Instant::now(), process_cpu());
    let io1 = servers::io_calls(&mut admin);
    let costs1 = CommandCosts::read(&mut admin);
    let cpu1 = servers::server_cpu(&mut admin);
    stop.store(true, Ordering::Relaxed);
    ctx.rt.block_on(async {
        for h in handles {
            h.await.expect("cost task panicked");
        }
    });
    Measure {
        cycles: c1 - c0,
        secs: (t1 - t0).as_secs_f64(),
        server_cpu: cpu1 - cpu0,
        client_cpu: p1.saturating_sub(p0),
        costs: costs1.since(&costs0),
        // Less this reading's own `INFO` calls (one read and one write each).
        reads: (io1.0 - io0.0).saturating_sub(1),
        writes: (io1.1 - io0.1).saturating_sub(1),
    }
}

/// One window of `who` on `server`.
fn measure(
    ctx: &Ctx,
    server: &Server,
    s: usize,
    who: Who,
    keys: Keys,
    round: usize,
    (warm, len): (Duration, Duration),
) -> Measure {
    let name = move |t: usize, k: u64| match keys {
        Keys::Fresh => format!("c9:{s}:{}:{round}:{t}:{k}", who.tag()),
        Keys::Reused => format!("c9:{s}:{}:{t}", who.tag()),
    };
    match who {
        Who::Fenced | Who::Unfenced => {
            let ours = server.ours.clone();
            window(ctx, server.port, warm, len, move |t, k| {
                let request = ours.lock(name(t, k)).lease(LEASE);
                async move {
                    let request = match who {
                        Who::Unfenced => unfenced(request).expect("unfenced locks in this build"),
                        _ => request,
                    };
                    let guard = request.await.expect("lock");
                    guard.release().await.expect("release");
                }
            })
        }
        Who::Rslock => {
            let mgr = server.rslock.clone();
            window(ctx, server.port, warm, len, move |t, k| {
                let (mgr, key) = (mgr.clone(), name(t, k));
                async move {
                    let lock = mgr.lock(key.as_str(), LEASE).await.expect("rslock lock");
                    mgr.unlock(&lock).await;
                }
            })
        }
    }
}

/// Connect both contenders to a server and warm them (connections, scripts).
fn connect(ctx: &Ctx, name: String, port: u16) -> Result<Server, String> {
    let url = format!("redis://127.0.0.1:{port}");
    let ours = ctx
        .rt
        .block_on(LockClient::connect(&url))
        .map_err(|e| format!("connect to {name}: {e}"))?;
    let rslock = rslock::LockManager::new(vec![url]);
    ctx.rt.block_on(async {
        for i in 0..20 {
            let g = ours.lock(format!("c9:warm:{i}")).await.expect("warm-up");
            g.release().await.expect("warm-up release");
            if let Some(r) = unfenced(ours.lock(format!("c9:warm:u:{i}"))) {
                r.await.expect("warm-up").release().await.expect("release");
            }
            let l = rslock
                .lock(format!("c9:warm:r:{i}").as_str(), LEASE)
                .await
                .expect("rslock warm-up");
            rslock.unlock(&l).await;
        }
    });
    Ok(Server {
        name,
        port,
        ours,
        rslock,
    })
}

pub fn run(ctx: &Ctx, report: &mut Report) {
    let rounds = if ctx.quick { 1 } else { 2 };
    let warm = Duration::from_millis(if ctx.quick { 300 } else { 500 });
    let len = Duration::from_secs(if ctx.quick { 1 } else { 2 });
    let has_unfenced = unfenced::available(&ctx.ours);
    let whos: Vec<Who> = [Who::Fenced, Who::Unfenced, Who::Rslock]
        .into_iter()
        .filter(|w| *w != Who::Unfenced || has_unfenced)
        .collect();

    let main_name = servers::describe(&mut ctx.server.conn());
    let mut list = vec![connect(ctx, main_name, ctx.server.port()).expect("main server")];
    let mut other_err = None;
    match &ctx.other {
        Ok(o) => match connect(ctx, o.describe.clone(), o.port()) {
            Ok(s) => list.push(s),
            Err(e) => other_err = Some(e),
        },
        Err(e) => other_err = Some(e.clone()),
    }

    // (server, keys, who) → measure, interleaved so that a slow spell of
    // the machine lands on every contender alike.
    let mut results: Vec<(Cell, Measure)> = Vec::new();
    // Server CPU per cycle of each window, by round.
    let mut by_round: Vec<(Cell, Vec<Option<f64>>)> = Vec::new();
    for round in 0..rounds {
        for (s, server) in list.iter().enumerate() {
            for keys in [Keys::Fresh, Keys::Reused] {
                for &who in &whos {
                    let m = measure(ctx, server, s, who, keys, round, (warm, len));
                    match by_round.iter_mut().find(|(k, _)| *k == (s, keys, who)) {
                        Some((_, v)) => v.push(m.server_us()),
                        None => by_round.push(((s, keys, who), vec![m.server_us()])),
                    }
                    match results.iter_mut().find(|(k, _)| *k == (s, keys, who)) {
                        Some((_, acc)) => acc.add(m),
                        None => results.push(((s, keys, who), m)),
                    }
                }
            }
        }
    }
    for server in &list {
        servers::flushall(&mut servers::conn(server.port));
    }
    let get = |s: usize, keys: Keys, who: Who| {
        results
            .iter()
            .find(|(k, _)| *k == (s, keys, who))
            .map(|(_, m)| m)
    };

    report.heading("Case 9 — what a lock costs: server and client CPU per lock + unlock");
    report.para(&format!(
        "{TASKS} tasks, each locking and unlocking back to back (lease 30 s, uncontended), on one multiplexed \
         connection per contender, {}-s window after {} ms warm-up, {rounds} round(s) interleaved across \
         servers, key patterns and contenders; the server is emptied (`FLUSHALL`) before each window. Fresh keys: \
         a new key name every cycle. Reused: each task locks one key of its own every cycle ({TASKS} keys). \
         Server CPU / cycle: `used_cpu_user + used_cpu_sys` (`INFO cpu`) over the window ÷ the cycles in it. \
         Client CPU / cycle: this bench process's user + system CPU (`getrusage(RUSAGE_SELF)`: the runtime's \
         workers, the clients' I/O threads and the bench's own loop, which is the same for every contender) over \
         the same window ÷ cycles; only one contender runs at a time. Commands: `INFO commandstats` over the \
         window, calls per cycle × µs per call (`usec_per_call`; commands run less than once per 200 cycles left \
         out); a script's µs include the commands it runs, which are listed under their own names as well. Socket reads / writes: `total_reads_processed` and \
         `total_writes_processed` (`INFO stats`) ÷ cycles: the server pays a system call per read and per \
         write, shared by every command that arrived or left together, so a client that keeps more commands in \
         flight costs the server less per command.",
        len.as_secs(),
        warm.as_millis(),
    ));
    let mut rows = Vec::new();
    for (s, server) in list.iter().enumerate() {
        for keys in [Keys::Fresh, Keys::Reused] {
            let rs = get(s, keys, Who::Rslock);
            for who in [Who::Fenced, Who::Unfenced, Who::Rslock] {
                let base = vec![server.name.clone(), keys.label().into(), who.label().into()];
                let Some(m) = get(s, keys, who) else {
                    rows.push(
                        base.into_iter()
                            .chain([unfenced::MISSING.into()])
                            .chain(std::iter::repeat_n(String::new(), 7))
                            .collect(),
                    );
                    continue;
                };
                let vs = |a: Option<f64>, b: Option<f64>| match (a, b) {
                    (Some(a), Some(b)) if who != Who::Rslock => ratio(a, b),
                    _ => "—".into(),
                };
                let us = |v: Option<f64>| v.map_or("n/a".into(), |v| format!("{v:.1} µs"));
                rows.push(
                    base.into_iter()
                        .chain([
                            fmt_count(m.per_sec()),
                            us(m.server_us()),
                            vs(m.server_us(), rs.and_then(Measure::server_us)),
                            format!("{:.0} %", 100.0 * m.server_busy()),
                            format!(
                                "{:.2} / {:.2}",
                                m.reads as f64 / m.cycles.max(1) as f64,
                                m.writes as f64 / m.cycles.max(1) as f64
                            ),
                            us(m.client_us()),
                            vs(m.client_us(), rs.and_then(Measure::client_us)),
                            m.costs.per_cycle(m.cycles),
                        ])
                        .collect(),
                );
            }
        }
    }
    report.table(
        &[
            "server",
            "keys",
            "contender",
            "cycles / s",
            "server CPU / cycle",
            "÷ rslock",
            "server busy (of one core)",
            "server socket reads / writes per cycle",
            "client CPU / cycle",
            "÷ rslock",
            "commands / cycle (calls × µs per call)",
        ],
        &rows,
    );
    if let Some(e) = &other_err {
        report.para(&format!("Second server: {e}."));
    }
    if !has_unfenced {
        report.para(&format!("Unfenced rows: {}.", unfenced::MISSING));
    }

    for (s, server) in list.iter().enumerate() {
        let rs = get(s, Keys::Fresh, Who::Rslock).and_then(Measure::server_us);
        // ours ÷ rslock round by round: how far the machine moved it.
        let spread = |who: Who| {
            let rounds = |w: Who| {
                by_round
                    .iter()
                    .find(|(k, _)| *k == (s, Keys::Fresh, w))
                    .map(|(_, v)| v.clone())
                    .unwrap_or_default()
            };
            let x: Vec<f64> = rounds(who)
                .iter()
                .zip(rounds(Who::Rslock))
                .filter_map(|(a, b)| Some(a.as_ref()? / b?))
                .collect();
            if x.len() < 2 {
                return String::new();
            }
            let lo = x.iter().copied().fold(f64::INFINITY, f64::min);
            let hi = x.iter().copied().fold(0.0, f64::max);
            format!("; by round {lo:.2}–{hi:.2}×")
        };
        let reused = |who| {
            get(s, Keys::Reused, who)
                .and_then(Measure::server_us)
                .zip(get(s, Keys::Reused, Who::Rslock).and_then(Measure::server_us))
                .map_or("n/a".into(), |(a, b)| ratio(a, b))
        };
        for (who, limit) in [(Who::Fenced, 1.6), (Who::Unfenced, 1.05)] {
            let target = format!(
                "{}: server CPU per cycle ÷ rslock's, 64 tasks, fresh keys ≤ {limit}× ({})",
                server.name,
                who.label()
            );
            let Some(m) = get(s, Keys::Fresh, who) else {
                report.target("9", target, unfenced::MISSING, None);
                continue;
            };
            let ours = m.server_us();
            let x = ours.zip(rs).map(|(a, b)| a / b);
            report.target(
                "9",
                target,
                match (ours, rs) {
                    (Some(a), Some(b)) => format!(
                        "{} ({a:.1} µs vs {b:.1} µs{}; one key reused: {})",
                        ratio(a, b),
                        spread(who),
                        reused(who)
                    ),
                    _ => "n/a".into(),
                },
                x.map(|x| x <= limit),
            );
            if let Some(r) = get(s, Keys::Fresh, Who::Rslock) {
                report.why(format!(
                    "the commands behind it in this run, per cycle: ours {}; rslock {}. {}",
                    m.costs.per_cycle(m.cycles),
                    r.costs.per_cycle(r.cycles),
                    if who == Who::Fenced {
                        "The scripts themselves cost what hand-written minimal ones running the same \
                         commands cost (case 11): the difference is those commands (a fenced acquire \
                         runs TIME, the counter's SET … GET and SET NX PX, and with a wait the HDEL \
                         that takes a re-sent attempt out of the queue) and a second script call per \
                         cycle where rslock sends a bare SET. What would meet it: fewer commands per \
                         token (the counter and the clock are what make tokens survive a lost counter)"
                    } else {
                        ""
                    }
                ));
            }
        }
    }
    // Throughput on the main server, with what each cycle cost the client:
    // the client shares the machine's cores with Redis.
    for (who, limit) in [(Who::Unfenced, 1.0), (Who::Fenced, 1.0 / 1.6)] {
        let (Some(m), Some(r)) = (get(0, Keys::Fresh, who), get(0, Keys::Fresh, Who::Rslock))
        else {
            continue;
        };
        let x = m.per_sec() / r.per_sec().max(1e-9);
        let us = |v: Option<f64>| v.map_or("n/a".into(), |v| format!("{v:.1} µs"));
        report.target(
            "9",
            format!(
                "{}: 64-task throughput ÷ rslock's, fresh keys ≥ {limit:.2}× ({})",
                list[0].name,
                who.label()
            ),
            format!(
                "{} ({} vs {} cycles/s; client CPU per cycle {} vs {}, server {} vs {})",
                ratio(m.per_sec(), r.per_sec()),
                fmt_count(m.per_sec()),
                fmt_count(r.per_sec()),
                us(m.client_us()),
                us(r.client_us()),
                us(m.server_us()),
                us(r.server_us()),
            ),
            Some(x >= limit),
        );
        if x < limit {
            let total = |m: &Measure| m.client_us().zip(m.server_us()).map(|(c, s)| c + s);
            report.why(format!(
                "the bench process and Redis share this machine's cores, so a cycle's price is the client's \
                 CPU plus the server's: {} per cycle for ours against {} for rslock's (client {} vs {}, \
                 server {} vs {}). What would meet it: that sum down to rslock's, i.e. less of either.",
                us(total(m)),
                us(total(r)),
                us(m.client_us()),
                us(r.client_us()),
                us(m.server_us()),
                us(r.server_us()),
            ));
        }
    }
    if other_err.is_some() {
        for who in [Who::Fenced, Who::Unfenced] {
            report.target(
                "9",
                format!(
                    "{}: server CPU per cycle ÷ rslock's, fresh keys ({})",
                    servers::other_binary(),
                    who.label()
                ),
                other_err.clone().unwrap_or_default(),
                None,
            );
        }
    }
}
