//! The fault suite: lock clients in several processes, a nemesis that kills,
//! pauses, partitions and restarts, a history checker, and fencing end to
//! end. Bounded by default; the full run is
//! `FAULT_FULL=1 cargo test -p tests --release --test fault_suite -- --nocapture`.
//!
//! Reply faults one client at a time (each client behind a proxy of its
//! own, subscriptions spared): replies lost after their command ran, slow
//! spells, an acquire's re-send answered past the orphan-grant timer,
//! commands re-sent by the transport. `FAULT_SECS=n` sets how long those
//! scenarios run (15 s bounded, 240 s with `FAULT_FULL=1`).
//!
//! Scenarios run one at a time (they share two CPU cores with everything
//! else) and each prints its figures, and the first violation of each kind
//! with a trace of the ops involved. `FAULT_DUMP=dir` keeps the histories.

use std::collections::{BTreeMap, HashMap};
use std::future::IntoFuture;
use std::io::{BufRead, BufReader, Write as _};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use lock_runtime::{distributed_lock, LockClient, LockError};
use tests::fenced::FencedStore;
use tests::history::{self, CheckConfig, Event, Fault, FaultKind, History, Kind, Report};
use tests::proxy::{Mode, Proxy};
use tests::{eventually, spawn_tied, unique, RedisServer};

#[path = "fault_suite/cluster_nemesis.rs"]
mod cluster_nemesis;
#[path = "fault_suite/postgres_nemesis.rs"]
mod postgres_nemesis;

/// The lease of the fault workers (`fault_worker.rs`) by default.
const LEASE: Duration = Duration::from_secs(1);
/// The workers' operation timeout (the client's default).
const OP_TIMEOUT: Duration = Duration::from_secs(2);

/// How the workers lock (`fault_worker`'s `SETTINGS`).
#[derive(Debug, Clone, Copy)]
struct Locking {
    lease: Duration,
    wait: Duration,
    /// Of every 100 ops, this many take the read lock.
    read_pct: u32,
    /// A long hold (one op in 40) lasts this long to twice that; 0: the
    /// worker's 80-200 ms.
    long_hold_ms: u64,
    /// Above 0: every op takes a permit of a semaphore of this many.
    permits: u32,
    /// Above 0: every fourth worker process (ids 4, 8, …) asks for this
    /// many permits instead, as a version that disagrees on N would.
    other_permits: u32,
}

impl Locking {
    /// 1 s lease, 2 s wait, one op in four a reader.
    const CLASSIC: Locking = Locking {
        lease: LEASE,
        wait: Duration::from_secs(2),
        read_pct: 25,
        long_hold_ms: 0,
        permits: 0,
        other_permits: 0,
    };

    /// The worker's `SETTINGS`, for worker `id`.
    fn arg(&self, id: u32) -> String {
        let permits = if self.other_permits > 0 && id.is_multiple_of(4) {
            self.other_permits
        } else {
            self.permits
        };
        format!(
            "lease_ms={},wait_ms={},read_pct={},long_hold_ms={},permits={}",
            self.lease.as_millis(),
            self.wait.as_millis(),
            self.read_pct,
            self.long_hold_ms,
            permits
        )
    }
}

fn full() -> bool {
    std::env::var("FAULT_FULL").is_ok_and(|v| v != "0" && !v.is_empty())
}

/// How workers lock: `mixed` (attribute or manual, a coin per op) unless
/// `FAULT_MODE` says `manual` or `attr`.
fn worker_mode() -> &'static str {
    match std::env::var("FAULT_MODE").as_deref() {
        Ok("manual") => "manual",
        Ok("attr") => "attr",
        _ => "mixed",
    }
}

/// One scenario at a time.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

fn lock_keys(server: &RedisServer) -> Vec<String> {
    let mut k: Vec<String> = server
        .keys("lock:*")
        .into_iter()
        .filter(|k| !k.starts_with("lock:fence"))
        .collect();
    k.sort();
    k
}

/// A lock's waiter queue (`…:queue`, `…:waiters`).
fn is_queue(key: &str) -> bool {
    key.ends_with(":queue") || key.ends_with(":waiters")
}

fn signal(pid: u32, sig: libc::c_int) {
    // SAFETY: kill(2) on a child we spawned and have not reaped.
    let rc = unsafe { libc::kill(pid as libc::pid_t, sig) };
    assert_eq!(rc, 0, "kill({pid}, {sig}) failed");
}

fn rand_ms(lo: u64, hi: u64) -> Duration {
    Duration::from_millis(fastrand::u64(lo..hi))
}

// ---------------------------------------------------------------------------
// A fleet of fault_worker processes and what they report.

#[derive(Default)]
struct Live {
    /// Per process: ops holding a lock (op -> a read lock).
    holding: HashMap<u32, HashMap<u64, bool>>,
    /// Per process: an op in a long hold of a write lock, and until when
    /// (ns).
    in_hold: HashMap<u32, (u64, u64)>,
    /// Per process: `I <n>` — idle, with n locks still renewed.
    idle: HashMap<u32, usize>,
    errors: BTreeMap<String, u64>,
    error_samples: Vec<String>,
}

struct Worker {
    child: Child,
    stdin: Option<ChildStdin>,
    reader: Option<JoinHandle<()>>,
}

struct Fleet {
    /// Worker `id` locks through `lock_urls[(id - 1) % len]`.
    lock_urls: Vec<String>,
    store_url: String,
    keys: Vec<String>,
    tasks: usize,
    mode: &'static str,
    locking: Locking,
    next_id: u32,
    workers: BTreeMap<u32, Worker>,
    events: Arc<Mutex<Vec<Event>>>,
    faults: Arc<Mutex<Vec<Fault>>>,
    live: Arc<Mutex<Live>>,
    acquired: Arc<AtomicU64>,
}

impl Fleet {
    fn new(
        lock_urls: Vec<String>,
        store_url: String,
        keys: Vec<String>,
        tasks: usize,
        mode: &'static str,
        locking: Locking,
    ) -> Fleet {
        Fleet {
            lock_urls,
            store_url,
            keys,
            tasks,
            mode,
            locking,
            next_id: 1,
            workers: BTreeMap::new(),
            events: Arc::default(),
            faults: Arc::default(),
            live: Arc::default(),
            acquired: Arc::default(),
        }
    }

    fn fault(&self, proc_id: Option<u32>, kind: FaultKind) {
        self.faults.lock().unwrap().push(Fault::now(proc_id, kind));
    }

