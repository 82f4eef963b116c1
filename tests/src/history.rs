//! A history recorder and checker for lock clients under faults, after
//! Jepsen's lock tests and Kleppmann's fencing argument.
//!
//! # Recording
//! Every client (a task in a worker process) records what it asked and what
//! the library told it, each event stamped with `CLOCK_MONOTONIC` in
//! nanoseconds ([`now_ns`]) — one clock for every process on the machine, so
//! histories of several processes merge by timestamp. Workers print events
//! as lines ([`Event::to_line`]); the test parses them back
//! ([`Event::parse`]) and adds the faults it injected ([`Fault`]) with
//! stamps from the same clock.
//!
//! One *op* is one acquisition attempt of one holder: `attempt`, then
//! `acquired <fence>` (or `timeout` / `failed`), then the holder's work —
//! fenced writes (`write <fence>` when sent, then `write_ok`,
//! `write_rejected` or `write_failed`) — and the end of its belief that it
//! holds the lock: `releasing` (about to release; the outcome follows as
//! `released`, `release_lost` or `release_failed`), `lost` (the library said
//! the lock was lost), or `body_end` (an attributed body finished; the
//! attribute does not report the release's outcome).
//!
//! # What the checker reports
//! **Interval.** A holder's interval on a key runs from its `acquired` event
//! to the end of its belief: the first of `releasing` / `lost` / `body_end`,
//! or its process's death (`Kill`). A holder is *confirmed* if its release
//! came back `Ok` (Redis still had its lock when it let go), *unknown* for an
//! attributed body that returned normally, and *unconfirmed* if it was told
//! `Lost`, its release failed or said `Lost`, or it was killed.
//!
//! **Double holder.** Two intervals on one key that overlap in time, where
//! neither holder is excused. A holder is excused from an overlap when the
//! library did not confirm its hold and one of these explains it — these are
//! the documented lease semantics:
//! - *paused*: its process was SIGSTOPped between its attempt and the start
//!   of the overlap (its lease ran out while it could not run; fencing, not
//!   the lock, must stop its later writes; an attributed body that
//!   finished after a pause is excused too, as the attribute does not
//!   report the release's outcome);
//! - *wiped*: Redis restarted without persistence between its attempt and
//!   the start of the overlap (the lock vanished; the holder learns at its
//!   next renewal);
//! - *latency*: it was told its lock was lost within `slop` of the overlap's
//!   start (the watchdog declares a lock lost at its lease deadline, and
//!   Redis cannot have expired it before that deadline, so the overlap is
//!   only the time the notice took to arrive).
//!
//! A confirmed holder is never excused: its release found its lock still
//! in Redis, so no one else can have been granted it meanwhile.
//!
//! **Fences.** Per key and *epoch* (the span between two restarts that wiped
//! Redis; an acquisition whose attempt straddles one is left out): no two
//! acquisitions share a fence, and an acquisition that returned before
//! another one was even attempted has the lower fence (real-time order).
//! How often return order and fence order differ is counted, not judged: a
//! reply that was delayed or paused arrives late with an older token.
//!
//! **Held across a wipe.** A confirmed holder whose interval spans a wiping
//! restart: the library said it held a lock that Redis had lost.
//!
//! **Stale writes.** A write is stale if, before it was sent, the store had
//! already accepted a write with a higher fence to the same key (that
//! acceptance had come back). Every stale write must be rejected. Writes
//! sent after a SIGSTOP longer than the lease by a holder that held its lock
//! when it was stopped are counted separately (they are stale whenever a
//! newer holder wrote in the meantime). A rejection must name a fence that some write really
//! carried.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::io::Write as _;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// `CLOCK_MONOTONIC` in nanoseconds: one clock for all processes here.
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec we own.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_MONOTONIC)");
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// What a client did or was told.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Attempt,
    Acquired {
        fence: u64,
    },
    /// A read lock: shared with other readers, never with a writer.
    AcquiredRead {
        fence: u64,
    },
    /// `LockError::Timeout`: the lock stayed busy for the whole wait.
    Timeout,
    /// Any other acquire error.
    Failed,
    /// The holder starts a long stretch of work (a target for SIGSTOP).
    Hold {
        ms: u64,
    },
    Write {
        fence: u64,
    },
    WriteOk {
        fence: u64,
    },
    WriteRejected {
        fence: u64,
        highest: u64,
    },
    WriteFailed {
        fence: u64,
    },
    /// The library said the lock was lost; the holder stops.
    Lost,
    /// About to release (the holder stops believing it holds).
    Releasing,
    Released,
    ReleaseLost,
    ReleaseFailed,
    /// An attributed body returned; the release's outcome is not reported.
    BodyEnd,
}

/// One recorded event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub t: u64,
    pub proc_id: u32,
    pub op: u64,
    pub key: String,
    pub kind: Kind,
}

