//! Sentinel under load while the primary fails over: one primary, two
//! replicas, three sentinels; two fleets of `fault_worker` processes, one
//! with `replica_acks(1, …)` and one without, each on keys of its own. The
//! nemesis kills the primary (`kill -9`), waits until the sentinels name
//! another, and a while later starts the old one again, empty, for the
//! sentinels to make a replica of the new primary: one failover in the
//! bounded run, one about every 20 s with `FAULT_FULL=1`. Before the kill
//! (every other one in the full run), replication stalls for longer than a
//! lease: the replicas, still answering the sentinels, cannot reconnect to
//! the primary, so the one promoted lacks what the primary granted and
//! renewed meanwhile.
//!
//! Judged by the history checker. With `replica_acks`: no two bodies at
//! once, ever. Without: a failover may lose a lock the replica had not
//! received yet, so two holders may overlap, but only where the earlier one
//! was told `Lost`, or its attributed body returned, within one lease of
//! the overlap's start (the checker's loss-notice allowance set to a
//! lease): every overlap is bounded. An attributed body that returns before
//! its next renewal has no notice to get; the attribute only logs what its
//! release finds. Both: tokens in grant order.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use tests::history::{self, CheckConfig, FaultKind, Report};
use tests::sentinel::{wait_replicas_online, Sentinels, Timing};
use tests::{unique, RedisServer};

use super::{full, run_time, worker_mode, Fleet, Locking, OP_TIMEOUT};

const MASTER: &str = "faultmaster";

/// How the workers lock: a wait longer than a failover, and one op in 40
/// holding its lock for 3-6 s, renewed every 0.7 s, long enough to span
/// a stall and the failover after it.
const LOCKING: Locking = Locking {
    lease: Duration::from_secs(2),
    wait: Duration::from_secs(8),
    read_pct: 0,
    long_hold_ms: 3_000,
    permits: 0,
    other_permits: 0,
};

/// `replica_acks` of the fleet that has them: one of the two replicas.
const ACKS: (usize, Duration) = (1, Duration::from_millis(500));

/// Three data nodes and the sentinels watching them.
struct Deployment {
    nodes: Vec<RedisServer>,
    sentinels: Sentinels,
}

impl Deployment {
    /// Every node starts as a plain server; replication is set at run time
    /// (`REPLICAOF`), so that a node started again comes back as an empty
    /// primary that the sentinels then turn into a replica.
    fn start() -> Deployment {
        let nodes: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
        let primary = nodes[0].port().to_string();
        for r in &nodes[1..] {
            let _: String = r.cmd(&["REPLICAOF", "127.0.0.1", &primary]);
        }
        wait_replicas_online(&nodes[0], 2, Duration::from_secs(20));
        let sentinels = Sentinels::start(3, MASTER, &nodes[0], Timing::default());
        sentinels.wait_ready(2, Duration::from_secs(20));
        Deployment { nodes, sentinels }
    }

    fn urls(&self, acks: Option<(usize, Duration)>) -> String {
        let (k, ms) = acks.map_or((0, 0), |(k, t)| (k, t.as_millis()));
        format!(
            "sentinel:{MASTER}:{k}:{ms}@{}",
            self.sentinels.urls().join(",")
        )
    }

    fn node_at(&self, port: u16) -> usize {
        self.nodes
            .iter()
            .position(|n| n.port() == port)
            .expect("the sentinels name a node of this deployment")
    }

    /// Kill the primary, after `stall` without replication if given;
    /// returns its index, once the sentinels name another, and how long
    /// that took.
    fn fail_over(&mut self, fleets: &[&Fleet], stall: Option<Duration>) -> (usize, Duration) {
        let old = self.sentinels.primary_port().expect("a primary");
        let i = self.node_at(old);
        let replicas: Vec<usize> = (0..self.nodes.len()).filter(|&j| j != i).collect();
        if let Some(stall) = stall {
            // A password the primary does not want: the replicas' links,
            // cut, cannot come back (the primary refuses their `AUTH`).
            for &j in &replicas {
                let _: String = self.nodes[j].cmd(&["CONFIG", "SET", "masterauth", "stalled"]);
            }
            let _: i64 = self.nodes[i].cmd(&["CLIENT", "KILL", "TYPE", "replica"]);
            std::thread::sleep(stall);
        }
        for f in fleets {
            f.fault(None, FaultKind::RedisDown { wipe: false });
        }
        self.nodes[i].kill();
        let killed = Instant::now();
        if stall.is_some() {
            for &j in &replicas {
                let _: String = self.nodes[j].cmd(&["CONFIG", "SET", "masterauth", ""]);
            }
        }
        let new = self.sentinels.wait_failover(old, Duration::from_secs(60));
        let took = killed.elapsed();
        for f in fleets {
            f.fault(None, FaultKind::RedisUp { wipe: false });
        }
        assert_ne!(self.node_at(new), i);
        (i, took)
    }

