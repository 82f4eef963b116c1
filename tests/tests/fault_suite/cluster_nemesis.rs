//! A Redis Cluster under load while the slots of its locks migrate back
//! and forth between primaries, by hand and held half moved (so that every
//! lock script meets `TRYAGAIN` for a while), or whole as an operator's
//! resharding moves them, under the history checker.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lock_runtime::{LockClient, LockError};
use tests::cluster::{key_slot, Cluster};
use tests::history::{self, CheckConfig, Event, Failure, History, Kind, Recorder, Report};
use tests::{eventually, unique};

use super::{full, rand_ms, OP_TIMEOUT};

/// Primaries; no replicas (a migration is the fault here, not a failover).
const PRIMARIES: usize = 3;
const CLIENTS: usize = 3;
const TASKS_PER_CLIENT: usize = 4;
const KEYS: usize = 6;
/// Other keys in each lock's slot, so that a migration moves many keys and
/// can be held with some of them moved.
const FILLERS: usize = 100;
/// Longer than the longest migration held half moved plus its finish: a
/// reader's renewal (which meets `TRYAGAIN` while the slot is split) and a
/// release sent during a migration land before the hold's deadline.
const LEASE: Duration = Duration::from_secs(8);
const WAIT: Duration = Duration::from_secs(10);
/// Of every 100 ops, this many take the read lock (whose renewal declares
/// two keys, and so meets `TRYAGAIN` while the slot is split).
const READ_PCT: u32 = 25;
/// One op in this many holds for 1–3 s: renewals cross migrations.
const LONG_HOLD_ONE_IN: u32 = 25;

/// How the nemesis moves a slot.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Moves {
    /// By hand: part of its keys, held so for a while, then the rest.
    HeldHalf,
    /// As an operator's resharding does (`redis-cli --cluster reshard`):
    /// every key, `RESHARD_BATCH` per `MIGRATE`, `RESHARD_PAUSE` apart,
    /// through the locks held there; each slot holds `RESHARD_FILLERS`
    /// other keys.
    Resharding,
}

const RESHARD_FILLERS: usize = 2_000;
const RESHARD_BATCH: usize = 100;
const RESHARD_PAUSE: Duration = Duration::from_millis(50);

/// What the run did, besides the checker's report.
pub(crate) struct ClusterRun {
    pub(crate) report: Report,
    pub(crate) migrations: u64,
    /// Longest time a slot was held half moved.
    pub(crate) longest_mixed: Duration,
    /// `Moves::Resharding`: the same move with no client running (before
    /// they start), and the longest one under load.
    pub(crate) alone: Duration,
    pub(crate) longest_move: Duration,
    /// `MIGRATE`s that failed (a key on both nodes, say).
    pub(crate) move_errors: Vec<String>,
    pub(crate) release_failures: u64,
    pub(crate) leftover: Vec<String>,
}