impl Event {
    /// `H <t> <proc> <op> <key> <kind> [args]`; keys have no whitespace.
    pub fn to_line(&self) -> String {
        let (name, a, b) = match self.kind {
            Kind::Attempt => ("attempt", None, None),
            Kind::Acquired { fence } => ("acquired", Some(fence), None),
            Kind::AcquiredRead { fence } => ("acquired_read", Some(fence), None),
            Kind::Timeout => ("timeout", None, None),
            Kind::Failed => ("failed", None, None),
            Kind::Hold { ms } => ("hold", Some(ms), None),
            Kind::Write { fence } => ("write", Some(fence), None),
            Kind::WriteOk { fence } => ("write_ok", Some(fence), None),
            Kind::WriteRejected { fence, highest } => {
                ("write_rejected", Some(fence), Some(highest))
            }
            Kind::WriteFailed { fence } => ("write_failed", Some(fence), None),
            Kind::Lost => ("lost", None, None),
            Kind::Releasing => ("releasing", None, None),
            Kind::Released => ("released", None, None),
            Kind::ReleaseLost => ("release_lost", None, None),
            Kind::ReleaseFailed => ("release_failed", None, None),
            Kind::BodyEnd => ("body_end", None, None),
        };
        let mut s = format!(
            "H {} {} {} {} {name}",
            self.t, self.proc_id, self.op, self.key
        );
        for n in [a, b].into_iter().flatten() {
            let _ = write!(s, " {n}");
        }
        s
    }

    /// The inverse of [`to_line`](Self::to_line); `None` for other lines.
    pub fn parse(line: &str) -> Option<Event> {
        let mut it = line.split_whitespace();
        if it.next()? != "H" {
            return None;
        }
        let t = it.next()?.parse().ok()?;
        let proc_id = it.next()?.parse().ok()?;
        let op = it.next()?.parse().ok()?;
        let key = it.next()?.to_owned();
        let name = it.next()?;
        let mut num = || it.next().and_then(|n| n.parse::<u64>().ok());
        let kind = match name {
            "attempt" => Kind::Attempt,
            "acquired" => Kind::Acquired { fence: num()? },
            "acquired_read" => Kind::AcquiredRead { fence: num()? },
            "timeout" => Kind::Timeout,
            "failed" => Kind::Failed,
            "hold" => Kind::Hold { ms: num()? },
            "write" => Kind::Write { fence: num()? },
            "write_ok" => Kind::WriteOk { fence: num()? },
            "write_rejected" => Kind::WriteRejected {
                fence: num()?,
                highest: num()?,
            },
            "write_failed" => Kind::WriteFailed { fence: num()? },
            "lost" => Kind::Lost,
            "releasing" => Kind::Releasing,
            "released" => Kind::Released,
            "release_lost" => Kind::ReleaseLost,
            "release_failed" => Kind::ReleaseFailed,
            "body_end" => Kind::BodyEnd,
            _ => return None,
        };
        Some(Event {
            t,
            proc_id,
            op,
            key,
            kind,
        })
    }
}

/// Where a [`Recorder`] puts events.
#[derive(Clone)]
enum Sink {
    Stdout,
    Memory(Arc<Mutex<Vec<Event>>>),
}

/// Records one process's events, stamped at the call.
#[derive(Clone)]
pub struct Recorder {
    proc_id: u32,
    sink: Sink,
}

impl Recorder {
    /// Print each event as one line on stdout (flushed per line, so a
    /// process killed with SIGKILL loses no event it recorded).
    pub fn stdout(proc_id: u32) -> Recorder {
        Recorder {
            proc_id,
            sink: Sink::Stdout,
        }
    }

    /// Keep events in memory, for histories of one process.
    pub fn memory(proc_id: u32) -> (Recorder, Arc<Mutex<Vec<Event>>>) {
        let events = Arc::new(Mutex::new(Vec::new()));
        let r = Recorder {
            proc_id,
            sink: Sink::Memory(events.clone()),
        };
        (r, events)
    }

    pub fn record(&self, op: u64, key: &str, kind: Kind) {
        self.record_at(now_ns(), op, key, kind);
    }

    pub fn record_at(&self, t: u64, op: u64, key: &str, kind: Kind) {
        let ev = Event {
            t,
            proc_id: self.proc_id,
            op,
            key: key.to_owned(),
            kind,
        };
        match &self.sink {
            Sink::Stdout => {
                let mut out = std::io::stdout().lock();
                let _ = writeln!(out, "{}", ev.to_line());
                let _ = out.flush();
            }
            Sink::Memory(v) => v.lock().unwrap().push(ev),
        }
    }
}

/// A fault the test injected (or a process it saw end).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultKind {
    /// SIGKILL; stamped after the process was reaped.
    Kill,
    /// SIGSTOP; stamped before the signal.
    Stop,
    /// SIGCONT; stamped after the signal.
    Cont,
    /// Redis goes down for a restart; `wipe`: it comes back empty.
    RedisDown {
        wipe: bool,
    },
    /// Redis is answering again after a restart.
    RedisUp {
        wipe: bool,
    },
    ProxyDelay {
        ms: u64,
    },
    ProxyDrop,
    ProxyBlackhole,
    ProxyRefuse,
    ProxyCut,
    /// The proxy passes traffic again.
    ProxyHeal,
    /// A worker exited on its own.
    Exit,
}