    /// Start node `i` again, once every client follows the new primary
    /// (they ask the sentinels every second): empty, it answers as a
    /// primary until the sentinels make it a replica, and a client still
    /// pointed at its address would lock there.
    fn bring_back(&mut self, i: usize) {
        std::thread::sleep(Duration::from_secs(4));
        self.nodes[i].restart();
    }

    /// Until the current primary has both replicas in sync again.
    fn wait_healed(&self, limit: Duration) {
        let port = self.sentinels.primary_port().expect("a primary");
        wait_replicas_online(&self.nodes[self.node_at(port)], 2, limit);
    }

    /// A planned failover, as an operator runs one for an upgrade:
    /// `SENTINEL FAILOVER`, nothing killed; the old primary is made a
    /// replica of the new one. Returns once the sentinels name the new
    /// primary (how long that took), then waits until both replicas are in
    /// sync again and the sentinels know them, ready for the next one.
    fn planned(&mut self) -> Duration {
        let old = self.sentinels.primary_port().expect("a primary");
        let asked = Instant::now();
        let reply: String = self.sentinels.sentinels[0]
            .try_cmd(&["SENTINEL", "FAILOVER", MASTER])
            .expect("SENTINEL FAILOVER");
        assert_eq!(reply, "OK");
        self.sentinels.wait_failover(old, Duration::from_secs(30));
        let took = asked.elapsed();
        self.wait_healed(Duration::from_secs(30));
        self.sentinels.wait_ready(2, Duration::from_secs(30));
        took
    }

    /// Lock holds (not queues, not the token counter) on the primary.
    fn holds(&self) -> Vec<String> {
        let port = self.sentinels.primary_port().expect("a primary");
        super::lock_keys(&self.nodes[self.node_at(port)])
            .into_iter()
            .filter(|k| !super::is_queue(k))
            .collect()
    }
}

/// What one fleet's run came to.
struct Outcome {
    report: Report,
    /// With the loss-notice allowance at one lease, which an attributed
    /// body's normal end within it meets too (see the module docs).
    lax: Report,
}

/// `acks`: the fleet's `replica_acks`, whose `WAIT` can add its timeout
/// to the attempt in flight at a call's deadline.
fn judge(fleet: &Fleet, title: &str, acks: Option<(usize, Duration)>) -> Outcome {
    let hist = fleet.history();
    let strict = CheckConfig {
        lease: LOCKING.lease,
        slop: Duration::from_millis(150),
        op_timeout: Some(OP_TIMEOUT + acks.map_or(Duration::ZERO, |(_, t)| t)),
        body_end_bounds: false,
    };
    let report = history::check(&hist, &strict);
    let lax = history::check(
        &hist,
        &CheckConfig {
            slop: LOCKING.lease,
            body_end_bounds: true,
            ..strict
        },
    );
    println!("{}", report.table(title));
    super::print_examples(&report, &hist);
    let live = fleet.live.lock().unwrap();
    if !live.errors.is_empty() {
        println!("  client errors seen: {:?}", live.errors);
        println!("  e.g. {:?}", live.error_samples);
    }
    drop(live);
    Outcome { report, lax }
}

/// How a run fails the primary over: killed (after a stall when asked),
/// or planned.
#[derive(Clone, Copy)]
enum Failover {
    Kill,
    Planned,
}

/// Run both fleets for `run_for` with a failover about every `every`
/// (at least one, two when planned); prints and returns each fleet's
/// outcome, with and then without acks, the failovers' durations, and the
/// holds left on the primary once every worker exited.
fn run(
    run_for: Duration,
    every: Duration,
    how: Failover,
) -> (Outcome, Outcome, Vec<Duration>, Vec<String>) {
    let mut d = Deployment::start();
    let keys =
        |what: &str| -> Vec<String> { (0..3).map(|i| unique(&format!("{what}{i}"))).collect() };
    let fleet = |acks: Option<(usize, Duration)>, keys: Vec<String>| {
        Fleet::new(
            vec![d.urls(acks)],
            "-".to_owned(),
            keys,
            4,
            worker_mode(),
            LOCKING,
        )
    };
    let mut acked = fleet(Some(ACKS), keys("acked"));
    let mut plain = fleet(None, keys("plain"));
    for _ in 0..2 {
        acked.spawn();
        plain.spawn();
    }
    let started = Instant::now();
    let mut failovers = Vec::new();
    // The first failover once the workers run; then one every `every`.
    let mut next = started + Duration::from_secs(3).min(every);
    let least = match how {
        Failover::Kill => 1,
        Failover::Planned => 2,
    };
    while failovers.len() < least || started.elapsed() < run_for {
        let now = Instant::now();
        if now < next {
            std::thread::sleep((next - now).min(Duration::from_millis(200)));
            continue;
        }
        if let Failover::Planned = how {
            failovers.push(d.planned());
            next = Instant::now().max(next + every);
            continue;
        }
        // A stall before the first failover, and every other one after.
        let stall =
            (failovers.len() % 2 == 0).then_some(LOCKING.lease + Duration::from_millis(500));
        let (down, took) = d.fail_over(&[&acked, &plain], stall);
        failovers.push(took);
        if full() {
            d.bring_back(down);
            d.wait_healed(Duration::from_secs(40));
            println!(
                "  [Sentinel nemesis] {:.0} s: {} failovers, {} + {} acquisitions",
                started.elapsed().as_secs_f64(),
                failovers.len(),
                acked.acquired.load(Ordering::Relaxed),
                plain.acquired.load(Ordering::Relaxed),
            );
        }
        next = Instant::now().max(next + every);
    }
    // Let the clients work on the new primary a while.
    std::thread::sleep(Duration::from_secs(2));
    let limit = LOCKING.wait * 2 + OP_TIMEOUT;
    acked.stop_all(limit);
    plain.stop_all(limit);
    acked.exit_all();
    plain.exit_all();
    let left = d.holds();
    let ran = started.elapsed();
    let what = match how {
        Failover::Kill => "failovers",
        Failover::Planned => "planned failovers",
    };
    let with = judge(
        &acked,
        &format!(
            "Sentinel, {what}, replica_acks(1, 500ms): {ran:.0?}, {}",
            failovers.len()
        ),
        Some(ACKS),
    );
    let without = judge(
        &plain,
        &format!(
            "Sentinel, {what}, no replica_acks: {ran:.0?}, {}",
            failovers.len()
        ),
        None,
    );
    (with, without, failovers, left)
}

