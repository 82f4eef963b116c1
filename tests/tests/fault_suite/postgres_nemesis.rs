//! The fault suite on PostgreSQL: fault_worker processes lock through a
//! fault proxy in front of a durable `postgres` while the nemesis kills and
//! pauses holders, pauses the server (SIGSTOP of every server process),
//! terminates every client connection (`pg_terminate_backend`), restarts
//! the server (an immediate stop: a crash, then recovery) and cuts the
//! proxy's connections; a share of the acquires' and releases' replies is
//! lost after their statement ran, all the run long. Judged by the history
//! checker.

use std::time::{Duration, Instant};

use tests::history::{self, CheckConfig, FaultKind, Report};
use tests::postgres::PostgresServer;
use tests::proxy::Proxy;
use tests::unique;

use super::{rand_ms, Fleet, Locking, LEASE, OP_TIMEOUT};

#[derive(Debug, Clone, Copy)]
enum PgNemesis {
    KillHolder,
    PauseHolder,
    /// SIGSTOP of the server for less than a third of the lease.
    PauseServer,
    /// `pg_terminate_backend` of every client connection, a few times.
    TerminateBackends,
    /// Immediate stop, then start (crash recovery).
    RestartServer,
    ProxyCut,
}

/// What the run did.
pub(crate) struct PgRun {
    pub(crate) report: Report,
    pub(crate) faults: Vec<(String, u64)>,
    pub(crate) replies_lost: u64,
    pub(crate) terminated: usize,
    /// Holder rows still within their lease once every worker exited.
    pub(crate) leftover: i64,
}

pub(crate) fn run(run_for: Duration, reply_loss: f64) -> PgRun {
    let mut pg = PostgresServer::options().durable().start();
    let proxy = Proxy::start(pg.port());
    let url = format!("postgres://postgres@127.0.0.1:{}/postgres", proxy.port());
    let keys: Vec<String> = (0..4).map(|i| unique(&format!("pghot{i}"))).collect();
    let locking = Locking::CLASSIC;
    let mut fleet = Fleet::new(
        vec![url],
        "-".into(),
        keys,
        4,
        super::worker_mode(),
        locking,
    );
    for _ in 0..4 {
        fleet.spawn();
    }
    proxy.lose_replies(b"lock_acquire_v1", reply_loss);
    use PgNemesis::*;
    let schedule = [
        KillHolder,
        PauseServer,
        TerminateBackends,
        PauseHolder,
        RestartServer,
        ProxyCut,
        TerminateBackends,
        KillHolder,
        PauseServer,
    ];
    let mut counts: std::collections::BTreeMap<String, u64> = Default::default();
    let mut terminated = 0;
    let started = Instant::now();
    let mut i = 0;
    while started.elapsed() < run_for || i < schedule.len() {
        std::thread::sleep(rand_ms(200, 600));
        if i == schedule.len() / 2 {
            // The second half loses releases' replies too.
            proxy.lose_replies(b"lock_", reply_loss);
        }
        let n = schedule[i % schedule.len()];
        *counts.entry(format!("{n:?}")).or_default() += 1;
        match n {
            KillHolder => {
                let id = fleet.pick_holder(Duration::from_secs(1), false);
                fleet.kill(id);
                fleet.spawn();
            }
            PauseHolder => {
                let id = fleet.pick_holder(Duration::from_secs(3), true);
                fleet.pause(id, LEASE.mul_f64(1.5 + fastrand::f64()));
            }
            PauseServer => {
                // Recorded as a black hole: every connection silent.
                fleet.fault(None, FaultKind::ProxyBlackhole);
                pg.pause();
                std::thread::sleep(rand_ms(100, LEASE.as_millis() as u64 / 3));
                pg.resume();
                fleet.fault(None, FaultKind::ProxyHeal);
            }
            TerminateBackends => {
                for _ in 0..4 {
                    fleet.fault(None, FaultKind::ProxyCut);
                    terminated += pg.terminate_backends();
                    std::thread::sleep(rand_ms(150, 400));
                }
            }
            RestartServer => {
                fleet.fault(None, FaultKind::RedisDown { wipe: false });
                pg.restart();
                fleet.fault(None, FaultKind::RedisUp { wipe: false });
            }
            ProxyCut => {
                fleet.fault(None, FaultKind::ProxyCut);
                proxy.cut();
            }
        }
        i += 1;
    }
    proxy.lose_replies(b"", 0.0);
    let replies_lost = proxy.replies_lost();
    fleet.stop_all(Duration::from_secs(30).max(locking.wait * 2 + OP_TIMEOUT));
    // Killed holders' leases, and waiters' places, lapse on their own.
    std::thread::sleep(LEASE * 2);
    let leftover = pg.number_in(
        "postgres",
        "SELECT count(*) FROM lock_holders WHERE lease_end > clock_timestamp()",
    );
    fleet.exit_all();
    let hist = fleet.history();
    super::dump(&hist, "postgres nemesis");
    let cfg = CheckConfig {
        lease: locking.lease,
        slop: Duration::from_millis(150),
        op_timeout: Some(OP_TIMEOUT),
        body_end_bounds: false,
    };
    let mut report = history::check(&hist, &cfg);
    report.extra.push((
        "ran for".into(),
        format!(
            "{:.1} s, {i} faults, 4 worker processes x 4 tasks on 4 keys; lease {:?}, wait {:?}, {} % readers",
            started.elapsed().as_secs_f64(),
            locking.lease,
            locking.wait,
            locking.read_pct
        ),
    ));
    report.extra.push((
        "postgres".into(),
        format!(
            "{terminated} connections terminated, {replies_lost} replies lost after their statement ran, \
             {} proxy connections",
            proxy.stats().accepted
        ),
    ));
    let live = fleet.live.lock().unwrap();
    report.extra.push((
        "client errors seen".into(),
        format!(
            "{} ({} kinds); e.g. {:?}",
            live.errors.values().sum::<u64>(),
            live.errors.len(),
            live.error_samples.iter().take(3).collect::<Vec<_>>()
        ),
    ));
    drop(live);
    super::print_examples(&report, &hist);
    PgRun {
        report,
        faults: counts.into_iter().collect(),
        replies_lost,
        terminated,
        leftover,
    }
}