    fn spawn(&mut self) -> u32 {
        let id = self.next_id;
        self.next_id += 1;
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_fault_worker"));
        let url = &self.lock_urls[(id as usize - 1) % self.lock_urls.len()];
        cmd.args([
            url,
            &self.store_url,
            &id.to_string(),
            &self.keys.join(","),
            &self.tasks.to_string(),
            self.mode,
            &self.locking.arg(id),
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
        let mut child = spawn_tied(cmd).expect("spawn fault_worker");
        let stdout = child.stdout.take().unwrap();
        let stdin = child.stdin.take();
        let (events, live, acquired) = (
            self.events.clone(),
            self.live.clone(),
            self.acquired.clone(),
        );
        let reader = std::thread::spawn(move || read_worker(id, stdout, events, live, acquired));
        self.workers.insert(
            id,
            Worker {
                child,
                stdin,
                reader: Some(reader),
            },
        );
        id
    }

    fn ids(&self) -> Vec<u32> {
        self.workers.keys().copied().collect()
    }

    /// A process that holds a lock now (waits up to `patience` for one).
    fn pick_holder(&self, patience: Duration, in_long_hold: bool) -> u32 {
        let deadline = Instant::now() + patience;
        loop {
            {
                let live = self.live.lock().unwrap();
                let now = history::now_ns();
                let candidates: Vec<u32> = self
                    .workers
                    .keys()
                    .copied()
                    .filter(|p| {
                        if in_long_hold {
                            live.in_hold
                                .get(p)
                                .is_some_and(|&(_, until)| until > now + 30_000_000)
                        } else {
                            live.holding.get(p).is_some_and(|h| !h.is_empty())
                        }
                    })
                    .collect();
                if !candidates.is_empty() {
                    return candidates[fastrand::usize(..candidates.len())];
                }
            }
            if Instant::now() >= deadline {
                let ids = self.ids();
                return ids[fastrand::usize(..ids.len())];
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    fn kill(&mut self, id: u32) {
        let mut w = self.workers.remove(&id).expect("worker");
        let _ = w.child.kill();
        let _ = w.child.wait();
        self.fault(Some(id), FaultKind::Kill);
        if let Some(r) = w.reader.take() {
            r.join().unwrap();
        }
    }

    fn pause(&self, id: u32, for_: Duration) {
        let pid = self.workers[&id].child.id();
        self.fault(Some(id), FaultKind::Stop);
        signal(pid, libc::SIGSTOP);
        std::thread::sleep(for_);
        // Stamped before the signal: the woken worker may run (and write)
        // before this thread does again.
        self.fault(Some(id), FaultKind::Cont);
        signal(pid, libc::SIGCONT);
    }

    /// Stop every worker: no new ops; wait until each reports idle.
    fn stop_all(&mut self, limit: Duration) -> HashMap<u32, usize> {
        for w in self.workers.values_mut() {
            if let Some(stdin) = w.stdin.as_mut() {
                let _ = stdin.write_all(b"stop\n");
                let _ = stdin.flush();
            }
        }
        let ids = self.ids();
        let deadline = Instant::now() + limit;
        loop {
            let idle = self.live.lock().unwrap().idle.clone();
            if ids.iter().all(|id| idle.contains_key(id)) {
                return idle;
            }
            assert!(
                Instant::now() < deadline,
                "workers did not finish their ops within {limit:?}: idle {idle:?}"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Close stdin of every worker and wait for them to exit.
    fn exit_all(&mut self) {
        for (id, mut w) in std::mem::take(&mut self.workers) {
            drop(w.stdin.take());
            let status = w.child.wait().unwrap();
            assert!(status.success(), "worker {id} exited with {status:?}");
            self.fault(Some(id), FaultKind::Exit);
            if let Some(r) = w.reader.take() {
                r.join().unwrap();
            }
        }
    }

    fn history(&self) -> History {
        History {
            events: self.events.lock().unwrap().clone(),
            faults: self.faults.lock().unwrap().clone(),
        }
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        for w in self.workers.values_mut() {
            let _ = w.child.kill();
            let _ = w.child.wait();
        }
    }
}

fn read_worker(
    id: u32,
    stdout: std::process::ChildStdout,
    events: Arc<Mutex<Vec<Event>>>,
    live: Arc<Mutex<Live>>,
    acquired: Arc<AtomicU64>,
) {
    let mut r = BufReader::new(stdout);
    let mut buf = Vec::new();
    loop {
        buf.clear();
        match r.read_until(b'\n', &mut buf) {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        // A line without its newline was torn by SIGKILL: not an event.
        if buf.last() != Some(&b'\n') {
            return;
        }
        let line = String::from_utf8_lossy(&buf);
        let line = line.trim_end();
        if let Some(ev) = Event::parse(line) {
            assert_eq!(
                ev.proc_id, id,
                "worker {id} printed an event of another process"
            );
            let mut l = live.lock().unwrap();
            match ev.kind {
                Kind::Acquired { .. } | Kind::AcquiredRead { .. } | Kind::AcquiredPermit { .. } => {
                    acquired.fetch_add(1, Ordering::Relaxed);
                    // A permit holder is a target for SIGSTOP as a writer
                    // is (it holds a place others wait for).
                    let read = matches!(ev.kind, Kind::AcquiredRead { .. });
                    l.holding.entry(id).or_default().insert(ev.op, read);
                }
                // A reader writes nothing after its hold: no target for
                // the fencing case.
                Kind::Hold { ms }
                    if l.holding.get(&id).and_then(|h| h.get(&ev.op)) == Some(&false) =>
                {
                    l.in_hold.insert(id, (ev.op, ev.t + ms * 1_000_000));
                }
                Kind::Releasing | Kind::Lost | Kind::BodyEnd => {
                    l.holding.entry(id).or_default().remove(&ev.op);
                    if l.in_hold.get(&id).is_some_and(|&(op, _)| op == ev.op) {
                        l.in_hold.remove(&id);
                    }
                }
                _ => {}
            }
            drop(l);
            events.lock().unwrap().push(ev);
        } else if let Some(n) = line.strip_prefix("I ") {
            live.lock()
                .unwrap()
                .idle
                .insert(id, n.parse().expect("idle count"));
        } else if let Some(msg) = line.strip_prefix("E ") {
            let mut l = live.lock().unwrap();
            // Group by the message without numbers (ports, timings).
            let class: String = msg
                .chars()
                .filter(|c| !c.is_ascii_digit())
                .take(90)
                .collect();
            *l.errors.entry(class).or_default() += 1;
            if l.error_samples.len() < 5 {
                l.error_samples.push(msg.to_owned());
            }
        }
    }
}

// ---------------------------------------------------------------------------
// The nemesis.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Nemesis {
    KillHolder,
    PauseHolder,
    RestartRedis,
    Delay,
    Drop,
    Blackhole,
    Cut,
    Refuse,
    /// One client's command traffic (its reconnections too) gets its
    /// replies 1-2.5 s late for about 3 s; its subscriptions and every
    /// other client stay fast.
    SlowSpell,
    /// An acquire's reply is lost, and the connection that sends it again
    /// is slow: its requests reach Redis 0.2-0.6 s late (a release may hand
    /// the lock over meanwhile), its replies come 1.1-1.25 s after that,
    /// past the client's orphan-grant timer (`ORPHAN_AFTER`, 1 s) and
    /// within the re-send's operation timeout; every other connection,
    /// subscriptions included, stays fast.
    ReplyPastOrphan,
    /// The transport sends a lock command (an acquire or a release) again,
    /// 0.1-1 s after the first, on a connection of its own.
    Resend,
}

/// The SHA1s by which EVALSHA names the lock scripts a transport may send
/// again: the two every operation of the fleet sends. Its holds are far
/// shorter than a third of the lease, so renewals are rare (a re-sent
/// renewal has its own tests in `delayed_replies.rs`); arming one here
/// would mostly find nothing to copy.
fn resendable_scripts() -> [Vec<u8>; 2] {
    use tests::reply_loss::{acquire_sha, release_sha};
    [acquire_sha(), release_sha()]
}

/// Wait up to `limit` for `done`, checking every few ms.
fn within(limit: Duration, mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    while !done() {
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    true
}

struct Scenario<'a> {
    fleet: Fleet,
    server: &'a mut RedisServer,
    /// Between the workers and Redis: one for all, or one per worker.
    proxies: &'a [Proxy],
    /// The server comes back empty after a restart.
    wipes: bool,
}

impl Scenario<'_> {
    /// A proxy picked at random: one client's, when each has its own.
    fn some_proxy(&self) -> &Proxy {
        &self.proxies[fastrand::usize(..self.proxies.len())]
    }

    fn inject(&mut self, n: Nemesis) {
        let proxy_for = |s: &Self, mode: Mode, kind: FaultKind, d: Duration| {
            s.fleet.fault(None, kind);
            for p in s.proxies {
                p.set(mode);
            }
            std::thread::sleep(d);
            for p in s.proxies {
                p.set(Mode::Pass);
            }
            s.fleet.fault(None, FaultKind::ProxyHeal);
        };
        match n {
            Nemesis::KillHolder => {
                let id = self.fleet.pick_holder(Duration::from_secs(1), false);
                self.fleet.kill(id);
                self.fleet.spawn();
            }
            Nemesis::PauseHolder => {
                // Best: a writer in the middle of a long hold, so its next
                // write comes after its lease ran out.
                let id = self.fleet.pick_holder(Duration::from_secs(3), true);
                let d = LEASE.mul_f64(1.5 + fastrand::f64());
                self.fleet.pause(id, d);
            }
            Nemesis::RestartRedis => {
                self.fleet
                    .fault(None, FaultKind::RedisDown { wipe: self.wipes });
                self.server.restart();
                self.fleet
                    .fault(None, FaultKind::RedisUp { wipe: self.wipes });
            }
            Nemesis::Delay => {
                let ms = fastrand::u64(30..300);
                proxy_for(
                    self,
                    Mode::Delay(Duration::from_millis(ms)),
                    FaultKind::ProxyDelay { ms },
                    rand_ms(800, 2000),
                );
            }
            Nemesis::Drop => proxy_for(self, Mode::Drop, FaultKind::ProxyDrop, rand_ms(200, 800)),
            Nemesis::Blackhole => proxy_for(
                self,
                Mode::Blackhole,
                FaultKind::ProxyBlackhole,
                rand_ms(300, 2000),
            ),
            Nemesis::Refuse => proxy_for(
                self,
                Mode::Refuse,
                FaultKind::ProxyRefuse,
                rand_ms(200, 1200),
            ),
            Nemesis::Cut => {
                self.fleet.fault(None, FaultKind::ProxyCut);
                for p in self.proxies {
                    p.cut();
                }
            }
            Nemesis::SlowSpell => {
                let p = self.some_proxy();
                let ms = fastrand::u64(1000..2500);
                self.fleet.fault(None, FaultKind::ProxySlowSpell { ms });
                p.set(Mode::DelayReplies(Duration::from_millis(ms)));
                std::thread::sleep(rand_ms(2500, 3500));
                p.set(Mode::Pass);
                self.fleet.fault(None, FaultKind::ProxyHeal);
            }
            Nemesis::ReplyPastOrphan => {
                let p = self.some_proxy();
                let ms = fastrand::u64(1100..1250);
                let lost = p.replies_lost();
                p.lose_reply_to_then_slow(
                    &tests::reply_loss::acquire_sha(),
                    rand_ms(200, 600),
                    Duration::from_millis(ms),
                );
                // Recorded once the reply was lost (an acquire may take a
                // while to come): the slow spell starts with the re-send.
                if within(Duration::from_secs(3), || p.replies_lost() > lost) {
                    self.fleet.fault(None, FaultKind::ProxyLateRepeat { ms });
                    std::thread::sleep(rand_ms(2500, 3500));
                    self.fleet.fault(None, FaultKind::ProxyHeal);
                }
                p.disarm();
                p.end_slow_spell();
            }
            Nemesis::Resend => {
                let p = self.some_proxy();
                let scripts = resendable_scripts();
                let script = &scripts[fastrand::usize(..scripts.len())];
                let after_ms = fastrand::u64(100..1000);
                let sent = p.stats().resent;
                p.resend(script, Duration::from_millis(after_ms));
                // Recorded when the copy has run: the checker counts a
                // lease from then in which the lock may be held for an
                // owner that is done with it.
                if within(
                    Duration::from_secs(3) + Duration::from_millis(after_ms),
                    || p.stats().resent > sent,
                ) {
                    self.fleet.fault(None, FaultKind::ProxyResend { after_ms });
                }
                p.disarm();
            }
        }
    }
}

struct Plan {
    title: &'static str,
    target: u64,
    limit: Duration,
    schedule: Vec<Nemesis>,
    /// Of the lock commands (EVALSHA) on every proxy, this share runs on
    /// Redis and loses its reply, all the run long.
    reply_loss: f64,
    /// The run goes on (within the limit's extension) until a holder
    /// paused past its lease has written after it, and after a newer
    /// holder's write: the case fencing is for. A pause may find no writer
    /// in a long hold, or its holder may hear of the loss before its
    /// write.
    fencing_case: bool,
}

/// Faults after which a lock command may run on Redis for an owner that is
/// done with it (a re-sent acquire, an attempt whose answer was lost): what
/// it leaves lapses on its own, within a lease or a waiter's stay.
fn leaves_lapsing_state(kind: FaultKind) -> bool {
    matches!(
        kind,
        FaultKind::ProxyResend { .. }
            | FaultKind::ProxyLateRepeat { .. }
            | FaultKind::ProxySlowSpell { .. }
    )
}

/// Run workers under the nemesis until `target` acquisitions and one full
/// schedule, then stop, measure, check. Returns the report (printed).
fn run(mut s: Scenario<'_>, plan: Plan, workers: usize) -> Report {
    for _ in 0..workers {
        s.fleet.spawn();
    }
    let locking = s.fleet.locking;
    for p in s.proxies {
        p.lose_replies(b"EVAL", plan.reply_loss);
    }
    let started = Instant::now();
    let mut i = 0;
    // Every kind of fault in the schedule fires at least once (one that
    // found no command to act on is tried again).
    let kinds = {
        let mut k: Vec<_> = plan.schedule.iter().map(std::mem::discriminant).collect();
        k.sort_by_key(|d| format!("{d:?}"));
        k.dedup();
        k.len()
    };
    let fired = |s: &Scenario<'_>| {
        let faults = s.fleet.faults.lock().unwrap();
        let mut labels: Vec<&str> = faults.iter().filter_map(|f| f.kind.label()).collect();
        labels.sort_unstable();
        labels.dedup();
        labels.len()
    };
    let cfg = CheckConfig {
        lease: locking.lease,
        slop: Duration::from_millis(150),
        op_timeout: Some(OP_TIMEOUT),
        body_end_bounds: false,
    };
    let mut fencing_seen = !plan.fencing_case;
    // A kind (or the fencing case) still missing at the limit gets up to
    // twice the limit more.
    loop {
        let elapsed = started.elapsed();
        let kinds_missing = fired(&s) < kinds;
        let planned = s.fleet.acquired.load(Ordering::Relaxed) < plan.target
            || i < plan.schedule.len()
            || kinds_missing;
        if !fencing_seen && (!planned || elapsed >= plan.limit) {
            // Read from the history so far: once per fault, near the end.
            // (A holder paused past its lease while another took its key,
            // as `nemesis_history_with_fencing` asserts: a stale write
            // reaching the store is rare since `lost()` resolves by the
            // clock, and waiting for one ran the scenario to 3 × its limit.)
            fencing_seen = history::check(&s.fleet.history(), &cfg)
                .excused
                .get("paused (SIGSTOP past the lease)")
                .is_some_and(|e| e.0 >= 1);
        }
        let done = !planned && fencing_seen;
        let missing = kinds_missing || !fencing_seen;
        if done || elapsed >= plan.limit * 3 || (elapsed >= plan.limit && !missing) {
            break;
        }
        // Let the clients work between faults.
        std::thread::sleep(rand_ms(200, 600));
        s.inject(plan.schedule[i % plan.schedule.len()]);
        i += 1;
        if full() && i % 50 == 0 {
            println!(
                "  [{}] {:.0} s: {} acquisitions, {i} faults",
                plan.title,
                started.elapsed().as_secs_f64(),
                s.fleet.acquired.load(Ordering::Relaxed)
            );
        }
    }
    let ran_for = started.elapsed();
    let faults_end = history::now_ns();
    for p in s.proxies {
        p.lose_replies(b"", 0.0);
        p.disarm();
        p.end_slow_spell();
        p.set(Mode::Pass);
    }

    // Ops in flight may wait their whole `wait`, and one op_timeout more.
    let idle = s
        .fleet
        .stop_all(Duration::from_secs(30).max(locking.wait * 2 + OP_TIMEOUT));
    let renewing: usize = idle.values().sum();
    // A grant message that crossed a waiter's timeout is released by its
    // client 1 s later (an unclaimed grant, `ORPHAN_AFTER`), plus that
    // release's round trip; an undo that could not first kill the ended
    // connection its attempt went on (Redis unreachable then) is sent once
    // more an op_timeout later, within an op_timeout. The quiet period
    // starts after both.
    std::thread::sleep(
        Duration::from_millis(1_500).max(OP_TIMEOUT * 2 + Duration::from_millis(500)),
    );
    // Quiet period: idle clients must send no lock commands (a renewal
    // comes every lease/3).
    s.server.reset_stats();
    std::thread::sleep((locking.lease * 2 / 3).max(LEASE * 2));
    let orphan_renewals = s.server.calls("evalsha");
    // A waiter's place in a queue lapses on its own within retry_delay +
    // jitter + 2 x op_timeout (1 s + 50 ms + 4 s here) of its last attempt.
    let stay = Duration::from_millis(5_600);
    // What a command run for an owner that is done with it left lapses
    // within a lease, or a waiter's stay.
    let last_transport = s
        .fleet
        .faults
        .lock()
        .unwrap()
        .iter()
        .filter(|f| leaves_lapsing_state(f.kind))
        .map(|f| f.t)
        .chain((plan.reply_loss > 0.0).then_some(faults_end))
        .max();
    if let Some(t) = last_transport {
        let lapse_at = t + (locking.lease.max(stay) + locking.lease / 3).as_nanos() as u64;
        while !lock_keys(s.server).is_empty() && history::now_ns() < lapse_at {
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    // Locks of killed holders expire one lease after their last renewal.
    let last_kill = s
        .fleet
        .faults
        .lock()
        .unwrap()
        .iter()
        .filter(|f| f.kind == FaultKind::Kill)
        .map(|f| f.t)
        .max()
        .unwrap_or(0);
    let expire_at = last_kill + (locking.lease + Duration::from_millis(200)).as_nanos() as u64;
    let now = history::now_ns();
    if expire_at > now {
        std::thread::sleep(Duration::from_nanos(expire_at - now));
    }
    let mut leftover = lock_keys(s.server);
    // A killed waiter's place in a queue lapses on its own.
    let lapse_at = last_kill + stay.as_nanos() as u64;
    while leftover.iter().any(|k| is_queue(k)) && history::now_ns() < lapse_at {
        std::thread::sleep(Duration::from_millis(100));
        leftover = lock_keys(s.server);
    }
    s.fleet.exit_all();

    let hist = s.fleet.history();
    dump(&hist, plan.title);
    let mut report = history::check(&hist, &cfg);
    report.orphan_renewals = Some(orphan_renewals + renewing as u64);
    report.leftover_keys = Some(leftover);
    report.extra.push((
        "ran for".into(),
        format!(
            "{:.1} s under the nemesis ({} faults), {} worker processes x {} tasks on {} keys; lease {:?}, wait {:?}, {} % readers",
            ran_for.as_secs_f64(),
            i,
            workers,
            s.fleet.tasks,
            s.fleet.keys.len(),
            locking.lease,
            locking.wait,
            locking.read_pct
        ),
    ));
    let mut ps = tests::proxy::ProxyStats::default();
    for p in s.proxies {
        let st = p.stats();
        ps.accepted += st.accepted;
        ps.refused += st.refused;
        ps.cut += st.cut;
        ps.bytes_forwarded += st.bytes_forwarded;
        ps.bytes_dropped += st.bytes_dropped;
        ps.replies_lost += st.replies_lost;
        ps.slowed += st.slowed;
        ps.resent += st.resent;
    }
    report.extra.push((
        format!(
            "prox{}",
            if s.proxies.len() > 1 { "ies" } else { "y" }
        ),
        format!(
            "{} connections, {} refused, {} cut, {} KiB forwarded, {} B dropped, {} replies lost, {} connections slowed, {} commands re-sent",
            ps.accepted,
            ps.refused,
            ps.cut,
            ps.bytes_forwarded / 1024,
            ps.bytes_dropped,
            ps.replies_lost,
            ps.slowed,
            ps.resent
        ),
    ));
    let live = s.fleet.live.lock().unwrap();
    let errs: u64 = live.errors.values().sum();
    report.extra.push((
        "client errors seen".into(),
        format!(
            "{errs} ({} kinds); e.g. {:?}",
            live.errors.len(),
            live.error_samples.iter().take(2).collect::<Vec<_>>()
        ),
    ));
    drop(live);
    println!("{}", report.table(plan.title));
    print_examples(&report, &hist);
    report
}

/// The first violation of each kind, with the trace of the ops involved.
fn print_examples(report: &Report, hist: &History) {
    let mut shown: Vec<&str> = Vec::new();
    for c in &report.culprits {
        if shown.contains(&c.kind) {
            continue;
        }
        shown.push(c.kind);
        println!(
            "  example, {}: {}\n{}",
            c.kind,
            c.what,
            history::trace(hist, &c.ops)
        );
    }
}

/// `FAULT_DUMP=dir`: write the history there, one line per event or fault.
fn dump(hist: &History, title: &str) {
    let Ok(dir) = std::env::var("FAULT_DUMP") else {
        return;
    };
    let name: String = title
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    let mut out = String::new();
    for e in &hist.events {
        out.push_str(&e.to_line());
        out.push('\n');
    }
    for f in &hist.faults {
        out.push_str(&format!("F {} {:?} {:?}\n", f.t, f.proc_id, f.kind));
    }
    std::fs::write(
        std::path::Path::new(&dir).join(format!("{name}.history")),
        out,
    )
    .expect("write history dump");
}

fn schedule_all() -> Vec<Nemesis> {
    use Nemesis::*;
    vec![
        KillHolder,
        PauseHolder,
        Delay,
        RestartRedis,
        Drop,
        KillHolder,
        Blackhole,
        PauseHolder,
        Cut,
        Refuse,
    ]
}

/// Fenced-store end check: the value in the store is the one written with
/// the highest fence that was accepted (or whose reply was lost).
fn check_store(
    rt: &tokio::runtime::Runtime,
    store_url: &str,
    keys: &[String],
    hist: &History,
) -> String {
    let mut best: HashMap<&str, u64> = HashMap::new();
    let mut carried: HashMap<&str, std::collections::HashSet<u64>> = HashMap::new();
    for e in &hist.events {
        match e.kind {
            Kind::WriteOk { fence } => {
                let b = best.entry(&e.key).or_default();
                *b = (*b).max(fence);
            }
            Kind::Write { fence } => {
                carried.entry(&e.key).or_default().insert(fence);
            }
            _ => {}
        }
    }
    rt.block_on(async {
        let store = FencedStore::connect(store_url).await.unwrap();
        let mut out = Vec::new();
        for k in keys {
            let Some((fence, _value)) = store.read(k).await.unwrap() else {
                assert!(
                    !best.contains_key(k.as_str()),
                    "{k}: accepted writes but nothing stored"
                );
                continue;
            };
            let accepted = best.get(k.as_str()).copied().unwrap_or(0);
            assert!(
                fence >= accepted && carried.get(k.as_str()).is_some_and(|c| c.contains(&fence)),
                "{k}: the store holds fence {fence}, the highest accepted write had {accepted}"
            );
            out.push(format!("{k}={fence}"));
        }
        out.join(" ")
    })
}

/// ≥ 10^5 acquisitions with `FAULT_FULL=1`; a few thousand otherwise.
#[test]
fn nemesis_history_with_fencing() {
    let _serial = serial();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mut server = RedisServer::start_with(&[
        "--appendonly",
        "yes",
        "--appendfsync",
        "always",
        "--save",
        "",
    ]);
    let store_server = RedisServer::start();
    let proxy = Proxy::for_server(&server);
    let (workers, tasks, nkeys, target, limit) = if full() {
        (6, 6, 6, 100_000, Duration::from_secs(3600))
    } else {
        (4, 4, 4, 3_000, Duration::from_secs(60))
    };
    let keys: Vec<String> = (0..nkeys).map(|i| unique(&format!("hot{i}"))).collect();
    let fleet = Fleet::new(
        vec![proxy.url()],
        store_server.url(),
        keys.clone(),
        tasks,
        worker_mode(),
        Locking::CLASSIC,
    );
    let plan = Plan {
        title: "nemesis + fencing (Redis with AOF, behind the fault proxy)",
        target,
        limit,
        schedule: schedule_all(),
        reply_loss: 0.0,
        fencing_case: true,
    };
    let scenario = Scenario {
        fleet,
        server: &mut server,
        proxies: std::slice::from_ref(&proxy),
        wipes: false,
    };
    let events = scenario.fleet.events.clone();
    let faults = scenario.fleet.faults.clone();
    let report = run(scenario, plan, workers);
    let hist = History {
        events: events.lock().unwrap().clone(),
        faults: faults.lock().unwrap().clone(),
    };
    let stored = check_store(&rt, &store_server.url(), &keys, &hist);
    println!("  {:<38} {stored}", "store (key=fence) at the end");
    report.assert_clean();
    assert!(
        report.acquisitions >= target,
        "only {} acquisitions in {limit:?}",
        report.acquisitions
    );
    for kind in [
        "kill -9 holder",
        "SIGSTOP > lease",
        "redis restart (persistent)",
        "proxy delay",
        "proxy drop",
        "proxy black hole",
        "proxy cut",
        "proxy refuse",
    ] {
        assert!(
            report.faults.get(kind).copied().unwrap_or(0) >= 1,
            "no {kind} injected"
        );
    }
    // The fencing case really happened: holders were stopped past their
    // lease while others took their keys. Since `lost()` resolves by the
    // clock, a resumed body is stopped before its next write, so a stale
    // write reaches the store only when it was on its way as the process
    // stopped (some runs have none): every one the store saw, it refused.
    let paused = report
        .excused
        .get("paused (SIGSTOP past the lease)")
        .map_or(0, |e| e.0);
    assert!(
        paused >= 1,
        "no holder was paused past its lease while another took its key: \
         the scenario did not exercise fencing"
    );
    assert_eq!(report.stale_rejected, report.stale_attempted);
    assert_eq!(report.paused_writes_rejected, report.paused_writes_stale);
}

/// Redis restarts empty under load: the lock's guarantees are gone for the
/// holders of that moment (documented), so the checker demands only what
/// the library promises — every such holder is told (`Lost` or a failed
/// release), none is confirmed across the wipe, and fences increase within
/// each life of the server.
#[test]
fn restarts_without_persistence_under_load() {
    let _serial = serial();
    let mut server = RedisServer::start();
    let proxy = Proxy::for_server(&server);
    let keys: Vec<String> = (0..3).map(|i| unique(&format!("wipe{i}"))).collect();
    let (target, limit) = if full() {
        (20_000, Duration::from_secs(1200))
    } else {
        (1_000, Duration::from_secs(40))
    };
    let fleet = Fleet::new(
        vec![proxy.url()],
        "-".into(),
        keys,
        3,
        "manual",
        Locking::CLASSIC,
    );
    use Nemesis::*;
    let plan = Plan {
        title: "Redis restarts without persistence (no fencing possible across a wipe)",
        target,
        limit,
        schedule: vec![RestartRedis, KillHolder, RestartRedis, Cut, RestartRedis],
        reply_loss: 0.0,
        fencing_case: false,
    };
    let scenario = Scenario {
        fleet,
        server: &mut server,
        proxies: std::slice::from_ref(&proxy),
        wipes: true,
    };
    let report = run(scenario, plan, 3);
    report.assert_clean();
    assert!(
        report.acquisitions >= target,
        "only {} acquisitions",
        report.acquisitions
    );
    assert!(
        report
            .faults
            .get("redis restart (empty)")
            .copied()
            .unwrap_or(0)
            >= 3
    );
}

// ---------------------------------------------------------------------------
// Delayed, lost and repeated replies, one client at a time.

/// How long a time-bounded scenario runs under its nemesis: `FAULT_SECS`
/// if set, else `full` seconds with `FAULT_FULL=1`, else `bounded`.
fn run_time(bounded: u64, full_secs: u64) -> Duration {
    let secs = std::env::var("FAULT_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if full() { full_secs } else { bounded });
    Duration::from_secs(secs)
}

/// 16 tasks on 4 clients contend for 2 keys, each client behind a proxy
/// of its own that spares its subscriptions; `reply_loss` of the lock
/// commands run on Redis and lose their reply (the connection is cut), and
/// the nemesis runs `schedule`. Lease 5 s (longer than any delay here),
/// wait 12 s. Judged by the checker, and the fenced store.
fn one_client_at_a_time(
    title: &'static str,
    read_pct: u32,
    reply_loss: f64,
    schedule: Vec<Nemesis>,
    run_for: Duration,
) -> Report {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mut server = RedisServer::start();
    let store_server = RedisServer::start();
    let proxies: Vec<Proxy> = (0..4).map(|_| Proxy::for_server(&server)).collect();
    for p in &proxies {
        p.spare_pubsub();
    }
    let keys: Vec<String> = (0..2).map(|i| unique(&format!("contended{i}"))).collect();
    let fleet = Fleet::new(
        proxies.iter().map(Proxy::url).collect(),
        store_server.url(),
        keys.clone(),
        4,
        worker_mode(),
        Locking {
            lease: Duration::from_secs(5),
            wait: Duration::from_secs(12),
            read_pct,
            long_hold_ms: 0,
            permits: 0,
            other_permits: 0,
        },
    );
    let plan = Plan {
        title,
        target: u64::MAX,
        limit: run_for,
        schedule,
        reply_loss,
        fencing_case: false,
    };
    let scenario = Scenario {
        fleet,
        server: &mut server,
        proxies: &proxies,
        wipes: false,
    };
    let events = scenario.fleet.events.clone();
    let faults = scenario.fleet.faults.clone();
    let report = run(scenario, plan, 4);
    let hist = History {
        events: events.lock().unwrap().clone(),
        faults: faults.lock().unwrap().clone(),
    };
    let stored = check_store(&rt, &store_server.url(), &keys, &hist);
    println!("  {:<38} {stored}", "store (key=fence) at the end");
    let lost: u64 = proxies.iter().map(Proxy::replies_lost).sum();
    assert!(
        reply_loss == 0.0 || lost > 0,
        "no reply was lost: the nemesis did not run"
    );
    assert!(
        report.acquisitions >= 100,
        "only {} acquisitions: the clients hardly ran",
        report.acquisitions
    );
    report
}

/// The outside nemesis that found bodies running without their lock: about
/// 3 % of the lock commands lose their reply after they ran, and one
/// client at a time gets its replies 1-2.5 s late in 3 s spells, its
/// subscriptions spared. Write locks only. 15 s bounded, 4 minutes with
/// `FAULT_FULL=1` (`FAULT_SECS` to choose).
#[test]
fn outside_nemesis_write_locks() {
    let _serial = serial();
    let report = one_client_at_a_time(
        "outside nemesis: 3 % replies lost, 1-2.5 s slow spells (write locks)",
        0,
        0.03,
        vec![Nemesis::SlowSpell],
        run_time(15, 240),
    );
    assert!(report.faults["slow spell, one connection"] >= 1);
    report.assert_clean();
}

/// The same with 60 % readers.
#[test]
fn outside_nemesis_read_write_locks() {
    let _serial = serial();
    let report = one_client_at_a_time(
        "outside nemesis: 3 % replies lost, 1-2.5 s slow spells (60 % readers)",
        60,
        0.03,
        vec![Nemesis::SlowSpell],
        run_time(15, 240),
    );
    assert!(report.read_acquisitions >= 10);
    report.assert_clean();
}

/// A semaphore of two permits on one Redis: 4 worker processes x 3 tasks
/// on 2 keys, each process behind a proxy of its own (subscriptions
/// spared) that loses the reply of 3 % of the lock commands after they
/// ran, while the nemesis kills holders and stops them past their lease
/// (SIGSTOP); every fourth process asks for three permits (a version that
/// disagrees on N). At no admission more holders than permits, by each
/// call's own N (a paused holder counted while its permit is surely valid,
/// `history.rs`), tokens unique, no call failed with time left, nothing
/// left behind, no renewal once idle. 12 s bounded, 4 minutes with
/// `FAULT_FULL=1`.
#[test]
fn semaphore_under_kills_pauses_and_lost_replies() {
    let _serial = serial();
    let mut server = RedisServer::start();
    let proxies: Vec<Proxy> = (0..4).map(|_| Proxy::for_server(&server)).collect();
    for p in &proxies {
        p.spare_pubsub();
    }
    let keys: Vec<String> = (0..2).map(|i| unique(&format!("permits{i}"))).collect();
    let fleet = Fleet::new(
        proxies.iter().map(Proxy::url).collect(),
        "-".into(),
        keys,
        3,
        "manual",
        Locking {
            permits: 2,
            other_permits: 3,
            read_pct: 0,
            ..Locking::CLASSIC
        },
    );
    use Nemesis::*;
    let plan = Plan {
        title: "semaphore of 2 (and of 3): kills, SIGSTOP past the lease, 3 % replies lost",
        target: u64::MAX,
        limit: run_time(12, 240),
        schedule: vec![KillHolder, PauseHolder, PauseHolder],
        reply_loss: 0.03,
        fencing_case: false,
    };
    let scenario = Scenario {
        fleet,
        server: &mut server,
        proxies: &proxies,
        wipes: false,
    };
    let report = run(scenario, plan, 4);
    let lost: u64 = proxies.iter().map(Proxy::replies_lost).sum();
    assert!(lost > 0, "no reply was lost: the nemesis did not run");
    for kind in ["kill -9 holder", "SIGSTOP > lease"] {
        assert!(
            report.faults.get(kind).copied().unwrap_or(0) >= 1,
            "no {kind} injected"
        );
    }
    assert!(
        report.permit_acquisitions >= 100,
        "only {} permits: the clients hardly ran",
        report.permit_acquisitions
    );
    assert!(
        report.max_permit_holders.0 >= 2,
        "two holders of a key at once never happened"
    );
    report.assert_clean();
}

/// A Redis Cluster under load while its locks' slots migrate back and
/// forth between primaries, each held half moved for a while
/// (`fault_suite/cluster_nemesis.rs`): no two holders at once, no call
/// failed with wait left, no release failed, nothing left behind. 12 s of
/// migrations bounded, 4 minutes with `FAULT_FULL=1`.
#[test]
fn cluster_slot_migrations_under_load() {
    let _serial = serial();
    let run = cluster_nemesis::run(run_time(12, 240), cluster_nemesis::Moves::HeldHalf);
    println!(
        "{}",
        run.report
            .table("Cluster under load, slots migrating between primaries")
    );
    assert!(run.migrations >= 2, "only {} migrations", run.migrations);
    assert!(run.longest_mixed > 2 * OP_TIMEOUT);
    assert!(
        run.report.acquisitions >= 60,
        "only {} acquisitions: the clients hardly ran",
        run.report.acquisitions
    );
    assert_eq!(run.report.failures, 0, "lock calls failed");
    assert_eq!(run.release_failures, 0, "releases failed");
    assert!(run.leftover.is_empty(), "left behind: {:?}", run.leftover);
    run.report.assert_clean();
}

/// A Redis Cluster under load while an operator's resharding moves its
/// locks' slots whole, through the holds (`fault_suite/cluster_nemesis.rs`,
/// `Moves::Resharding`): no move slowed by the locks (each within twice the
/// same move alone, plus 3 s), no `MIGRATE` error, no two holders at once,
/// no call failed with wait left, no release failed, nothing left behind.
/// 12 s bounded, 4 minutes with `FAULT_FULL=1`.
#[test]
fn cluster_resharding_with_holds() {
    let _serial = serial();
    let run = cluster_nemesis::run(run_time(12, 240), cluster_nemesis::Moves::Resharding);
    println!(
        "{}",
        run.report
            .table("Cluster under load, slots resharded whole through the holds")
    );
    assert!(run.migrations >= 2, "only {} reshardings", run.migrations);
    assert!(
        run.longest_move < run.alone * 2 + Duration::from_secs(3),
        "a resharding took {:?} under load, {:?} alone",
        run.longest_move,
        run.alone
    );
    assert!(
        run.move_errors.is_empty(),
        "MIGRATE failed: {:?}",
        run.move_errors
    );
    assert!(
        run.report.acquisitions >= 60,
        "only {} acquisitions: the clients hardly ran",
        run.report.acquisitions
    );
    assert_eq!(run.report.failures, 0, "lock calls failed");
    assert_eq!(run.release_failures, 0, "releases failed");
    assert!(run.leftover.is_empty(), "left behind: {:?}", run.leftover);
    run.report.assert_clean();
}

/// PostgreSQL under the nemesis (`postgres_nemesis.rs`): holders killed
/// and paused, the server paused, its connections terminated, the server
/// crashed and recovered, proxy connections cut, and 3 % of the lock
/// statements' replies lost after they ran. 0 double holders by the
/// history checker, and nothing left held at the end. 15 s bounded
/// (`FAULT_SECS`), 4 minutes with `FAULT_FULL=1`.
#[test]
fn postgres_under_the_nemesis() {
    let _serial = serial();
    let run = postgres_nemesis::run(run_time(15, 240), 0.03);
    println!(
        "{}",
        run.report.table(
            "PostgreSQL (fsync on) behind the fault proxy: kills, pauses, server SIGSTOP, \
             pg_terminate_backend, immediate-stop restarts, cuts, 3 % replies lost \
             (restarts counted as `redis restart (persistent)`, server pauses as black holes, \
             terminations as cuts)"
        )
    );
    println!("  {:<38} {:?}", "faults injected", run.faults);
    assert!(run.replies_lost > 0, "no reply was lost");
    assert!(run.terminated > 0, "no connection was terminated");
    assert!(
        run.report.acquisitions >= 200,
        "only {} acquisitions",
        run.report.acquisitions
    );
    assert_eq!(run.leftover, 0, "holds left behind");
    run.report.assert_clean();
}

/// Each reply fault on its own, in turn: an acquire's reply lost and its
/// re-send answered past the orphan-grant timer, a slow spell, a command
/// re-sent by the transport. A quarter of the ops read. 15 s bounded,
/// 4 minutes with `FAULT_FULL=1`.
#[test]
fn reply_faults_one_connection_at_a_time() {
    let _serial = serial();
    use Nemesis::*;
    let report = one_client_at_a_time(
        "late repeats, slow spells, re-sent commands (25 % readers)",
        25,
        0.0,
        vec![ReplyPastOrphan, Resend, ReplyPastOrphan, SlowSpell],
        run_time(15, 240),
    );
    for kind in [
        "reply lost, repeat answered late",
        "command re-sent by the transport",
        "slow spell, one connection",
    ] {
        assert!(
            report.faults.get(kind).copied().unwrap_or(0) >= 1,
            "no {kind} injected"
        );
    }
    report.assert_clean();
}

/// Sentinel under load with the primary failing over (one failover
/// bounded, one every 20 s with `FAULT_FULL=1`): with `replica_acks` never
/// two bodies at once; without, only where the earlier holder was told
/// `Lost` within a lease. See `fault_suite/sentinel_nemesis.rs`.
#[test]
fn sentinel_failovers_under_load() {
    let _serial = serial();
    sentinel_nemesis::failovers_under_load();
}

/// Planned failovers under load: nothing stranded, no call with wait left
/// failed. See `fault_suite/sentinel_nemesis.rs`.
#[test]
fn sentinel_planned_failovers_under_load() {
    let _serial = serial();
    sentinel_nemesis::planned_failovers_under_load();
}

#[path = "fault_suite/sentinel_nemesis.rs"]
mod sentinel_nemesis;

// ---------------------------------------------------------------------------
// Focused scenarios.

fn lock_worker(args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_lock_worker"));
    cmd.args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    cmd
}

/// A holder killed with SIGKILL: the lock is free again within lease +
/// retry delay, every time.
#[test]
fn holder_crash_frees_the_lock_within_lease_plus_retry_delay() {
    let _serial = serial();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let server = RedisServer::start();
    let retry_delay = Duration::from_millis(1000);
    let lease = Duration::from_millis(1000);
    let client = rt
        .block_on(
            LockClient::builder()
                .wait(Duration::ZERO) // tries once unless a request says otherwise
                .retry_delay(retry_delay)
                .connect(&server.url()),
        )
        .unwrap();
    let runs = if full() { 30 } else { 6 };
    let bound = lease + retry_delay;
    let mut freed = Vec::new();
    for run in 0..runs {
        let key = unique("crash");
        let mut child = spawn_tied(lock_worker(&[
            "hold",
            &server.url(),
            &key,
            &lease.as_millis().to_string(),
        ]))
        .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert!(line.starts_with("HELD "), "holder said {line:?}");
        // Kill at a random point of the renewal cycle.
        std::thread::sleep(rand_ms(0, lease.as_millis() as u64));
        let (c, k) = (client.clone(), key.clone());
        let waiter = rt.spawn(async move {
            let g = c.lock(&k).wait(Duration::from_secs(10)).await;
            (history::now_ns(), g)
        });
        rt.block_on(async {
            assert!(
                eventually(Duration::from_secs(5), || client.waiting_here(&key) == 1).await,
                "run {run}: the waiter never waited"
            );
        });
        child.kill().unwrap();
        child.wait().unwrap();
        let killed_at = history::now_ns();
        let (got_at, guard) = rt.block_on(waiter).unwrap();
        let guard = guard.unwrap_or_else(|e| {
            panic!("run {run}: lock never came free after the holder died: {e}")
        });
        let took = Duration::from_nanos(got_at.saturating_sub(killed_at));
        assert!(
            took <= bound,
            "run {run}: free only {took:?} after the holder died (bound {bound:?})"
        );
        rt.block_on(guard.release()).unwrap();
        freed.push(took);
    }
    freed.sort();
    println!(
        "\n== holder crash ==\n  {:<38} {runs}\n  {:<38} min {:?}, median {:?}, max {:?} (bound lease + retry delay = {bound:?})",
        "holders killed (SIGKILL)",
        "lock free again after",
        freed[0],
        freed[freed.len() / 2],
        freed[freed.len() - 1]
    );
}

/// Poll Redis while guards are held: a guard whose lock Redis no longer has
/// must report `Lost` within `notice`. Returns (lost, still held and
/// present) at the end of `watch`.
async fn never_silently_holding(
    server: &RedisServer,
    guards: &[lock_runtime::LockGuard],
    watch: Duration,
    notice: Duration,
) -> (usize, usize) {
    let mut missing_since: HashMap<usize, Instant> = HashMap::new();
    let end = Instant::now() + watch;
    while Instant::now() < end {
        // Redis down: nothing to compare with this round.
        if let Ok(mut conn) = redis::Client::open(server.url())
            .and_then(|c| c.get_connection_with_timeout(Duration::from_millis(200)))
        {
            for (i, g) in guards.iter().enumerate() {
                if g.is_lost() {
                    continue;
                }
                let hash = format!("lock:{{{}}}", g.key());
                let Ok(value) = redis::cmd("GET")
                    .arg(&hash)
                    .query::<Option<String>>(&mut conn)
                else {
                    break;
                };
                if value.as_deref().map(tests::owner_in) == Some(g.holder()) {
                    missing_since.remove(&i);
                } else {
                    let since = *missing_since.entry(i).or_insert_with(Instant::now);
                    assert!(
                        since.elapsed() <= notice,
                        "{} still believes it holds {} {:?} after Redis lost it",
                        g.holder(),
                        g.key(),
                        since.elapsed()
                    );
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let lost = guards.iter().filter(|g| g.is_lost()).count();
    (lost, guards.len() - lost)
}

/// Redis restarts (with and without persistence) or stays unreachable
/// past the lease while locks are held: the watchdog reconnects and
/// re-renews, or reports `Lost` — never keeps "holding" a lock Redis lost.
#[test]
fn redis_restart_while_held_renews_or_reports_lost() {
    let _serial = serial();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mut rows = Vec::new();
    for case in ["restart with AOF", "restart empty", "unreachable > lease"] {
        // Surviving a restart needs the server back (AOF loaded, client
        // reconnected) within the lease: give it room on a loaded machine.
        let lease = if case == "restart with AOF" {
            Duration::from_secs(3)
        } else {
            Duration::from_secs(1)
        };
        // A renewal every lease/3, plus reconnect back-off and a loaded machine.
        let notice = lease;
        let mut server = match case {
            "restart with AOF" => RedisServer::start_with(&[
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
                "--save",
                "",
            ]),
            _ => RedisServer::start(),
        };
        let proxy = Proxy::for_server(&server);
        let client = rt
            .block_on(
                LockClient::builder()
                    .wait(Duration::ZERO)
                    .connect(&proxy.url()),
            )
            .unwrap();
        let guards: Vec<_> = rt.block_on(async {
            let mut v = Vec::new();
            for i in 0..20 {
                v.push(
                    client
                        .lock(unique(&format!("held{i}")))
                        .lease(lease)
                        .await
                        .unwrap(),
                );
            }
            v
        });
        match case {
            "unreachable > lease" => {
                proxy.set(Mode::Refuse);
                std::thread::sleep(lease.mul_f64(1.5));
                proxy.set(Mode::Pass);
            }
            _ => server.restart(),
        }
        let (lost, held) = rt.block_on(never_silently_holding(&server, &guards, lease * 3, notice));
        match case {
            "restart with AOF" => assert_eq!(
                lost, 0,
                "{case}: Redis kept the locks, the watchdog must renew them"
            ),
            _ => assert_eq!(
                held, 0,
                "{case}: every lock is gone from Redis; all must be reported lost"
            ),
        }
        let mut released_ok = 0;
        for g in guards {
            let was_lost = g.is_lost();
            let r = rt.block_on(g.release());
            assert_eq!(
                r.is_ok(),
                !was_lost,
                "{case}: release said {r:?} for a guard with is_lost = {was_lost}"
            );
            released_ok += usize::from(r.is_ok());
        }
        assert!(
            lock_keys(&server).is_empty(),
            "{case}: keys left: {:?}",
            lock_keys(&server)
        );
        assert_eq!(client.held_count(), 0);
        rows.push(format!(
            "  {case:<38} 20 held: {held} renewed through it, {lost} reported lost; released Ok {released_ok}"
        ));
    }
    println!("\n== Redis restart while held ==\n{}", rows.join("\n"));
}

/// Redlock acquires that reach only a minority fail, and leave nothing
/// behind on any of the five nodes: the granting minority is undone at once,
/// and the undo queued behind the acquire on a stalled node runs when that
/// node wakes up. Also when the stalled nodes are a different minority each
/// time and the failures come from many tasks at once.
#[test]
fn redlock_minority_failed_acquires_leave_no_keys() {
    let _serial = serial();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let nodes: Vec<RedisServer> = (0..5).map(|_| RedisServer::start()).collect();
    let urls: Vec<String> = nodes.iter().map(RedisServer::url).collect();
    let lease = Duration::from_secs(30);
    let client = rt
        .block_on(
            LockClient::builder()
                .wait(Duration::ZERO) // tries once unless a request says otherwise
                .lease(lease)
                .op_timeout(Duration::from_millis(200))
                .redlock(&urls),
        )
        .unwrap();
    let (mut failed, mut granted, mut rounds) = (0u64, 0u64, 0u64);
    let keys_on = |n: &RedisServer| -> Vec<String> {
        n.keys("lock:*")
            .into_iter()
            .filter(|k| !k.starts_with("lock:fence"))
            .collect()
    };
    for round in 0..6 {
        // Stall a majority (three of five, a different three each round):
        // the two live nodes grant, which is not enough.
        let stalled: Vec<usize> = (0..3).map(|i| (round + i * 2) % 5).collect();
        for &i in &stalled {
            nodes[i].pause();
        }
        let outcomes = rt.block_on(async {
            let tasks: Vec<_> = (0..20)
                .map(|t| {
                    let c = client.clone();
                    let key = unique(&format!("minority{round}-{t}"));
                    tokio::spawn(async move { c.lock(key).await })
                })
                .collect();
            let mut out = Vec::new();
            for t in tasks {
                out.push(t.await.unwrap());
            }
            out
        });
        for o in outcomes {
            match o {
                Err(LockError::Backend(_)) => failed += 1,
                Err(e) => panic!("round {round}: expected a Backend error, got {e:?}"),
                Ok(g) => {
                    granted += 1;
                    drop(g);
                }
            }
        }
        for (i, n) in nodes.iter().enumerate() {
            if !stalled.contains(&i) {
                let left = keys_on(n);
                assert!(
                    left.is_empty(),
                    "round {round}: live node {i} kept {left:?}"
                );
            }
        }
        for &i in &stalled {
            nodes[i].resume();
        }
        rounds += 1;
    }
    assert_eq!(granted, 0, "a lock was granted by a minority");
    // The stalled nodes ran the acquire and then its undo when they woke.
    let clean = rt.block_on(eventually(Duration::from_secs(5), || {
        nodes.iter().all(|n| keys_on(n).is_empty())
    }));
    let left: Vec<(usize, Vec<String>)> = nodes
        .iter()
        .enumerate()
        .map(|(i, n)| (i, keys_on(n)))
        .filter(|(_, k)| !k.is_empty())
        .collect();
    assert!(clean, "keys left after the stalled nodes woke: {left:?}");
    println!(
        "\n== Redlock minority ==\n  {:<38} {failed} failed ({rounds} rounds, 3 of 5 nodes stalled each), 0 granted, 0 keys left on any node",
        "acquires with only a minority up"
    );
}

/// Whether `server` runs no command (bar the `INFO` that asks) for `span`
/// in a row, within 10 s.
async fn quiet_for(server: &RedisServer, span: Duration) -> bool {
    let (mut seen, mut since) = (server.all_calls(), Instant::now());
    eventually(Duration::from_secs(10), || {
        let now = server.all_calls();
        if now != seen {
            (seen, since) = (now, Instant::now());
        }
        since.elapsed() >= span
    })
    .await
}

/// Failed acquires leave nothing behind: wait time-outs, and attempts whose
/// reply never came (black hole, drop) or came too late (delay).
#[test]
fn failed_acquires_leave_no_keys() {
    let _serial = serial();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let server = RedisServer::start();
    let proxy = Proxy::for_server(&server);
    let op_timeout = Duration::from_millis(500);
    let lease = Duration::from_secs(20);
    let connect = || {
        rt.block_on(
            LockClient::builder()
                .wait(Duration::ZERO) // tries once unless a request says otherwise
                .op_timeout(op_timeout)
                .lease(lease)
                .connect(&proxy.url()),
        )
        .unwrap()
    };
    let client = connect();
    let mut rows = Vec::new();

    // Wait time-outs on a held key.
    let key = unique("contended");
    let held = rt.block_on(client.lock(&key).into_future()).unwrap();
    let timeouts = rt.block_on(async {
        let tasks: Vec<_> = (0..100)
            .map(|_| {
                let (c, k) = (client.clone(), key.clone());
                tokio::spawn(async move { c.lock(k).wait(rand_ms(1, 300)).await })
            })
            .collect();
        let mut n = 0;
        for t in tasks {
            match t.await.unwrap() {
                Err(LockError::Timeout { .. }) => n += 1,
                other => panic!("expected a wait time-out, got {other:?}"),
            }
        }
        n
    });
    assert_eq!(
        client.waiting_here(&key),
        0,
        "timed-out waiters still registered"
    );
    rt.block_on(held.release()).unwrap();
    let clean = rt.block_on(eventually(Duration::from_secs(2), || {
        lock_keys(&server).is_empty()
    }));
    assert!(clean, "wait time-outs left {:?}", lock_keys(&server));
    // A channel nobody waits on is kept 2 s (a client that waits on a lock
    // often waits there again), then unsubscribed.
    let channels = rt.block_on(eventually(Duration::from_secs(5), || {
        server
            .cmd::<Vec<String>>(&["PUBSUB", "CHANNELS"])
            .is_empty()
    }));
    assert!(
        channels,
        "subscriptions left: {:?}",
        server.cmd::<Vec<String>>(&["PUBSUB", "CHANNELS"])
    );
    rows.push(format!(
        "  {:<38} {timeouts}/100 timed out; 0 keys, 0 subscriptions left",
        "wait time-outs"
    ));
    drop(client);

    // Replies that never come or come too late: `Backend` errors, and
    // whatever Redis granted meanwhile is taken back.
    // (what, mode, how long, do the requests reach Redis in the end?)
    for (what, mode, hold, delivered) in [
        (
            "black hole",
            Mode::Blackhole,
            Duration::from_millis(1500),
            true,
        ),
        ("drop", Mode::Drop, Duration::from_millis(1000), false),
        (
            "delay > op timeout",
            Mode::Delay(Duration::from_millis(700)),
            Duration::from_millis(1500),
            true,
        ),
    ] {
        // A client of its own, once the previous one's undos are through:
        // what that case left in flight (a connection the proxy closes
        // late, an undo sent once more an op_timeout later) neither holds
        // up this case's acquires nor counts among its scripts.
        let quiet = rt.block_on(quiet_for(
            &server,
            op_timeout * 2 + Duration::from_millis(200),
        ));
        assert!(
            quiet,
            "{what}: Redis never went quiet after the previous case"
        );
        let client = connect();
        // Start from working connections, the I/O thread's and the one
        // this runtime's tasks use: then every acquire below is really
        // sent (not held up opening a connection into the fault).
        let warm = rt.block_on(async {
            for _ in 0..50 {
                let spawned = {
                    let c = client.clone();
                    tokio::spawn(async move {
                        match c.lock(unique("warm")).await {
                            Ok(g) => g.release().await.is_ok(),
                            Err(_) => false,
                        }
                    })
                };
                if let (Ok(g), Ok(true)) = (client.lock(unique("warm")).await, spawned.await) {
                    return g.release().await.is_ok();
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            false
        });
        assert!(warm, "{what}: no lock before the fault");
        server.reset_stats();
        proxy.set(mode);
        let started = Instant::now();
        let results = rt.block_on(async {
            let tasks: Vec<_> = (0..20)
                .map(|i| {
                    let c = client.clone();
                    tokio::spawn(async move { c.lock(unique(&format!("failed{i}"))).await })
                })
                .collect();
            let mut v = Vec::new();
            for t in tasks {
                v.push(t.await.unwrap());
            }
            v
        });
        let took = started.elapsed();
        assert!(
            took < Duration::from_secs(5),
            "{what}: acquires took {took:?}"
        );
        for r in &results {
            assert!(
                matches!(r, Err(LockError::Backend(_))),
                "{what}: expected a Backend error, got {r:?}"
            );
        }
        std::thread::sleep(hold.saturating_sub(started.elapsed()));
        proxy.set(Mode::Pass);
        let healed = Instant::now();
        let scripts = if delivered {
            // The held-back acquires reach Redis (and are granted), followed
            // by the releases the client sent when it gave up on them.
            let arrived = rt.block_on(eventually(Duration::from_secs(5), || {
                server.calls("evalsha") >= 40
            }));
            assert!(
                arrived,
                "{what}: only {} EVALSHA reached Redis after healing (proxy: {:?})",
                server.calls("evalsha"),
                proxy.stats()
            );
            server.calls("evalsha")
        } else {
            server.calls("evalsha")
        };
        // Cleaned up by the library, not by the 20 s lease.
        let clean = rt.block_on(eventually(Duration::from_secs(2), || {
            lock_keys(&server).is_empty()
        }));
        assert!(
            clean,
            "{what}: keys left after the fault healed: {:?}",
            lock_keys(&server)
        );
        rows.push(format!(
            "  {what:<38} 20/20 failed with Backend in {took:.0?}; {scripts} scripts reached Redis; 0 keys {:.0?} after healing",
            healed.elapsed()
        ));
        assert_eq!(client.held_count(), 0);
        // And the client works again.
        let again = rt.block_on(async {
            let g = client
                .lock(unique("after"))
                .wait(Duration::from_secs(5))
                .await?;
            g.release().await
        });
        assert!(again.is_ok(), "{what}: no lock after healing: {again:?}");
    }
    println!("\n== failed acquires ==\n{}", rows.join("\n"));
}

/// A grant whose reply arrives after the lease it asked for has run out is
/// not a held lock: the caller must not be told it holds it.
#[test]
fn acquire_reply_slower_than_the_lease_is_not_a_held_lock() {
    let _serial = serial();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let server = RedisServer::start();
    let proxy = Proxy::for_server(&server);
    let client = rt
        .block_on(
            LockClient::builder()
                .wait(Duration::ZERO) // tries once unless a request says otherwise
                .op_timeout(Duration::from_secs(3))
                .connect(&proxy.url()),
        )
        .unwrap();
    let key = unique("slow");
    // 700 ms there, 700 ms back: Redis grants at ~0.7 s, expires the lock
    // at ~1.2 s, and the reply arrives at ~1.4 s.
    proxy.set(Mode::Delay(Duration::from_millis(700)));
    let lease = Duration::from_millis(500);
    let started = Instant::now();
    let r = rt.block_on(async { client.lock(&key).lease(lease).await });
    let took = started.elapsed();
    proxy.set(Mode::Pass);
    match r {
        Ok(g) => {
            let lost = g.is_lost();
            let still = server.exists(&format!("lock:{{{key}}}"));
            drop(g);
            panic!(
                "got a guard {took:?} after asking for a {lease:?} lease (lost flag {lost}, in Redis {still}): \
                 the caller is told it holds a lock whose lease already ran out"
            );
        }
        Err(e) => {
            assert!(matches!(e, LockError::Backend(_)), "{e:?}");
            let clean = rt.block_on(eventually(Duration::from_secs(2), || {
                lock_keys(&server).is_empty()
            }));
            assert!(
                clean,
                "the late grant was left in Redis: {:?}",
                lock_keys(&server)
            );
            assert_eq!(client.held_count(), 0, "a late grant is being renewed");
            println!(
                "\n== late grant ==\n  {:<38} refused after {took:?}: {e}",
                "reply after the lease ran out"
            );
        }
    }
}

// ---------------------------------------------------------------------------
// Cancellation fuzz.

#[derive(Debug)]
enum FuzzError {
    Lock(LockError),
    /// The body ran although `current_fence()` said no lock is held.
    NoLock,
}

impl From<LockError> for FuzzError {
    fn from(e: LockError) -> Self {
        FuzzError::Lock(e)
    }
}

#[derive(Default)]
struct FuzzStats {
    futures: AtomicU64,
    manual: AtomicU64,
    attributed: AtomicU64,
    /// Dropped before the lock future finished (before/during acquire).
    dropped_acquiring: AtomicU64,
    /// Guard dropped (or released) right after acquire.
    dropped_after_acquire: AtomicU64,
    /// Guard held past a renewal (lease/3), then dropped.
    dropped_while_renewing: AtomicU64,
    /// Attributed call dropped while its body ran.
    dropped_mid_body: AtomicU64,
    /// Attributed bodies dropped past a renewal.
    dropped_mid_body_renewing: AtomicU64,
    completed: AtomicU64,
    wait_timeouts: AtomicU64,
    errors: AtomicU64,
    bodies_without_lock: AtomicU64,
}

/// Short enough to renew often, long enough to ride out a stall of a loaded
/// 2-core machine (renewed every 200 ms).
const FUZZ_LEASE: Duration = Duration::from_millis(600);

#[distributed_lock(key = "fuzz:{key}", lease = "600ms", wait = "50ms")]
async fn fuzz_body(key: &str, hold: Duration, entered: &AtomicU64) -> Result<(), FuzzError> {
    if lock_runtime::current_fence().is_none() {
        return Err(FuzzError::NoLock);
    }
    entered.fetch_add(1, Ordering::SeqCst);
    tokio::time::sleep(hold).await;
    Ok(())
}

/// Resolves after `n` polls: a drop at an exact poll of the other branch.
async fn after_polls(n: u32) {
    for _ in 0..n {
        tokio::task::yield_now().await;
    }
}

/// A write lock, or one time in three a read lock: readers' clean-up is
/// fuzzed alongside writers', on the same keys.
fn either_lock(client: &LockClient, key: String) -> lock_runtime::LockRequest {
    if fastrand::u32(..3) == 0 {
        client.read_lock(key)
    } else {
        client.write_lock(key)
    }
}

async fn fuzz_one(
    client: &LockClient,
    keys: &[String],
    tick: &tokio::sync::Notify,
    st: &FuzzStats,
) {
    st.futures.fetch_add(1, Ordering::Relaxed);
    let key = &keys[fastrand::usize(..keys.len())];
    // Short leases renew every 200 ms; long ones prove clean-up is not expiry.
    let lease = if fastrand::bool() {
        FUZZ_LEASE
    } else {
        Duration::from_secs(10)
    };
    let wait = rand_ms(0, 50);
    let count = |r: &Result<lock_runtime::LockGuard, LockError>| match r {
        Ok(_) => {}
        Err(LockError::Timeout { .. }) => {
            st.wait_timeouts.fetch_add(1, Ordering::Relaxed);
        }
        Err(_) => {
            st.errors.fetch_add(1, Ordering::Relaxed);
        }
    };
    match fastrand::u32(..6) {
        // Manual, dropped after a random number of polls (0 = never polled).
        0 => {
            st.manual.fetch_add(1, Ordering::Relaxed);
            let fut = either_lock(client, format!("fuzz:{key}"))
                .lease(lease)
                .wait(wait)
                .into_future();
            tokio::select! {
                biased;
                r = fut => { count(&r); if r.is_ok() { st.dropped_after_acquire.fetch_add(1, Ordering::Relaxed); } }
                () = after_polls(fastrand::u32(..6)) => { st.dropped_acquiring.fetch_add(1, Ordering::Relaxed); }
            }
        }
        // Manual, under a tiny time budget.
        1 => {
            st.manual.fetch_add(1, Ordering::Relaxed);
            let budget = Duration::from_micros(fastrand::u64(0..3000));
            match tokio::time::timeout(
                budget,
                either_lock(client, format!("fuzz:{key}"))
                    .lease(lease)
                    .wait(wait),
            )
            .await
            {
                Ok(r) => {
                    count(&r);
                    if r.is_ok() {
                        st.dropped_after_acquire.fetch_add(1, Ordering::Relaxed);
                    }
                }
                Err(_) => {
                    st.dropped_acquiring.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        // Manual, held a while (across renewals), then dropped or released.
        2 => {
            st.manual.fetch_add(1, Ordering::Relaxed);
            match tokio::time::timeout(
                Duration::from_millis(30),
                either_lock(client, format!("fuzz:{key}"))
                    .lease(lease)
                    .wait(wait),
            )
            .await
            {
                Ok(Ok(g)) => {
                    let hold = rand_ms(0, 400);
                    tokio::time::sleep(hold).await;
                    if hold >= lease / 3 {
                        st.dropped_while_renewing.fetch_add(1, Ordering::Relaxed);
                    } else {
                        st.dropped_after_acquire.fetch_add(1, Ordering::Relaxed);
                    }
                    if fastrand::bool() {
                        drop(g);
                    } else {
                        let _ = g.release().await;
                    }
                }
                Ok(r) => count(&r),
                Err(_) => {
                    st.dropped_acquiring.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        // Manual, raced against a random event of the whole system.
        3 => {
            st.manual.fetch_add(1, Ordering::Relaxed);
            let fut = either_lock(client, format!("fuzz:{key}"))
                .lease(lease)
                .wait(wait)
                .into_future();
            tokio::select! {
                r = fut => {
                    count(&r);
                    if let Ok(g) = r {
                        tick.notified().await;
                        st.dropped_after_acquire.fetch_add(1, Ordering::Relaxed);
                        drop(g);
                    }
                }
                () = tick.notified() => { st.dropped_acquiring.fetch_add(1, Ordering::Relaxed); }
            }
        }
        // Attributed, under a random budget: before, during or mid-body.
        _ => {
            st.attributed.fetch_add(1, Ordering::Relaxed);
            let entered = AtomicU64::new(0);
            let hold = rand_ms(0, 400);
            let budget = rand_ms(0, 400);
            let call = fuzz_body(key, hold, &entered);
            let out = if fastrand::bool() {
                tokio::time::timeout(budget, call).await.ok()
            } else {
                tokio::select! {
                    r = call => Some(r),
                    () = tick.notified() => None,
                }
            };
            let ran = entered.load(Ordering::SeqCst) > 0;
            match out {
                Some(Ok(())) => {
                    st.completed.fetch_add(1, Ordering::Relaxed);
                }
                Some(Err(FuzzError::NoLock)) => {
                    st.bodies_without_lock.fetch_add(1, Ordering::Relaxed);
                }
                Some(Err(FuzzError::Lock(LockError::Timeout { .. }))) => {
                    st.wait_timeouts.fetch_add(1, Ordering::Relaxed);
                }
                Some(Err(FuzzError::Lock(_))) => {
                    st.errors.fetch_add(1, Ordering::Relaxed);
                }
                None if ran && budget.min(hold) >= FUZZ_LEASE / 3 => {
                    st.dropped_mid_body_renewing.fetch_add(1, Ordering::Relaxed);
                }
                None if ran => {
                    st.dropped_mid_body.fetch_add(1, Ordering::Relaxed);
                }
                None => {
                    st.dropped_acquiring.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }
}

/// 10^4 lock futures, manual and attributed, dropped at random points:
/// afterwards nothing is renewed, nothing is held, nothing is left.
#[test]
fn cancellation_fuzz() {
    let _serial = serial();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let server = tests::global::redis().await;
        let client = lock_runtime::client().unwrap();
        let n: u64 = 10_000;
        let concurrency = 64;
        // A few hot keys (waiting, wake-ups) among many cold ones.
        let keys: Arc<Vec<String>> = Arc::new(
            (0..4)
                .map(|i| unique(&format!("hot{i}")))
                .chain((0..4).flat_map(|_| (0..64).map(|i| unique(&format!("cold{i}")))).take(4 * 64))
                .collect(),
        );
        let st = Arc::new(FuzzStats::default());
        let tick = Arc::new(tokio::sync::Notify::new());
        let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let ticker = {
            let (tick, done) = (tick.clone(), done.clone());
            tokio::spawn(async move {
                while !done.load(Ordering::Relaxed) {
                    tokio::time::sleep(Duration::from_micros(fastrand::u64(200..5000))).await;
                    tick.notify_waiters();
                }
            })
        };
        let started = Instant::now();
        let next = Arc::new(AtomicU64::new(0));
        let tasks: Vec<_> = (0..concurrency)
            .map(|_| {
                let (client, keys, tick, st, next) = (client.clone(), keys.clone(), tick.clone(), st.clone(), next.clone());
                tokio::spawn(async move {
                    while next.fetch_add(1, Ordering::Relaxed) < n {
                        fuzz_one(&client, &keys, &tick, &st).await;
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
        done.store(true, Ordering::Relaxed);
        ticker.await.unwrap();
        let ran_for = started.elapsed();

        // Nothing renewed, nothing held: at once, not at lease expiry.
        let t0 = Instant::now();
        let held_zero = eventually(Duration::from_secs(2), || client.held_count() == 0).await;
        assert!(held_zero, "{} locks still renewed", client.held_count());
        let clean = eventually(Duration::from_secs(2), || lock_keys(server).is_empty()).await;
        let cleaned_in = t0.elapsed();
        let leftover = lock_keys(server);
        assert!(clean, "locks left 2 s after the last future was dropped (10 s leases): {leftover:?}");
        // Idle channels are kept 2 s, then unsubscribed.
        let unsubscribed = eventually(Duration::from_secs(5), || {
            server.cmd::<Vec<String>>(&["PUBSUB", "CHANNELS"]).is_empty()
        })
        .await;
        assert!(unsubscribed, "subscriptions left: {:?}", server.cmd::<Vec<String>>(&["PUBSUB", "CHANNELS"]));
        for k in keys.iter() {
            assert_eq!(client.waiting_here(&format!("fuzz:{k}")), 0, "waiters left on {k}");
        }
        // Quiet period: two short leases, and their renewal interval twice.
        server.reset_stats();
        tokio::time::sleep(FUZZ_LEASE * 2 + Duration::from_millis(400)).await;
        let orphan = server.calls("evalsha") + server.calls("eval");
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        println!(
            "\n== cancellation fuzz ==\n\
             \x20 {:<38} {} in {:.1} s ({} manual, {} attributed; {} at a time)\n\
             \x20 {:<38} acquiring {}, right after acquire {}, while renewing {}, mid-body {}, mid-body while renewing {}\n\
             \x20 {:<38} completed {}, wait time-outs {}, errors {}, bodies run without the lock {}\n\
             \x20 {:<38} {orphan}\n\
             \x20 {:<38} {} (all gone {:?} after the last drop; leases were 600 ms or 10 s)\n\
             \x20 {:<38} {}",
            "lock futures",
            g(&st.futures),
            ran_for.as_secs_f64(),
            g(&st.manual),
            g(&st.attributed),
            concurrency,
            "dropped",
            g(&st.dropped_acquiring),
            g(&st.dropped_after_acquire),
            g(&st.dropped_while_renewing),
            g(&st.dropped_mid_body),
            g(&st.dropped_mid_body_renewing),
            "not dropped",
            g(&st.completed),
            g(&st.wait_timeouts),
            g(&st.errors),
            g(&st.bodies_without_lock),
            "orphan renewals (EVALSHA in 1.6 s)",
            "leftover lock keys",
            leftover.len(),
            cleaned_in,
            "locks still renewed (held_count)",
            client.held_count(),
        );
        assert_eq!(orphan, 0, "lock commands sent by a client that holds nothing");
        assert_eq!(g(&st.bodies_without_lock), 0, "attributed bodies ran without the lock");
        assert_eq!(g(&st.errors), 0, "backend errors against a healthy Redis");
        assert_eq!(g(&st.futures), n);
        for (what, a) in [
            ("dropped while acquiring", &st.dropped_acquiring),
            ("dropped after acquire", &st.dropped_after_acquire),
            ("dropped while renewing", &st.dropped_while_renewing),
            ("dropped mid-body", &st.dropped_mid_body),
            ("dropped mid-body while renewing", &st.dropped_mid_body_renewing),
        ] {
            assert!(g(a) > 0, "the fuzz never hit: {what}");
        }
    });
}