impl FaultKind {
    /// The row a fault is counted in, or `None` for the ends of faults.
    pub fn label(&self) -> Option<&'static str> {
        Some(match self {
            FaultKind::Kill => "kill -9 holder",
            FaultKind::Stop => "SIGSTOP > lease",
            FaultKind::RedisDown { wipe: false } => "redis restart (persistent)",
            FaultKind::RedisDown { wipe: true } => "redis restart (empty)",
            FaultKind::ProxyDelay { .. } => "proxy delay",
            FaultKind::ProxyDrop => "proxy drop",
            FaultKind::ProxyBlackhole => "proxy black hole",
            FaultKind::ProxyRefuse => "proxy refuse",
            FaultKind::ProxyCut => "proxy cut",
            FaultKind::Cont
            | FaultKind::RedisUp { .. }
            | FaultKind::ProxyHeal
            | FaultKind::Exit => return None,
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fault {
    pub t: u64,
    /// The worker it hit, for process faults.
    pub proc_id: Option<u32>,
    pub kind: FaultKind,
}

impl Fault {
    pub fn now(proc_id: Option<u32>, kind: FaultKind) -> Fault {
        Fault {
            t: now_ns(),
            proc_id,
            kind,
        }
    }
}

/// Events of all processes plus the faults, in any order.
#[derive(Debug, Default, Clone)]
pub struct History {
    pub events: Vec<Event>,
    pub faults: Vec<Fault>,
}

/// The checker's parameters.
#[derive(Debug, Clone, Copy)]
pub struct CheckConfig {
    /// The lease every holder used.
    pub lease: Duration,
    /// How late a loss notice may arrive (scheduling on a loaded machine).
    pub slop: Duration,
}

/// How the library left a holder at the end of its interval.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Confirm {
    /// Release said `Ok`.
    Confirmed,
    /// Lost, release failed or said lost, or killed.
    Unconfirmed,
    /// An attributed body returned; release outcome not reported.
    Unknown,
}

#[derive(Debug, Clone)]
struct Interval {
    proc_id: u32,
    op: u64,
    attempt: u64,
    start: u64,
    end: u64,
    fence: u64,
    /// A read hold: may overlap other read holds, and shares its token.
    shared: bool,
    confirm: Confirm,
    /// The end is a loss notice (lost / release said lost or failed).
    told_lost: bool,
    killed: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Accepted,
    Rejected(u64),
    Failed,
    Unknown,
}

#[derive(Debug, Clone)]
struct WriteRec {
    proc_id: u32,
    op: u64,
    attempt: u64,
    acquired: u64,
    sent: u64,
    done: u64,
    fence: u64,
    outcome: Outcome,
}

/// What the checker found, and the figures a scenario prints.
#[derive(Debug, Default, Clone)]
pub struct Report {
    pub attempts: u64,
    pub acquisitions: u64,
    /// Of which read holds.
    pub read_acquisitions: u64,
    /// Read holds that overlapped (allowed: readers share).
    pub shared_overlaps: u64,
    pub timeouts: u64,
    pub failures: u64,
    pub faults: BTreeMap<&'static str, u64>,
    /// Double holders: overlaps where neither holder is excused.
    pub double_holders: Vec<String>,
    /// Overlaps excused, by reason: (count, longest overlap in ns).
    pub excused: BTreeMap<&'static str, (u64, u64)>,
    pub fence_duplicates: Vec<String>,
    pub fence_out_of_order: Vec<String>,
    /// Acquisitions that returned after one with a higher fence.
    pub return_order_inversions: u64,
    pub held_across_wipe: Vec<String>,
    /// Intervals with no end and no death: a worker forgot to record.
    pub unterminated: Vec<String>,
    pub losses: u64,
    pub writes: u64,
    pub writes_accepted: u64,
    pub writes_rejected: u64,
    pub writes_failed: u64,
    pub writes_unknown: u64,
    pub stale_attempted: u64,
    pub stale_rejected: u64,
    pub stale_accepted: Vec<String>,
    pub phantom_rejections: Vec<String>,
    /// Writes sent after the writer's process was stopped past its lease.
    pub paused_writes: u64,
    pub paused_writes_rejected: u64,
    pub paused_writes_stale: u64,
    /// Kill of a holder → next acquisition of its key by anyone (ms).
    pub crash_to_next_acquire_ms: Vec<u64>,
    /// Filled in by the test: renewals seen over a quiet period at the end.
    pub orphan_renewals: Option<u64>,
    /// Filled in by the test: lock keys left after every holder finished.
    pub leftover_keys: Option<Vec<String>>,
    pub extra: Vec<(String, String)>,
}

fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

/// Check a history; see the module docs for the rules.
pub fn check(history: &History, cfg: &CheckConfig) -> Report {
    let mut r = Report::default();
    let lease_ns = cfg.lease.as_nanos() as u64;
    let slop_ns = cfg.slop.as_nanos() as u64;
    let history_end = history
        .events
        .iter()
        .map(|e| e.t)
        .chain(history.faults.iter().map(|f| f.t))
        .max()
        .unwrap_or(0);

    for f in &history.faults {
        if let Some(label) = f.kind.label() {
            *r.faults.entry(label).or_default() += 1;
        }
    }
    // Per process: kills, stops (with their resume), exits.
    let mut kills: HashMap<u32, u64> = HashMap::new();
    let mut exits: HashMap<u32, u64> = HashMap::new();
    let mut stops: HashMap<u32, Vec<(u64, u64)>> = HashMap::new();
    let mut faults = history.faults.clone();
    faults.sort_by_key(|f| f.t);
    for f in &faults {
        let Some(p) = f.proc_id else { continue };
        match f.kind {
            FaultKind::Kill => {
                kills.entry(p).or_insert(f.t);
            }
            FaultKind::Exit => {
                exits.entry(p).or_insert(f.t);
            }
            FaultKind::Stop => stops.entry(p).or_default().push((f.t, u64::MAX)),
            FaultKind::Cont => {
                if let Some(last) = stops.get_mut(&p).and_then(|v| v.last_mut()) {
                    if last.1 == u64::MAX {
                        last.1 = f.t;
                    }
                }
            }
            _ => {}
        }
    }
    // Wiping restarts: [down, up].
    let mut wipes: Vec<(u64, u64)> = Vec::new();
    for f in &faults {
        match f.kind {
            FaultKind::RedisDown { wipe: true } => wipes.push((f.t, u64::MAX)),
            FaultKind::RedisUp { wipe: true } => {
                if let Some(last) = wipes.last_mut() {
                    if last.1 == u64::MAX {
                        last.1 = f.t;
                    }
                }
            }
            _ => {}
        }
    }
    // A signal races with the worker's own clock reading: allow a little.
    let signal_skew = 10_000_000;
    let paused_between = |p: u32, from: u64, to: u64| {
        stops
            .get(&p)
            .is_some_and(|v| v.iter().any(|&(s, _)| s + signal_skew >= from && s <= to))
    };
    let wiped_between =
        |from: u64, to: u64| wipes.iter().any(|&(down, up)| down <= to && up >= from);

    // Group events per op.
    let mut ops: BTreeMap<(u32, u64), Vec<&Event>> = BTreeMap::new();
    for e in &history.events {
        ops.entry((e.proc_id, e.op)).or_default().push(e);
    }
    let mut intervals: HashMap<String, Vec<Interval>> = HashMap::new();
    let mut writes: HashMap<String, Vec<WriteRec>> = HashMap::new();
    for ((p, op), mut evs) in ops {
        evs.sort_by_key(|e| e.t);
        let key = evs[0].key.clone();
        let attempt = evs.iter().find(|e| e.kind == Kind::Attempt).map(|e| e.t);
        let mut acquired = None;
        let mut shared = false;
        let mut end: Option<(u64, Confirm, bool)> = None;
        let mut releasing = None;
        let mut pending: Vec<(u64, u64)> = Vec::new();
        let mut op_writes = Vec::new();
        for e in &evs {
            match e.kind {
                Kind::Attempt => r.attempts += 1,
                Kind::Acquired { fence } => {
                    r.acquisitions += 1;
                    acquired = Some((e.t, fence));
                }
                Kind::AcquiredRead { fence } => {
                    r.acquisitions += 1;
                    r.read_acquisitions += 1;
                    acquired = Some((e.t, fence));
                    shared = true;
                }
                Kind::Timeout => r.timeouts += 1,
                Kind::Failed => r.failures += 1,
                Kind::Hold { .. } => {}
                Kind::Write { fence } => pending.push((e.t, fence)),
                Kind::WriteOk { fence }
                | Kind::WriteRejected { fence, .. }
                | Kind::WriteFailed { fence } => {
                    let outcome = match e.kind {
                        Kind::WriteOk { .. } => Outcome::Accepted,
                        Kind::WriteRejected { highest, .. } => Outcome::Rejected(highest),
                        _ => Outcome::Failed,
                    };
                    let sent = pending
                        .iter()
                        .position(|&(_, f)| f == fence)
                        .map(|i| pending.remove(i).0)
                        .unwrap_or(e.t);
                    op_writes.push((sent, e.t, fence, outcome));
                }
                Kind::Lost => {
                    if end.is_none() {
                        end = Some((e.t, Confirm::Unconfirmed, true));
                    }
                }
                Kind::Releasing => {
                    releasing = Some(e.t);
                }
                Kind::Released | Kind::ReleaseLost | Kind::ReleaseFailed => {
                    if end.is_none() {
                        let t = releasing.unwrap_or(e.t);
                        end = Some(if e.kind == Kind::Released {
                            (t, Confirm::Confirmed, false)
                        } else {
                            (t, Confirm::Unconfirmed, true)
                        });
                    } else if let Some(end) = end.as_mut() {
                        // Told lost earlier; the release cannot confirm.
                        end.1 = Confirm::Unconfirmed;
                    }
                }
                Kind::BodyEnd => {
                    if end.is_none() {
                        end = Some((e.t, Confirm::Unknown, false));
                    }
                }
            }
        }
        for (sent, fence) in pending {
            op_writes.push((sent, sent, fence, Outcome::Unknown));
        }
        let Some((start, fence)) = acquired else {
            continue;
        };
        let attempt = attempt.unwrap_or(start);
        r.losses += u64::from(
            evs.iter()
                .any(|e| matches!(e.kind, Kind::Lost | Kind::ReleaseLost)),
        );
        let killed_at = kills.get(&p).copied().filter(|&k| k >= start);
        let (end_t, confirm, told_lost, killed) = match (end, releasing, killed_at) {
            (Some((t, c, l)), _, _) => (t, c, l, false),
            // Released, but the outcome never came: died, or a worker bug.
            (None, Some(t), k) => {
                if k.is_none() {
                    r.unterminated.push(format!(
                        "proc {p} op {op} key {key} fence {fence}: released, outcome never recorded"
                    ));
                }
                (t, Confirm::Unconfirmed, false, k.is_some())
            }
            (None, None, Some(k)) => (k, Confirm::Unconfirmed, false, true),
            (None, None, None) => {
                let t = exits.get(&p).copied().unwrap_or(history_end);
                r.unterminated.push(format!(
                    "proc {p} op {op} key {key} fence {fence}: acquired, never ended"
                ));
                (t, Confirm::Unconfirmed, false, false)
            }
        };
        intervals.entry(key.clone()).or_default().push(Interval {
            proc_id: p,
            op,
            attempt,
            start,
            end: end_t.max(start),
            fence,
            shared,
            confirm,
            told_lost,
            killed,
        });
        for (sent, done, fence, outcome) in op_writes {
            writes.entry(key.clone()).or_default().push(WriteRec {
                proc_id: p,
                op,
                attempt,
                acquired: start,
                sent,
                done,
                fence,
                outcome,
            });
        }
    }

    // Double holders.
    let excuse = |h: &Interval, o_start: u64| -> Option<&'static str> {
        if h.confirm == Confirm::Confirmed {
            return None;
        }
        if paused_between(h.proc_id, h.attempt, o_start) {
            return Some("paused (SIGSTOP past the lease)");
        }
        if h.confirm == Confirm::Unknown {
            return None;
        }
        if wiped_between(h.attempt, o_start) {
            return Some("wiped (Redis restarted empty)");
        }
        if (h.told_lost || h.killed) && h.end.saturating_sub(o_start) <= slop_ns {
            return Some("loss notice latency");
        }
        None
    };
    for (key, ivs) in intervals.iter_mut() {
        ivs.sort_by_key(|i| i.start);
        let mut active: Vec<&Interval> = Vec::new();
        for b in ivs.iter() {
            active.retain(|a| a.end > b.start);
            for a in &active {
                if a.shared && b.shared {
                    r.shared_overlaps += 1;
                    continue;
                }
                let o_start = b.start;
                let o_end = a.end.min(b.end);
                let overlap = o_end - o_start;
                match excuse(a, o_start).or_else(|| excuse(b, o_start)) {
                    Some(reason) => {
                        let e = r.excused.entry(reason).or_default();
                        e.0 += 1;
                        e.1 = e.1.max(overlap);
                    }
                    None => r.double_holders.push(format!(
                        "key {key}: proc {} op {} (fence {}, {:?}) and proc {} op {} (fence {}, {:?}) both held it for {:.1} ms",
                        a.proc_id, a.op, a.fence, a.confirm, b.proc_id, b.op, b.fence, b.confirm, ms(overlap)
                    )),
                }
            }
            active.push(b);
        }
        // Held across a wipe.
        for i in ivs.iter() {
            if i.confirm == Confirm::Confirmed
                && wipes.iter().any(|&(down, up)| i.start < down && i.end > up)
            {
                r.held_across_wipe.push(format!(
                    "key {key}: proc {} op {} (fence {}) released Ok after Redis restarted empty",
                    i.proc_id, i.op, i.fence
                ));
            }
        }
        // Fences, per epoch.
        let epoch_of = |i: &Interval| -> Option<usize> {
            if wipes
                .iter()
                .any(|&(down, up)| down <= i.start && up >= i.attempt)
            {
                return None;
            }
            Some(wipes.iter().filter(|&&(_, up)| up <= i.attempt).count())
        };
        let mut by_epoch: BTreeMap<usize, Vec<&Interval>> = BTreeMap::new();
        for i in ivs.iter() {
            if let Some(e) = epoch_of(i) {
                by_epoch.entry(e).or_default().push(i);
            }
        }
        for (_, mut acq) in by_epoch {
            acq.sort_by_key(|i| i.start);
            // Readers share the current token: only writers' must differ.
            let mut seen: HashMap<u64, &Interval> = HashMap::new();
            for i in acq.iter().filter(|i| !i.shared) {
                if let Some(prev) = seen.insert(i.fence, i) {
                    r.fence_duplicates.push(format!(
                        "key {key}: fence {} given to proc {} op {} and proc {} op {}",
                        i.fence, prev.proc_id, prev.op, i.proc_id, i.op
                    ));
                }
            }
            r.return_order_inversions +=
                acq.windows(2).filter(|w| w[1].fence < w[0].fence).count() as u64;
            // prefix max of fences in return order
            let mut prefix: Vec<(u64, u64, usize)> = Vec::with_capacity(acq.len());
            let mut best = (0u64, 0usize);
            for (idx, i) in acq.iter().enumerate() {
                if i.fence >= best.0 {
                    best = (i.fence, idx);
                }
                prefix.push((i.start, best.0, best.1));
            }
            for b in &acq {
                // Acquisitions that had returned before b was attempted.
                let n = prefix.partition_point(|&(start, _, _)| start < b.attempt);
                if n == 0 {
                    continue;
                }
                // A writer's token is above every token handed out before
                // it was attempted; a reader's is at least as high.
                let (_, max_fence, idx) = prefix[n - 1];
                if max_fence > b.fence || (max_fence == b.fence && !b.shared) {
                    let a = acq[idx];
                    r.fence_out_of_order.push(format!(
                        "key {key}: proc {} op {} got fence {} after proc {} op {} had returned with fence {}",
                        b.proc_id, b.op, b.fence, a.proc_id, a.op, a.fence
                    ));
                }
            }
        }
        // A killed holder's key: how soon did anyone get it again?
        for i in ivs.iter().filter(|i| i.killed) {
            let k = i.end;
            if let Some(next) = ivs.iter().filter(|j| j.start > k).map(|j| j.start).min() {
                r.crash_to_next_acquire_ms.push((next - k) / 1_000_000);
            }
        }
    }

    // Writes.
    for (key, ws) in writes.iter_mut() {
        r.writes += ws.len() as u64;
        let mut accepted: Vec<(u64, u64)> = ws
            .iter()
            .filter(|w| w.outcome == Outcome::Accepted)
            .map(|w| (w.done, w.fence))
            .collect();
        accepted.sort();
        let mut prefix_max = Vec::with_capacity(accepted.len());
        let mut m = 0;
        for &(done, fence) in &accepted {
            m = m.max(fence);
            prefix_max.push((done, m));
        }
        let carried: std::collections::HashSet<u64> = ws.iter().map(|w| w.fence).collect();
        for w in ws.iter() {
            match w.outcome {
                Outcome::Accepted => r.writes_accepted += 1,
                Outcome::Rejected(_) => r.writes_rejected += 1,
                Outcome::Failed => r.writes_failed += 1,
                Outcome::Unknown => r.writes_unknown += 1,
            }
            if let Outcome::Rejected(highest) = w.outcome {
                if highest <= w.fence || !carried.contains(&highest) {
                    r.phantom_rejections.push(format!(
                        "key {key}: write with fence {} rejected for {highest}, which no write carried",
                        w.fence
                    ));
                }
            }
            let n = prefix_max.partition_point(|&(done, _)| done < w.sent);
            let newer_before = n > 0 && prefix_max[n - 1].1 > w.fence;
            let decided = matches!(w.outcome, Outcome::Accepted | Outcome::Rejected(_));
            if newer_before && decided {
                r.stale_attempted += 1;
                match w.outcome {
                    Outcome::Rejected(_) => r.stale_rejected += 1,
                    _ => r.stale_accepted.push(format!(
                        "key {key}: proc {} op {} wrote with fence {} after fence {} had been accepted",
                        w.proc_id,
                        w.op,
                        w.fence,
                        prefix_max[n - 1].1
                    )),
                }
            }
            let paused = stops.get(&w.proc_id).is_some_and(|v| {
                // Holding when stopped, writing after a stop past the lease.
                v.iter().any(|&(s, c)| {
                    s + signal_skew >= w.attempt
                        && w.acquired <= s + signal_skew
                        && c <= w.sent
                        && c - s > lease_ns
                })
            });
            if paused && decided {
                r.paused_writes += 1;
                r.paused_writes_rejected += u64::from(matches!(w.outcome, Outcome::Rejected(_)));
                r.paused_writes_stale += u64::from(newer_before);
            }
        }
    }
    r
}

impl Report {
    /// Everything that breaks the lock's or the store's promises.
    pub fn violations(&self) -> Vec<String> {
        let mut v = Vec::new();
        let groups: [(&str, &Vec<String>); 7] = [
            ("double holder", &self.double_holders),
            ("fence duplicate", &self.fence_duplicates),
            ("fence order", &self.fence_out_of_order),
            ("held across a wipe", &self.held_across_wipe),
            ("unterminated interval", &self.unterminated),
            ("stale write accepted", &self.stale_accepted),
            ("phantom rejection", &self.phantom_rejections),
        ];
        for (what, list) in groups {
            for s in list.iter().take(20) {
                v.push(format!("{what}: {s}"));
            }
            if list.len() > 20 {
                v.push(format!("{what}: ... and {} more", list.len() - 20));
            }
        }
        if let Some(n) = self.orphan_renewals.filter(|&n| n > 0) {
            v.push(format!(
                "orphan renewals: {n} EVALSHA calls over the quiet period"
            ));
        }
        if let Some(keys) = self.leftover_keys.as_ref().filter(|k| !k.is_empty()) {
            v.push(format!("leftover keys: {keys:?}"));
        }
        v
    }