/// Workers lock `KEYS` keys (each in a slot of its own) while the slots
/// move between primaries: begin, move part of the slot's keys, hold that
/// (the first time for 2 × `op_timeout` + 0.5 s, then 0.3–3 s, up to 5 s
/// with `FAULT_FULL`), then the rest and the hand over. Runs for `run_for`, then lets the last migration finish.
pub(crate) fn run(run_for: Duration, moves: Moves) -> ClusterRun {
    let cluster = Cluster::start(PRIMARIES, 0, 2000);
    let fillers = match moves {
        Moves::HeldHalf => FILLERS,
        Moves::Resharding => RESHARD_FILLERS,
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    let keys: Vec<String> = {
        let mut slots = std::collections::HashSet::new();
        (0..)
            .map(|i| unique(&format!("migrating{i}")))
            .filter(|k| slots.insert(key_slot(&format!("lock:{{{k}}}"))))
            .take(KEYS)
            .collect()
    };
    for k in &keys {
        let owner = cluster.slot_owner(key_slot(&format!("lock:{{{k}}}")));
        cluster.fill(owner, k, fillers);
    }
    let reshard = |slot: u16, from: usize, to: usize| {
        cluster
            .reshard(
                slot,
                (from, to),
                RESHARD_BATCH,
                RESHARD_PAUSE,
                Duration::from_secs(60),
            )
            .unwrap_or_else(|e| panic!("resharding slot {slot}: {e}"))
    };
    // The move alone, there and back, before any client runs.
    let alone = if moves == Moves::Resharding {
        let slot = key_slot(&format!("lock:{{{}}}", keys[0]));
        let from = cluster.slot_owner(slot);
        let to = (from + 1) % PRIMARIES;
        let there = reshard(slot, from, to);
        let back = reshard(slot, to, from);
        assert!(there.errors.is_empty() && back.errors.is_empty());
        there.took.max(back.took)
    } else {
        Duration::ZERO
    };
    let clients: Vec<LockClient> = (0..CLIENTS)
        .map(|_| {
            rt.block_on(LockClient::builder().cluster(cluster.urls()))
                .unwrap()
        })
        .collect();

    let stop = Arc::new(AtomicBool::new(false));
    let release_failures = Arc::new(AtomicU64::new(0));
    let mut recorded: Vec<Arc<Mutex<Vec<Event>>>> = Vec::new();
    let mut tasks = Vec::new();
    for (c, client) in clients.iter().enumerate() {
        let (rec, events) = Recorder::memory(c as u32);
        recorded.push(events);
        let ops = Arc::new(AtomicU64::new(0));
        for _ in 0..TASKS_PER_CLIENT {
            let (client, rec, ops, keys) = (client.clone(), rec.clone(), ops.clone(), keys.clone());
            let (stop, release_failures) = (stop.clone(), release_failures.clone());
            tasks.push(rt.spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let key = &keys[fastrand::usize(..keys.len())];
                    let op = ops.fetch_add(1, Ordering::Relaxed);
                    lock_once(&client, &rec, op, key, &release_failures).await;
                }
            }));
        }
    }

    // The nemesis, on a thread of its own: the slots' owners as it moved
    // them.
    let slots: Vec<u16> = keys
        .iter()
        .map(|k| key_slot(&format!("lock:{{{k}}}")))
        .collect();
    let mut owners: Vec<usize> = slots.iter().map(|&s| cluster.slot_owner(s)).collect();
    let started = Instant::now();
    let mut migrations = 0;
    let mut longest_mixed = Duration::ZERO;
    let mut longest_move = Duration::ZERO;
    let mut move_errors = Vec::new();
    let most_mixed = if full() { 5_000 } else { 3_000 };
    while started.elapsed() < run_for {
        std::thread::sleep(rand_ms(200, 1_000));
        let i = fastrand::usize(..slots.len());
        let (slot, from) = (slots[i], owners[i]);
        let to = (from + 1 + fastrand::usize(..PRIMARIES - 1)) % PRIMARIES;
        if moves == Moves::Resharding {
            let done = reshard(slot, from, to);
            longest_move = longest_move.max(done.took);
            move_errors.extend(done.errors);
            owners[i] = to;
            migrations += 1;
            continue;
        }
        cluster.begin_migration(slot, from, to);
        let s = slot.to_string();
        let now_there: Vec<String> =
            cluster.nodes[from].cmd(&["CLUSTER", "GETKEYSINSLOT", &s, "1000"]);
        let some: Vec<&str> = now_there
            .iter()
            .map(String::as_str)
            .filter(|_| fastrand::bool())
            .collect();
        if !some.is_empty() {
            cluster
                .try_migrate_keys(from, to, &some)
                .unwrap_or_else(|e| panic!("moving part of slot {slot}: {e}"));
        }
        // The first for longer than two operation timeouts (which used to
        // end every call that met it), the others at random.
        let mixed = if migrations == 0 {
            2 * OP_TIMEOUT + Duration::from_millis(500)
        } else {
            rand_ms(300, most_mixed)
        };
        std::thread::sleep(mixed);
        cluster
            .try_finish_migration(slot, from, to)
            .unwrap_or_else(|e| panic!("finishing slot {slot}: {e}"));
        longest_mixed = longest_mixed.max(mixed);
        owners[i] = to;
        migrations += 1;
    }
    stop.store(true, Ordering::Relaxed);
    rt.block_on(async {
        for t in tasks {
            t.await.unwrap();
        }
    });

    // Every holder released and every waiter gave up or got its lock: no
    // key of a lock is left (a fence counter, `lock:fence{…}`, is meant to
    // stay).
    let lock_keys = || -> Vec<String> {
        (0..PRIMARIES)
            .flat_map(|i| cluster.nodes[i].keys("lock:{*"))
            .collect()
    };
    let mut leftover = lock_keys();
    rt.block_on(async {
        eventually(LEASE + WAIT, || {
            leftover = lock_keys();
            leftover.is_empty()
        })
        .await
    });
    drop(clients);

    let hist = History {
        events: recorded
            .iter()
            .flat_map(|e| e.lock().unwrap().clone())
            .collect(),
        faults: Vec::new(),
    };
    let cfg = CheckConfig {
        lease: LEASE,
        slop: Duration::from_millis(150),
        op_timeout: Some(OP_TIMEOUT),
        body_end_bounds: false,
    };
    let mut report = history::check(&hist, &cfg);
    report.leftover_keys = Some(leftover.clone());
    report.extra.push((
        "ran for".into(),
        format!(
            "{:.1} s, {CLIENTS} clients x {TASKS_PER_CLIENT} tasks on {KEYS} keys (a slot each, \
             {fillers} other keys there); {PRIMARIES} primaries; lease {LEASE:?}, wait {WAIT:?}, \
             {READ_PCT} % readers, one hold in {LONG_HOLD_ONE_IN} 1-3 s",
            started.elapsed().as_secs_f64()
        ),
    ));
    report.extra.push(match moves {
        Moves::HeldHalf => (
            "slot migrations".into(),
            format!("{migrations}, each held half moved up to {longest_mixed:?}"),
        ),
        Moves::Resharding => (
            "reshardings".into(),
            format!(
                "{migrations} of {fillers} keys + the locks' ({RESHARD_BATCH} per MIGRATE, \
                 {RESHARD_PAUSE:?} apart): longest {longest_move:?} under load, {alone:?} alone; \
                 {} MIGRATE errors",
                move_errors.len()
            ),
        ),
    });
    ClusterRun {
        report,
        migrations,
        longest_mixed,
        alone,
        longest_move,
        move_errors,
        release_failures: release_failures.load(Ordering::Relaxed),
        leftover,
    }
}