/// The scenario: bounded, one failover in about 20 s of wall time; with
/// `FAULT_FULL=1` four minutes, a failover every 20 s.
pub(crate) fn failovers_under_load() {
    let run_for = run_time(5, 240);
    let every = if full() {
        Duration::from_secs(20)
    } else {
        run_for
    };
    let (with, without, failovers, _) = run(run_for, every, Failover::Kill);
    println!(
        "  failovers: {} (primary killed -> the sentinels name another: {:?})",
        failovers.len(),
        failovers
    );
    println!(
        "  double holders: with replica_acks {}, without {} ({} of them not told Lost within a lease)",
        with.report.double_holders.len(),
        without.report.double_holders.len(),
        without.lax.double_holders.len(),
    );
    assert_fleets(&with, &without, Failover::Kill);
}

/// Planned failovers (`SENTINEL FAILOVER`, as for an upgrade) under the
/// same load: bounded, two in about 10 s; with `FAULT_FULL=1` one every
/// 10 s for four minutes. What an operator does on a schedule strands
/// nothing: no call that had wait left fails, nothing is held once the
/// workers have exited, and with `replica_acks` no two bodies at once.
/// Without acks a grant the old primary made after the promotion is lost
/// with it (asynchronous replication), and its holder is told `Lost`
/// within a lease (the lax check).
pub(crate) fn planned_failovers_under_load() {
    let run_for = run_time(10, 240);
    let every = Duration::from_secs(if full() { 10 } else { 3 });
    let (with, without, failovers, left) = run(run_for, every, Failover::Planned);
    println!(
        "  planned failovers: {} (SENTINEL FAILOVER -> the sentinels name another: {:?})",
        failovers.len(),
        failovers
    );
    println!(
        "  double holders: with replica_acks {}, without {} ({} of them not told Lost within a lease); holds left: {}",
        with.report.double_holders.len(),
        without.report.double_holders.len(),
        without.lax.double_holders.len(),
        left.len(),
    );
    assert!(left.is_empty(), "held after every worker exited: {left:?}");
    assert_fleets(&with, &without, Failover::Planned);
}

/// What both fleets must show after failovers of kind `how`: enough
/// acquisitions, tokens in order, no call past its deadline, no two bodies
/// at once with acks, and without acks none beyond a `Lost` notice within
/// a lease. After planned failovers, also no call that had wait left
/// failed (after a kill, calls meeting no primary may).
fn assert_fleets(with: &Outcome, without: &Outcome, how: Failover) {
    for (what, o) in [("with", with), ("without", without)] {
        assert!(
            o.report.acquisitions >= 10,
            "{what} replica_acks: only {} acquisitions",
            o.report.acquisitions
        );
        let mut lists = vec![
            ("fence duplicate", &o.report.fence_duplicates),
            ("fence order", &o.report.fence_out_of_order),
            ("unterminated interval", &o.report.unterminated),
            ("past its deadline", &o.report.overruns),
        ];
        if let Failover::Planned = how {
            lists.push(("call failed with wait left", &o.report.failed_with_budget));
        }
        for (kind, list) in lists {
            assert!(list.is_empty(), "{what} replica_acks, {kind}: {list:#?}");
        }
    }
    assert!(
        with.report.double_holders.is_empty(),
        "with replica_acks, two bodies at once: {:#?}",
        with.report.double_holders
    );
    assert!(
        without.lax.double_holders.is_empty(),
        "without replica_acks, an earlier holder not told Lost within a lease: {:#?}",
        without.lax.double_holders
    );
}