    /// Panic with every violation listed, if there is any.
    pub fn assert_clean(&self) {
        let v = self.violations();
        assert!(
            v.is_empty(),
            "the checker found {} problem(s):\n{}",
            v.len(),
            v.join("\n")
        );
    }

    /// The figures table.
    pub fn table(&self, title: &str) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "\n== {title} ==");
        let mut row = |k: &str, v: String| {
            let _ = writeln!(s, "  {k:<38} {v}");
        };
        row(
            "acquisitions checked",
            format!(
                "{} (attempts {}, wait timeouts {}, errors {})",
                self.acquisitions, self.attempts, self.timeouts, self.failures
            ),
        );
        if self.read_acquisitions > 0 {
            row(
                "of which read holds",
                format!(
                    "{} ({} overlaps between readers, allowed)",
                    self.read_acquisitions, self.shared_overlaps
                ),
            );
        }
        let faults: Vec<String> = self
            .faults
            .iter()
            .map(|(k, n)| format!("{k}: {n}"))
            .collect();
        let total: u64 = self.faults.values().sum();
        row(
            "faults injected",
            format!(
                "{total} ({})",
                if faults.is_empty() {
                    "none".into()
                } else {
                    faults.join(", ")
                }
            ),
        );
        let excused: Vec<String> = self
            .excused
            .iter()
            .map(|(k, (n, max))| format!("{k}: {n}, longest {:.1} ms", ms(*max)))
            .collect();
        row(
            "double holders found",
            format!(
                "{} (overlaps excused by lease semantics: {})",
                self.double_holders.len(),
                if excused.is_empty() {
                    "none".into()
                } else {
                    excused.join("; ")
                }
            ),
        );
        row(
            "fence violations",
            format!(
                "{} (duplicates {}, out of real-time order {}; late replies with older tokens {})",
                self.fence_duplicates.len() + self.fence_out_of_order.len(),
                self.fence_duplicates.len(),
                self.fence_out_of_order.len(),
                self.return_order_inversions
            ),
        );
        row(
            "stale writes rejected/attempted",
            format!(
                "{}/{} (accepted stale: {}; phantom rejections: {})",
                self.stale_rejected,
                self.stale_attempted,
                self.stale_accepted.len(),
                self.phantom_rejections.len()
            ),
        );
        row(
            "writes by holders paused > lease",
            format!(
                "{} (stale {}, rejected {})",
                self.paused_writes, self.paused_writes_stale, self.paused_writes_rejected
            ),
        );
        row(
            "writes",
            format!(
                "{} (accepted {}, rejected {}, failed {}, outcome unknown {})",
                self.writes,
                self.writes_accepted,
                self.writes_rejected,
                self.writes_failed,
                self.writes_unknown
            ),
        );
        row(
            "holders told lost / held across wipe",
            format!("{} / {}", self.losses, self.held_across_wipe.len()),
        );
        if !self.crash_to_next_acquire_ms.is_empty() {
            let mut v = self.crash_to_next_acquire_ms.clone();
            v.sort();
            row(
                "killed holder -> key acquired again",
                format!(
                    "n {}, median {} ms, max {} ms",
                    v.len(),
                    v[v.len() / 2],
                    v[v.len() - 1]
                ),
            );
        }
        row(
            "orphan renewals",
            self.orphan_renewals
                .map_or("not measured".into(), |n| n.to_string()),
        );
        row(
            "leftover keys",
            self.leftover_keys
                .as_ref()
                .map_or("not measured".into(), |k| k.len().to_string()),
        );
        if !self.unterminated.is_empty() {
            row(
                "unterminated intervals",
                self.unterminated.len().to_string(),
            );
        }
        for (k, v) in &self.extra {
            row(k, v.clone());
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn ev(t: u64, p: u32, op: u64, kind: Kind) -> Event {
        Event {
            t: t * MS,
            proc_id: p,
            op,
            key: "k".into(),
            kind,
        }
    }

    fn held(p: u32, op: u64, from: u64, to: u64, fence: u64, end: Kind) -> Vec<Event> {
        vec![
            ev(from - 1, p, op, Kind::Attempt),
            ev(from, p, op, Kind::Acquired { fence }),
            ev(to, p, op, Kind::Releasing),
            ev(to + 1, p, op, end),
        ]
    }

    fn cfg() -> CheckConfig {
        CheckConfig {
            lease: Duration::from_millis(1000),
            slop: Duration::from_millis(100),
        }
    }

    #[test]
    fn lines_round_trip() {
        for kind in [
            Kind::Attempt,
            Kind::Acquired { fence: 7 },
            Kind::WriteRejected {
                fence: 3,
                highest: 9,
            },
            Kind::BodyEnd,
        ] {
            let e = Event {
                t: 12,
                proc_id: 3,
                op: 4,
                key: "hot:1".into(),
                kind,
            };
            assert_eq!(Event::parse(&e.to_line()), Some(e));
        }
        assert_eq!(
            Event::parse("H 1 2 3 k acquired"),
            None,
            "a torn line is not an event"
        );
    }

    #[test]
    fn confirmed_overlap_is_a_double_holder() {
        let mut events = held(1, 1, 10, 50, 1, Kind::Released);
        events.extend(held(2, 1, 40, 80, 2, Kind::Released));
        let r = check(
            &History {
                events,
                faults: vec![],
            },
            &cfg(),
        );
        assert_eq!(r.double_holders.len(), 1, "{r:?}");
    }

    fn read(p: u32, op: u64, from: u64, to: u64, fence: u64) -> Vec<Event> {
        vec![
            ev(from - 1, p, op, Kind::Attempt),
            ev(from, p, op, Kind::AcquiredRead { fence }),
            ev(to, p, op, Kind::Releasing),
            ev(to + 1, p, op, Kind::Released),
        ]
    }

    #[test]
    fn readers_may_overlap_but_never_with_a_writer() {
        // Two readers together, with one token: fine.
        let mut events = held(1, 1, 10, 20, 5, Kind::Released);
        events.extend(read(2, 1, 30, 60, 5));
        events.extend(read(3, 1, 40, 70, 5));
        let h = |events| History {
            events,
            faults: vec![],
        };
        let r = check(&h(events.clone()), &cfg());
        assert!(r.violations().is_empty(), "{:?}", r.violations());
        assert_eq!((r.read_acquisitions, r.shared_overlaps), (2, 1));
        // A writer inside the readers' time: two double holders.
        let mut with_writer = events.clone();
        with_writer.extend(held(4, 1, 50, 55, 6, Kind::Released));
        assert_eq!(check(&h(with_writer), &cfg()).double_holders.len(), 2);
        // A reader's token below one handed out before it asked.
        let mut stale = events.clone();
        stale.extend(read(5, 1, 80, 90, 4));
        assert_eq!(check(&h(stale), &cfg()).fence_out_of_order.len(), 1);
        // A writer reusing the readers' token.
        let mut reused = events;
        reused.extend(held(6, 1, 80, 90, 5, Kind::Released));
        assert_eq!(check(&h(reused), &cfg()).fence_out_of_order.len(), 1);
    }

    #[test]
    fn disjoint_holders_are_fine() {
        let mut events = held(1, 1, 10, 50, 1, Kind::Released);
        events.extend(held(2, 1, 60, 80, 2, Kind::Released));
        let r = check(
            &History {
                events,
                faults: vec![],
            },
            &cfg(),
        );
        assert!(r.violations().is_empty(), "{:?}", r.violations());
        assert_eq!(r.acquisitions, 2);
    }

    #[test]
    fn paused_holder_is_excused_and_its_stale_write_must_be_rejected() {
        let mut events = held(1, 1, 10, 3000, 1, Kind::ReleaseLost);
        events.extend(held(2, 1, 1500, 1600, 2, Kind::Released));
        events.push(ev(1510, 2, 1, Kind::Write { fence: 2 }));
        events.push(ev(1511, 2, 1, Kind::WriteOk { fence: 2 }));
        // The paused holder writes after it resumed: accepted = violation.
        events.push(ev(2600, 1, 1, Kind::Write { fence: 1 }));
        events.push(ev(2601, 1, 1, Kind::WriteOk { fence: 1 }));
        let faults = vec![
            Fault {
                t: 20 * MS,
                proc_id: Some(1),
                kind: FaultKind::Stop,
            },
            Fault {
                t: 2500 * MS,
                proc_id: Some(1),
                kind: FaultKind::Cont,
            },
        ];
        let r = check(&History { events, faults }, &cfg());
        assert!(r.double_holders.is_empty(), "{:?}", r.double_holders);
        assert_eq!(r.excused.len(), 1);
        assert_eq!(r.stale_attempted, 1);
        assert_eq!(r.stale_accepted.len(), 1);
        assert_eq!(r.paused_writes, 1);
    }

    #[test]
    fn fences_must_follow_real_time_order() {
        let mut events = held(1, 1, 10, 20, 5, Kind::Released);
        events.extend(held(2, 1, 30, 40, 4, Kind::Released));
        let r = check(
            &History {
                events,
                faults: vec![],
            },
            &cfg(),
        );
        assert_eq!(r.fence_out_of_order.len(), 1, "{r:?}");
    }

    #[test]
    fn late_loss_notice_is_a_double_holder() {
        let mut events = held(1, 1, 10, 900, 1, Kind::ReleaseLost);
        events.extend(held(2, 1, 500, 600, 2, Kind::Released));
        let r = check(
            &History {
                events,
                faults: vec![],
            },
            &cfg(),
        );
        assert_eq!(
            r.double_holders.len(),
            1,
            "400 ms late is not latency: {r:?}"
        );
    }
}