/// One lock call, a short body, the release: each step recorded.
async fn lock_once(
    client: &LockClient,
    rec: &Recorder,
    op: u64,
    key: &str,
    release_failures: &AtomicU64,
) {
    rec.record(
        op,
        key,
        Kind::Attempt {
            wait_ms: WAIT.as_millis() as u64,
        },
    );
    let called = Instant::now();
    let read = fastrand::u32(..100) < READ_PCT;
    let request = if read {
        client.read_lock(key)
    } else {
        client.lock(key)
    };
    let guard = match request.lease(LEASE).wait(WAIT).await {
        Ok(g) => g,
        Err(e) => {
            let waited_ms = called.elapsed().as_millis() as u64;
            let kind = match &e {
                LockError::Timeout { .. } => Kind::Timeout { waited_ms },
                LockError::Backend(_) => Kind::Failed {
                    waited_ms,
                    error: Failure::Backend,
                },
                _ => Kind::Failed {
                    waited_ms,
                    error: Failure::Other,
                },
            };
            if !matches!(e, LockError::Timeout { .. }) {
                eprintln!("lock {key} failed after {waited_ms} ms: {e}");
            }
            rec.record(op, key, kind);
            return;
        }
    };
    let fence = guard.fence();
    let kind = if read {
        Kind::AcquiredRead { fence }
    } else {
        Kind::Acquired { fence }
    };
    rec.record(op, key, kind);
    let body = if fastrand::u32(..LONG_HOLD_ONE_IN) == 0 {
        rand_ms(1_000, 3_000)
    } else {
        rand_ms(5, 60)
    };
    // Told of a loss as it happens, as a body racing `lost()` would be.
    tokio::select! {
        () = tokio::time::sleep(body) => {}
        () = guard.lost() => {}
    }
    if guard.is_lost() {
        rec.record(op, key, Kind::Lost);
        drop(guard);
        return;
    }
    rec.record(op, key, Kind::Releasing);
    let releasing = Instant::now();
    match guard.release().await {
        Ok(()) => rec.record(op, key, Kind::Released),
        Err(LockError::Lost { .. }) => rec.record(op, key, Kind::ReleaseLost),
        Err(e) => {
            let took = releasing.elapsed();
            eprintln!("release of {key} (read: {read}) failed after {took:?}: {e}");
            release_failures.fetch_add(1, Ordering::Relaxed);
            rec.record(op, key, Kind::ReleaseFailed);
        }
    }
}
