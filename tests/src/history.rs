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
//! **Permits.** A semaphore call records its `permits` with its attempt
//! (`attempt_permits`) and its grant as `acquired_permit`. Permit holders
//! of a key are not judged in pairs: at each admission, the holders then
//! that were granted before it (a lower token) and itself must number no
//! more than its own `permits`, and for each n the holders of an N ≤ n no
//! more than n (calls that disagree on N: one of a larger N may be granted
//! later and come back first). A holder that is not confirmed is left out of the count
//! while its permit may have lapsed in Redis: wiped, told lost within
//! `slop`, as above, and, paused, from two thirds of a lease (less `slop`)
//! after its pause began: the watchdog renews every third of a lease, so
//! a holder stopped while it ran had a renewal (or its grant) at most a
//! third of a lease before; until then Redis still counted its permit and
//! must have kept the others out. (A lock holder is excused from its
//! pause on.) This holds where renewals reach Redis: lost replies (the
//! command ran), kills and pauses, not a cut or a black hole.
//! Tokens of permit holders must differ; their order is not judged
//! (several hold at once). A `Timeout` of a semaphore call needs as many
//! other calls as its `permits` that could have held the key during its
//! wait.
//!
//! **Fences.** Per key and *epoch* (the span between two restarts that wiped
//! Redis; an acquisition whose attempt straddles one is left out): no two
//! writers share a fence, and no holder's token is below that of a holder
//! whose acquisition came back before its own did. Tokens follow grant
//! order in Redis (a writer's is above every earlier one, readers get the
//! current one), so the holder with the older token was granted first; the
//! later grant needed that lock gone (a writer's, or readers' behind a
//! writer with the newer token), so the older holder's body started after
//! its own lock had ended: a body run without its lock, also when the two
//! never overlapped. A reader may share the token of the writer before it
//! (it was granted after that writer); a writer never shares the token of
//! readers that came back before it. Excused, and counted: the late holder
//! was paused (SIGSTOP) between its call and its acquisition, the lease
//! limit that fencing covers (a delayed reply is no excuse: a grant that
//! comes back after its lease ran out must not be reported held).
//!
//! **Calls.** Every lock call records its `wait`, and how long it took. A
//! backend error before the deadline is a failure with budget left (the
//! call should have tried again), as is a `Timeout` while no other call on
//! the key could have held the lock in Redis at any point of the wait, or
//! an error no lock call should return. A call that ends more than one
//! `op_timeout` (the attempt in flight at the deadline) plus slop past its
//! deadline overran it, unless its process was paused meanwhile.
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
    /// A lock call starts, with the `wait` it was given.
    Attempt {
        wait_ms: u64,
    },
    /// A semaphore call starts: its `wait`, and the `permits` it asks
    /// within (at most that many holders, itself included).
    AttemptPermits {
        wait_ms: u64,
        permits: u64,
    },
    Acquired {
        fence: u64,
    },
    /// A read lock: shared with other readers, never with a writer.
    AcquiredRead {
        fence: u64,
    },
    /// A permit of a semaphore: shared with at most `permits - 1` other
    /// holders (the call's own `permits`), each with a token of its own.
    AcquiredPermit {
        fence: u64,
    },
    /// `LockError::Timeout`: the lock stayed busy for the whole wait; how
    /// long the call took.
    Timeout {
        waited_ms: u64,
    },
    /// Any other acquire error: how long the call took, and what it was.
    Failed {
        waited_ms: u64,
        error: Failure,
    },
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

/// What kind of error a failed lock call returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// `LockError::Backend`: Redis unreachable, no answer, a script error.
    Backend,
    /// Anything else (an error no lock call here should return).
    Other,
}

impl Failure {
    fn word(self) -> &'static str {
        match self {
            Failure::Backend => "backend",
            Failure::Other => "other",
        }
    }

    fn parse(word: &str) -> Option<Failure> {
        match word {
            "backend" => Some(Failure::Backend),
            "other" => Some(Failure::Other),
            _ => None,
        }
    }
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
            Kind::Attempt { wait_ms } => ("attempt", Some(wait_ms), None),
            Kind::AttemptPermits { wait_ms, permits } => {
                ("attempt_permits", Some(wait_ms), Some(permits))
            }
            Kind::Acquired { fence } => ("acquired", Some(fence), None),
            Kind::AcquiredRead { fence } => ("acquired_read", Some(fence), None),
            Kind::AcquiredPermit { fence } => ("acquired_permit", Some(fence), None),
            Kind::Timeout { waited_ms } => ("timeout", Some(waited_ms), None),
            Kind::Failed { waited_ms, .. } => ("failed", Some(waited_ms), None),
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
        if let Kind::Failed { error, .. } = self.kind {
            let _ = write!(s, " {}", error.word());
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
        let args: Vec<&str> = it.collect();
        let mut at = 0;
        let mut num = || {
            at += 1;
            args.get(at - 1).and_then(|n| n.parse::<u64>().ok())
        };
        let kind = match name {
            "attempt" => Kind::Attempt { wait_ms: num()? },
            "attempt_permits" => Kind::AttemptPermits {
                wait_ms: num()?,
                permits: num()?,
            },
            "acquired" => Kind::Acquired { fence: num()? },
            "acquired_read" => Kind::AcquiredRead { fence: num()? },
            "acquired_permit" => Kind::AcquiredPermit { fence: num()? },
            "timeout" => Kind::Timeout { waited_ms: num()? },
            "failed" => Kind::Failed {
                waited_ms: num()?,
                error: Failure::parse(args.get(1)?)?,
            },
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
    /// One command connection's replies come `ms` late for a spell, while
    /// every other connection (subscriptions too) stays fast.
    ProxySlowSpell {
        ms: u64,
    },
    /// An acquire's reply is lost, and the connection that sends it again
    /// gets its replies `ms` late (past the client's orphan-grant timer).
    ProxyLateRepeat {
        ms: u64,
    },
    /// The transport sends a command again, `after_ms` after the first.
    ProxyResend {
        after_ms: u64,
    },
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
            FaultKind::ProxySlowSpell { .. } => "slow spell, one connection",
            FaultKind::ProxyLateRepeat { .. } => "reply lost, repeat answered late",
            FaultKind::ProxyResend { .. } => "command re-sent by the transport",
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
    /// The clients' operation timeout: a lock call may end at most this
    /// (plus `slop`) after its wait ran out, for the attempt in flight.
    /// `None`: overruns are not judged.
    pub op_timeout: Option<Duration>,
    /// An attributed body that returned normally within `slop` of an
    /// overlap's start bounds that overlap as a loss notice would: it had
    /// no notice to get, its next renewal being still to come, and the
    /// attribute only logs what its release finds. For deployments that
    /// lose grants by design (Sentinel without `replica_acks`), where the
    /// question is whether every overlap is bounded; `false` elsewhere.
    pub body_end_bounds: bool,
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
    /// A semaphore's permit, asked within this many: may overlap fewer
    /// than that many other permit holders, each with its own token.
    permits: Option<u64>,
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
    /// Of which permits of a semaphore.
    pub permit_acquisitions: u64,
    /// Permits taken while as many holders as the call's `permits` (or
    /// more) already held the key, none of them excused.
    pub over_permits: Vec<String>,
    /// The most permit holders of one key at once: counted (holders whose
    /// permit may have lapsed left out, see the module docs), and all.
    pub max_permit_holders: (u64, u64),
    pub timeouts: u64,
    pub failures: u64,
    pub faults: BTreeMap<&'static str, u64>,
    /// Double holders: overlaps where neither holder is excused.
    pub double_holders: Vec<String>,
    /// Overlaps excused, by reason: (count, longest overlap in ns).
    pub excused: BTreeMap<&'static str, (u64, u64)>,
    pub fence_duplicates: Vec<String>,
    /// Holders whose token is below that of a holder whose acquisition
    /// came back before theirs did: their own grant was gone before their
    /// body started (see the module docs).
    pub fence_out_of_order: Vec<String>,
    /// The same, excused: the late holder's process was paused between
    /// its call and its acquisition (lease semantics; fencing stops it).
    pub return_order_inversions: u64,
    /// Lock calls that failed although their `wait` had time left: a
    /// backend error before the deadline, a `Timeout` while nobody could
    /// have held the lock, or an error no lock call here should return.
    pub failed_with_budget: Vec<String>,
    /// Lock calls that ended more than one `op_timeout` (plus slop) after
    /// their deadline.
    pub overruns: Vec<String>,
    /// The longest any call took past its deadline (ns), pauses excluded.
    pub max_overrun_ns: u64,
    /// Backend errors at the deadline while other calls may have held the
    /// key: counted, not judged (the call cannot be shown to have seen the
    /// lock busy), though a lock seen busy throughout is a `Timeout`.
    pub backend_errors_while_busy: u64,
    /// Each double holder, fence-order violation, failed call and
    /// overrun, with the ops involved.
    pub culprits: Vec<Culprit>,
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

/// One violation and the ops (process, op) involved, for [`trace`].
#[derive(Debug, Clone)]
pub struct Culprit {
    pub kind: &'static str,
    pub what: String,
    pub ops: Vec<(u32, u64)>,
}

fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

fn holder_kind(i: &Interval) -> &'static str {
    if i.shared {
        "reader"
    } else {
        "writer"
    }
}

/// How a lock call itself ended.
#[derive(Debug, Clone, Copy)]
enum CallEnd {
    Acquired,
    Timeout,
    Failed(Failure),
}

/// One lock call: what it was given, how it ended, and how long its owner
/// may have held the lock in Redis.
#[derive(Debug, Clone)]
struct Call {
    proc_id: u32,
    op: u64,
    key: String,
    attempt: u64,
    wait_ns: u64,
    /// A semaphore call: within this many permits.
    permits: Option<u64>,
    /// When the call returned, how long it said it took, and how it ended;
    /// `None`: its process died first.
    end: Option<(u64, u64, CallEnd)>,
    /// Until then, from its attempt on, Redis may have held the lock for
    /// this call's owner: its last event (or its process's death), plus a
    /// lease unless its release came back `Ok`.
    may_hold_until: u64,
}

fn call_of(
    (proc_id, op): (u32, u64),
    key: &str,
    evs: &[&Event],
    killed: Option<u64>,
    lease_ns: u64,
) -> Option<Call> {
    let (attempt, wait_ms, permits) = evs.iter().find_map(|e| match e.kind {
        Kind::Attempt { wait_ms } => Some((e.t, wait_ms, None)),
        Kind::AttemptPermits { wait_ms, permits } => Some((e.t, wait_ms, Some(permits))),
        _ => None,
    })?;
    let end = evs.iter().find_map(|e| match e.kind {
        Kind::Acquired { .. } | Kind::AcquiredRead { .. } | Kind::AcquiredPermit { .. } => {
            Some((e.t, e.t.saturating_sub(attempt), CallEnd::Acquired))
        }
        Kind::Timeout { waited_ms } => Some((e.t, waited_ms * 1_000_000, CallEnd::Timeout)),
        Kind::Failed { waited_ms, error } => {
            Some((e.t, waited_ms * 1_000_000, CallEnd::Failed(error)))
        }
        _ => None,
    });
    let finished = evs.iter().any(|e| {
        matches!(
            e.kind,
            Kind::Released
                | Kind::ReleaseLost
                | Kind::ReleaseFailed
                | Kind::Timeout { .. }
                | Kind::Failed { .. }
                | Kind::BodyEnd
                | Kind::Lost
        )
    });
    let mut last = evs.last().map_or(attempt, |e| e.t);
    if let Some(k) = killed.filter(|&k| !finished && k >= attempt) {
        last = last.max(k);
    }
    let confirmed = evs.iter().any(|e| e.kind == Kind::Released);
    Some(Call {
        proc_id,
        op,
        key: key.to_owned(),
        attempt,
        wait_ns: wait_ms * 1_000_000,
        permits,
        end,
        may_hold_until: last + if confirmed { 0 } else { lease_ns },
    })
}

/// Lock calls that failed with time left, and calls that overran their
/// deadline.
///
/// A backend error before the deadline is a failure with budget left: the
/// call should have tried again. So is a `Timeout` when no other call on
/// the key could have held the lock at any point of the wait (every other
/// call counts as a possible holder from its attempt to its end, plus a
/// lease unless its release was confirmed; so does a command re-sent by
/// the transport, for a lease after it ran). A call may end at most one
/// `op_timeout` after its deadline (the attempt in flight then), plus
/// slop; a call whose process was paused meanwhile is not judged.
fn check_calls(
    r: &mut Report,
    calls: &[Call],
    faults: &[Fault],
    cfg: &CheckConfig,
    paused_between: &dyn Fn(u32, u64, u64) -> bool,
) {
    let slop = cfg.slop.as_nanos() as u64;
    let lease = cfg.lease.as_nanos() as u64;
    let resent: Vec<(u64, u64)> = faults
        .iter()
        .filter_map(|f| match f.kind {
            FaultKind::ProxyResend { after_ms } => {
                Some((f.t.saturating_sub(after_ms * 1_000_000), f.t + lease))
            }
            _ => None,
        })
        .collect();
    let mut by_key: HashMap<&str, Vec<&Call>> = HashMap::new();
    for c in calls {
        by_key.entry(&c.key).or_default().push(c);
    }
    for c in calls {
        let Some((end, waited, how)) = c.end else {
            continue;
        };
        let what = format!(
            "key {}: proc {} op {} {} after {:.0} ms of a {:.0} ms wait",
            c.key,
            c.proc_id,
            c.op,
            match how {
                CallEnd::Acquired => "acquired",
                CallEnd::Timeout => "timed out",
                CallEnd::Failed(Failure::Backend) => "failed with a backend error",
                CallEnd::Failed(Failure::Other) => "failed with an unexpected error",
            },
            ms(waited),
            ms(c.wait_ns)
        );
        // A semaphore call is kept out only by `permits` others at once:
        // fewer than that many in its whole wait cannot have been.
        let busy = || {
            let others = by_key[c.key.as_str()]
                .iter()
                .filter(|o| {
                    (o.proc_id, o.op) != (c.proc_id, c.op)
                        && o.attempt <= end
                        && o.may_hold_until >= c.attempt
                })
                .count()
                + resent
                    .iter()
                    .filter(|&&(from, to)| from <= end && to >= c.attempt)
                    .count();
            others as u64 >= c.permits.unwrap_or(1)
        };
        let failed = match how {
            CallEnd::Acquired => None,
            CallEnd::Failed(Failure::Other) => Some("no lock call here may fail so"),
            CallEnd::Failed(Failure::Backend) if waited + slop < c.wait_ns => {
                Some("its wait had time left")
            }
            CallEnd::Failed(Failure::Backend) => {
                r.backend_errors_while_busy += u64::from(busy());
                None
            }
            CallEnd::Timeout => (!busy()).then_some("nobody could have held the lock meanwhile"),
        };
        if let Some(why) = failed {
            let m = format!("{what}: {why}");
            r.failed_with_budget.push(m.clone());
            r.culprits.push(Culprit {
                kind: "failed with budget left",
                what: m,
                ops: vec![(c.proc_id, c.op)],
            });
        }
        if paused_between(c.proc_id, c.attempt, end) {
            continue;
        }
        let over = waited.saturating_sub(c.wait_ns);
        r.max_overrun_ns = r.max_overrun_ns.max(over);
        if let Some(op_timeout) = cfg.op_timeout {
            if over > op_timeout.as_nanos() as u64 + slop {
                let m = format!(
                    "{what}: {:.0} ms past its deadline (op_timeout {op_timeout:?})",
                    ms(over)
                );
                r.overruns.push(m.clone());
                r.culprits.push(Culprit {
                    kind: "past its deadline",
                    what: m,
                    ops: vec![(c.proc_id, c.op)],
                });
            }
        }
    }
}

/// The events of the given ops and the faults between their first and
/// last event, one line each, times in ms from the first: what a
/// violation looked like.
pub fn trace(history: &History, ops: &[(u32, u64)]) -> String {
    let mut evs: Vec<&Event> = history
        .events
        .iter()
        .filter(|e| ops.contains(&(e.proc_id, e.op)))
        .collect();
    evs.sort_by_key(|e| e.t);
    let (Some(first), Some(last)) = (evs.first().map(|e| e.t), evs.last().map(|e| e.t)) else {
        return String::new();
    };
    let mut lines: Vec<(u64, String)> = evs
        .iter()
        .map(|e| {
            let line = e.to_line();
            let rest = line.splitn(6, ' ').nth(5).unwrap_or("");
            (
                e.t,
                format!("proc {} op {} {}: {rest}", e.proc_id, e.op, e.key),
            )
        })
        .collect();
    for f in &history.faults {
        if f.t >= first && f.t <= last && f.kind.label().is_some() {
            lines.push((f.t, format!("fault {:?}", f.kind)));
        }
    }
    lines.sort_by_key(|(t, _)| *t);
    let mut out = String::new();
    for (t, l) in lines {
        let _ = writeln!(out, "    {:>9.1} ms  {l}", ms(t - first));
    }
    out
}

/// At every admission of a permit holder of `key`, the holders then
/// (itself included, those `excuse` lets off left out) must be no more
/// than the call's own `permits`: a request is admitted while fewer than
/// its own limit hold. Where calls disagree on N, holders of a larger N may
/// be admitted later and come back first, so what is bounded is, for each
/// n, the holders of an N ≤ n: at most n (each was admitted while fewer
/// than its N ≤ n held). Counting at admissions is enough, as a count only
/// rises there.
fn check_permits(
    r: &mut Report,
    key: &str,
    ivs: &[Interval],
    excuse: &dyn Fn(&Interval, u64) -> Option<&'static str>,
) {
    let permits: Vec<&Interval> = ivs.iter().filter(|i| i.permits.is_some()).collect();
    for (n, b) in permits.iter().enumerate() {
        let active: Vec<&Interval> = permits[..n]
            .iter()
            .copied()
            .filter(|a| a.end > b.start)
            .collect();
        let mut counted = vec![*b];
        for a in &active {
            match excuse(a, b.start) {
                Some(reason) => {
                    let e = r.excused.entry(reason).or_default();
                    e.0 += 1;
                    e.1 = e.1.max(a.end.min(b.end) - b.start);
                }
                None => counted.push(a),
            }
        }
        let all = active.len() as u64 + 1;
        r.max_permit_holders.0 = r.max_permit_holders.0.max(counted.len() as u64);
        r.max_permit_holders.1 = r.max_permit_holders.1.max(all);
        let limit = b.permits.unwrap_or(1);
        let before = counted.iter().filter(|i| i.fence <= b.fence).count() as u64;
        let over = if before > limit {
            Some((limit, before, "granted before it"))
        } else {
            counted
                .iter()
                .filter_map(|i| i.permits)
                .filter(|&n| n >= limit)
                .find_map(|n| {
                    let within = counted
                        .iter()
                        .filter(|i| i.permits.unwrap_or(1) <= n)
                        .count() as u64;
                    (within > n).then_some((n, within, "of N ≤ that at once"))
                })
        };
        if let Some((limit, held, how)) = over {
            let by_token = how == "granted before it";
            let counted: Vec<&Interval> = counted
                .into_iter()
                .filter(|i| {
                    if by_token {
                        i.fence <= b.fence
                    } else {
                        i.permits.unwrap_or(1) <= limit
                    }
                })
                .collect();
            let who: Vec<String> = counted
                .iter()
                .map(|i| {
                    format!(
                        "proc {} op {} (fence {}, {:?})",
                        i.proc_id, i.op, i.fence, i.confirm
                    )
                })
                .collect();
            let m = format!(
                "key {key}: {held} permit holders {how}, {limit} allowed, admitting proc {} op {}: {}",
                b.proc_id,
                b.op,
                who.join(", ")
            );
            r.over_permits.push(m.clone());
            r.culprits.push(Culprit {
                kind: "more holders than permits",
                what: m,
                ops: counted.iter().map(|i| (i.proc_id, i.op)).collect(),
            });
        }
    }
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
    let mut calls: Vec<Call> = Vec::new();
    for ((p, op), mut evs) in ops {
        evs.sort_by_key(|e| e.t);
        let key = evs[0].key.clone();
        let attempt = evs
            .iter()
            .find(|e| matches!(e.kind, Kind::Attempt { .. } | Kind::AttemptPermits { .. }))
            .map(|e| e.t);
        let permits = evs.iter().find_map(|e| match e.kind {
            Kind::AttemptPermits { permits, .. } => Some(permits),
            _ => None,
        });
        calls.extend(call_of(
            (p, op),
            &key,
            &evs,
            kills.get(&p).copied(),
            lease_ns,
        ));
        let mut acquired = None;
        let mut shared = false;
        let mut end: Option<(u64, Confirm, bool)> = None;
        let mut releasing = None;
        let mut pending: Vec<(u64, u64)> = Vec::new();
        let mut op_writes = Vec::new();
        for e in &evs {
            match e.kind {
                Kind::Attempt { .. } | Kind::AttemptPermits { .. } => r.attempts += 1,
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
                Kind::AcquiredPermit { fence } => {
                    r.acquisitions += 1;
                    r.permit_acquisitions += 1;
                    acquired = Some((e.t, fence));
                }
                Kind::Timeout { .. } => r.timeouts += 1,
                Kind::Failed { .. } => r.failures += 1,
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
            permits,
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

    check_calls(&mut r, &calls, &faults, cfg, &paused_between);

    // Double holders.
    let excuse = |h: &Interval, o_start: u64| -> Option<&'static str> {
        if h.confirm == Confirm::Confirmed {
            return None;
        }
        if paused_between(h.proc_id, h.attempt, o_start) {
            return Some("paused (SIGSTOP past the lease)");
        }
        if h.confirm == Confirm::Unknown {
            if cfg.body_end_bounds && h.end.saturating_sub(o_start) <= slop_ns {
                return Some("body ended within the allowance");
            }
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
    // A permit holder counts while its permit is surely still valid in
    // Redis: paused, until two thirds of a lease after its pause began (its
    // last renewal was at most a third of a lease before), not only until
    // the pause as a lock holder; the other excuses as for locks.
    let permit_excuse = |h: &Interval, t: u64| -> Option<&'static str> {
        if h.confirm == Confirm::Confirmed {
            return None;
        }
        let lapsed = stops.get(&h.proc_id).is_some_and(|v| {
            v.iter()
                .any(|&(s, _)| s + signal_skew >= h.attempt && s + lease_ns * 2 / 3 <= t + slop_ns)
        });
        if lapsed {
            return Some("permit of a holder paused past its renewal");
        }
        if h.confirm == Confirm::Unknown {
            return None;
        }
        if wiped_between(h.attempt, t) {
            return Some("wiped (Redis restarted empty)");
        }
        if (h.told_lost || h.killed) && h.end.saturating_sub(t) <= slop_ns {
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
                // Permit holders are counted together, below.
                if a.permits.is_some() && b.permits.is_some() {
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
                    None => {
                        let m = format!(
                            "key {key}: proc {} op {} (fence {}, {:?}) and proc {} op {} (fence {}, {:?}) both held it for {:.1} ms",
                            a.proc_id, a.op, a.fence, a.confirm, b.proc_id, b.op, b.fence, b.confirm, ms(overlap)
                        );
                        r.double_holders.push(m.clone());
                        r.culprits.push(Culprit {
                            kind: "double holder",
                            what: m,
                            ops: vec![(a.proc_id, a.op), (b.proc_id, b.op)],
                        });
                    }
                }
            }
            active.push(b);
        }
        check_permits(&mut r, key, ivs, &permit_excuse);
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
            // Tokens must differ between permit holders too; their order
            // says nothing (several hold at once, in any return order).
            let permit_fences: Vec<&Interval> = acq
                .iter()
                .copied()
                .filter(|i| i.permits.is_some())
                .collect();
            acq.retain(|i| i.permits.is_none());
            let mut seen: HashMap<u64, &Interval> = HashMap::new();
            for i in permit_fences {
                if let Some(prev) = seen.insert(i.fence, i) {
                    r.fence_duplicates.push(format!(
                        "key {key}: permit token {} given to proc {} op {} and proc {} op {}",
                        i.fence, prev.proc_id, prev.op, i.proc_id, i.op
                    ));
                }
            }
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
            // Token order is grant order in Redis: a writer's token is above
            // every earlier one, a reader's is the current one. So a
            // holder whose token is below one that came back before its
            // own did was granted first, and that later grant (a writer's,
            // or the readers' behind a writer) needed its lock gone: its
            // body started without its lock. A reader of a writer's token
            // was granted after that writer; a writer sharing readers'
            // token, never. Only a pause of the late holder excuses it.
            let rank = |i: &Interval| (i.fence, u8::from(i.shared));
            let mut best: Option<&Interval> = None;
            let mut k = 0;
            for b in &acq {
                // Every acquisition that came back before b's did.
                while k < acq.len() && acq[k].start < b.start {
                    if best.is_none_or(|m| rank(acq[k]) >= rank(m)) {
                        best = Some(acq[k]);
                    }
                    k += 1;
                }
                let Some(a) = best.filter(|a| rank(a) > rank(b)) else {
                    continue;
                };
                if paused_between(b.proc_id, b.attempt, b.start) {
                    r.return_order_inversions += 1;
                    continue;
                }
                let m = format!(
                    "key {key}: proc {} op {} ({}) got fence {} {:.0} ms after asking, {:.0} ms after proc {} op {} ({}) had come back with fence {} (newer by {}): its grant was gone before its body started",
                    b.proc_id,
                    b.op,
                    holder_kind(b),
                    b.fence,
                    ms(b.start - b.attempt),
                    ms(b.start - a.start),
                    a.proc_id,
                    a.op,
                    holder_kind(a),
                    a.fence,
                    a.fence - b.fence,
                );
                r.fence_out_of_order.push(m.clone());
                let mut ops = vec![(b.proc_id, b.op), (a.proc_id, a.op)];
                // A reader's newer token is a writer's: show that writer.
                if let Some(w) = acq
                    .iter()
                    .find(|w| a.shared && !w.shared && w.fence == a.fence)
                {
                    ops.push((w.proc_id, w.op));
                }
                r.culprits.push(Culprit {
                    kind: "fence order",
                    what: m,
                    ops,
                });
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
                // The resumed process may write before the test stamps
                // its SIGCONT: the same skew applies.
                v.iter().any(|&(s, c)| {
                    s + signal_skew >= w.attempt
                        && w.acquired <= s + signal_skew
                        && s < w.sent
                        && c <= w.sent + signal_skew
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
        let groups: [(&str, &Vec<String>); 10] = [
            ("double holder", &self.double_holders),
            ("more holders than permits", &self.over_permits),
            ("fence duplicate", &self.fence_duplicates),
            ("fence order", &self.fence_out_of_order),
            ("failed with budget left", &self.failed_with_budget),
            ("past its deadline", &self.overruns),
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
        if self.permit_acquisitions > 0 {
            row(
                "of which permits",
                format!(
                    "{} (most holders of one key at once: {} counted, {} with those whose permit may have lapsed; over the limit: {})",
                    self.permit_acquisitions,
                    self.max_permit_holders.0,
                    self.max_permit_holders.1,
                    self.over_permits.len()
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
                "{} (duplicates {}, below an earlier holder's {}; older tokens after a pause, excused: {})",
                self.fence_duplicates.len() + self.fence_out_of_order.len(),
                self.fence_duplicates.len(),
                self.fence_out_of_order.len(),
                self.return_order_inversions
            ),
        );
        row(
            "failed calls with budget left",
            format!(
                "{} (backend errors at the deadline of a wait on a key others held: {})",
                self.failed_with_budget.len(),
                self.backend_errors_while_busy
            ),
        );
        row(
            "calls past deadline + op_timeout",
            format!(
                "{} (longest past the deadline: {:.0} ms)",
                self.overruns.len(),
                ms(self.max_overrun_ns)
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

    /// A lock call with a 2 s wait.
    const ASK: Kind = Kind::Attempt { wait_ms: 2000 };

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
            ev(from - 1, p, op, ASK),
            ev(from, p, op, Kind::Acquired { fence }),
            ev(to, p, op, Kind::Releasing),
            ev(to + 1, p, op, end),
        ]
    }

    fn cfg() -> CheckConfig {
        CheckConfig {
            lease: Duration::from_millis(1000),
            slop: Duration::from_millis(100),
            op_timeout: Some(Duration::from_millis(500)),
            body_end_bounds: false,
        }
    }

    fn h(events: Vec<Event>) -> History {
        History {
            events,
            faults: vec![],
        }
    }

    #[test]
    fn lines_round_trip() {
        for kind in [
            ASK,
            Kind::Acquired { fence: 7 },
            Kind::WriteRejected {
                fence: 3,
                highest: 9,
            },
            Kind::BodyEnd,
            Kind::Timeout { waited_ms: 2001 },
            Kind::Failed {
                waited_ms: 12,
                error: Failure::Backend,
            },
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
            ev(from - 1, p, op, ASK),
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

    /// Process 1 holds the key (fence 1) and is stopped from 20 ms to
    /// 2500 ms; meanwhile process 2 takes it (fence 2) and writes. Then
    /// process 1 writes at `at` ms (its send) with `outcome`.
    fn paused_then_writes(at: u64, outcome: Kind) -> History {
        let mut events = held(1, 1, 10, 3000, 1, Kind::ReleaseLost);
        events.extend(held(2, 1, 1500, 1600, 2, Kind::Released));
        events.push(ev(1510, 2, 1, Kind::Write { fence: 2 }));
        events.push(ev(1511, 2, 1, Kind::WriteOk { fence: 2 }));
        events.push(ev(at, 1, 1, Kind::Write { fence: 1 }));
        events.push(ev(at + 1, 1, 1, outcome));
        let faults = [(20, FaultKind::Stop), (2500, FaultKind::Cont)]
            .into_iter()
            .map(|(t, kind)| Fault {
                t: t * MS,
                proc_id: Some(1),
                kind,
            })
            .collect();
        History { events, faults }
    }

    #[test]
    fn paused_holder_is_excused_and_its_stale_write_must_be_rejected() {
        // The paused holder writes after it resumed: accepted = violation.
        let r = check(
            &paused_then_writes(2600, Kind::WriteOk { fence: 1 }),
            &cfg(),
        );
        assert!(r.double_holders.is_empty(), "{:?}", r.double_holders);
        assert_eq!(r.excused.len(), 1);
        assert_eq!(r.stale_attempted, 1);
        assert_eq!(r.stale_accepted.len(), 1);
        assert_eq!(r.paused_writes, 1);
    }

    #[test]
    fn a_write_sent_before_the_resume_was_stamped_is_a_paused_write() {
        // SIGCONT wakes the holder, which writes at once; the test's
        // thread stamps the resume 1 ms later.
        let rejected = Kind::WriteRejected {
            fence: 1,
            highest: 2,
        };
        let r = check(&paused_then_writes(2499, rejected), &cfg());
        assert!(r.violations().is_empty(), "{:?}", r.violations());
        assert_eq!(r.paused_writes, 1);
        assert_eq!(r.paused_writes_rejected, 1);
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

    /// An attributed body (its end `body_end`, its release unseen) that
    /// another holder overlapped: a double holder, unless the check lets a
    /// body that returned within the allowance bound the overlap, and then
    /// only if it returned within it.
    #[test]
    fn an_attributed_body_s_end_bounds_an_overlap_only_where_allowed() {
        let body = |to: u64| {
            let mut events = vec![
                ev(9, 1, 1, ASK),
                ev(10, 1, 1, Kind::Acquired { fence: 1 }),
                ev(to, 1, 1, Kind::BodyEnd),
            ];
            events.extend(held(2, 1, 500, 510, 2, Kind::Released));
            History {
                events,
                faults: vec![],
            }
        };
        let allowing = CheckConfig {
            body_end_bounds: true,
            ..cfg()
        };
        assert_eq!(check(&body(550), &cfg()).double_holders.len(), 1);
        assert_eq!(check(&body(550), &allowing).double_holders.len(), 0);
        assert_eq!(
            check(&body(900), &allowing).double_holders.len(),
            1,
            "400 ms after the overlap began is past the allowance"
        );
    }

    /// A holder that asked at `ask`, came back at `from` with `fence`, and
    /// released at `to` (confirmed).
    fn asked(p: u32, ask: u64, from: u64, to: u64, fence: u64) -> Vec<Event> {
        vec![
            ev(ask, p, 1, ASK),
            ev(from, p, 1, Kind::Acquired { fence }),
            ev(to, p, 1, Kind::Releasing),
            ev(to + 1, p, 1, Kind::Released),
        ]
    }

    fn asked_read(p: u32, ask: u64, from: u64, to: u64, fence: u64) -> Vec<Event> {
        let mut v = asked(p, ask, from, to, fence);
        v[1].kind = Kind::AcquiredRead { fence };
        v
    }

    /// The shape the outside nemesis saw: B asks, C asks later and gets
    /// the lock, works and releases; then B's late reply says it holds
    /// the lock with an older token. No overlap, and B asked before C came
    /// back (so real-time order alone misses it), yet B's grant had to be
    /// gone before C's: B's body ran without its lock.
    #[test]
    fn a_token_below_an_earlier_holders_is_a_body_without_its_lock() {
        let mut events = asked(1, 0, 10, 90, 1_000_000);
        events.extend(asked(2, 100, 1650, 1700, 1_200_000));
        events.extend(asked(3, 200, 300, 400, 2_360_000));
        let r = check(&h(events), &cfg());
        assert!(r.double_holders.is_empty(), "{:?}", r.double_holders);
        assert_eq!(r.fence_out_of_order.len(), 1, "{r:?}");
        assert!(
            r.fence_out_of_order[0].contains("proc 2 op 1 (writer) got fence 1200000"),
            "{}",
            r.fence_out_of_order[0]
        );
        assert_eq!(r.culprits.len(), 1);
        assert_eq!(r.culprits[0].ops, vec![(2, 1), (3, 1)]);
        assert_eq!(r.violations().len(), 1);
        // Its trace names both holders, in time order.
        let tr = trace(
            &h(asked(2, 100, 1650, 1700, 1)
                .into_iter()
                .chain(asked(3, 200, 300, 400, 2))
                .collect()),
            &r.culprits[0].ops,
        );
        let first = tr.lines().next().unwrap();
        assert!(first.contains("proc 2 op 1 k: attempt 2000"), "{tr}");
        assert_eq!(tr.lines().count(), 8, "{tr}");
    }

    /// A reader that came back before a writer with its token: readers get
    /// the current token, so they were granted after that writer, whose
    /// hold had to end first.
    #[test]
    fn a_writer_sharing_the_token_of_readers_before_it_is_flagged() {
        let mut events = asked(1, 0, 10, 20, 5);
        events.extend(asked_read(2, 30, 40, 50, 7));
        events.extend(asked(3, 25, 60, 70, 7));
        let r = check(&h(events), &cfg());
        assert_eq!(r.fence_out_of_order.len(), 1, "{r:?}");
        assert!(r.fence_out_of_order[0].starts_with("key k: proc 3 op 1 (writer)"));
    }

    #[test]
    fn near_misses_of_the_token_order_are_not_flagged() {
        // Asked together, came back in token order.
        let mut events = asked(1, 0, 10, 20, 5);
        events.extend(asked(2, 0, 30, 40, 6));
        // Readers of the writer's token, in any return order, one of them
        // asking before the writer came back.
        events.extend(asked_read(3, 35, 50, 60, 6));
        events.extend(asked_read(4, 5, 45, 65, 6));
        // A reader at the current token while a writer waits; then that
        // writer, with a newer one.
        events.extend(asked_read(5, 50, 55, 66, 6));
        events.extend(asked(6, 52, 70, 80, 9));
        let r = check(&h(events.clone()), &cfg());
        assert!(r.violations().is_empty(), "{:?}", r.violations());
        assert_eq!(r.return_order_inversions, 0);

        // An older token after a pause of its holder between its call and
        // its acquisition: excused (lease semantics), and counted.
        let mut paused = events.clone();
        paused.extend(asked(7, 90, 2000, 2010, 8));
        paused.extend(asked(8, 95, 100, 110, 10));
        let faults = vec![
            Fault {
                t: 95 * MS,
                proc_id: Some(7),
                kind: FaultKind::Stop,
            },
            Fault {
                t: 1900 * MS,
                proc_id: Some(7),
                kind: FaultKind::Cont,
            },
        ];
        let r = check(
            &History {
                events: paused.clone(),
                faults,
            },
            &cfg(),
        );
        assert!(
            r.fence_out_of_order.is_empty(),
            "{:?}",
            r.fence_out_of_order
        );
        assert_eq!(r.return_order_inversions, 1);
        // Unpaused, the same is a violation.
        assert_eq!(check(&h(paused), &cfg()).fence_out_of_order.len(), 1);

        // A lower token after Redis restarted empty: another epoch.
        let mut wiped = events;
        wiped.extend(asked(9, 200, 210, 220, 1));
        let faults = vec![
            Fault {
                t: 150 * MS,
                proc_id: None,
                kind: FaultKind::RedisDown { wipe: true },
            },
            Fault {
                t: 160 * MS,
                proc_id: None,
                kind: FaultKind::RedisUp { wipe: true },
            },
        ];
        let r = check(
            &History {
                events: wiped,
                faults,
            },
            &cfg(),
        );
        assert!(r.violations().is_empty(), "{:?}", r.violations());
    }

    /// A call that asked at `from` with `wait_ms` and ended at `to` so.
    fn call(p: u32, from: u64, to: u64, wait_ms: u64, end: Option<Failure>) -> Vec<Event> {
        let waited_ms = to - from;
        vec![
            ev(from, p, 1, Kind::Attempt { wait_ms }),
            ev(
                to,
                p,
                1,
                match end {
                    Some(error) => Kind::Failed { waited_ms, error },
                    None => Kind::Timeout { waited_ms },
                },
            ),
        ]
    }

    #[test]
    fn calls_that_fail_with_time_left_are_flagged() {
        // A backend error 1.5 s into a 2 s wait, and one at the deadline.
        let early = call(1, 0, 1500, 2000, Some(Failure::Backend));
        let at_deadline = call(2, 0, 2050, 2000, Some(Failure::Backend));
        let r = check(&h(early), &cfg());
        assert_eq!(r.failed_with_budget.len(), 1, "{r:?}");
        assert!(r.failed_with_budget[0].contains("after 1500 ms of a 2000 ms wait"));
        let r = check(&h(at_deadline.clone()), &cfg());
        assert!(r.violations().is_empty(), "{:?}", r.violations());
        assert_eq!(r.backend_errors_while_busy, 0);
        // At the deadline while another call held the key: counted, not
        // judged.
        let mut busy = at_deadline;
        busy.extend(asked(5, 100, 150, 1900, 1));
        let r = check(&h(busy), &cfg());
        assert!(r.violations().is_empty(), "{:?}", r.violations());
        assert_eq!(r.backend_errors_while_busy, 1);
        // Any other error.
        let other = call(3, 0, 10, 2000, Some(Failure::Other));
        assert_eq!(check(&h(other), &cfg()).failed_with_budget.len(), 1);

        // A time-out with nobody else on the key; then one while a holder
        // held it, and one while a call whose release was never confirmed
        // may still have held it (a lease after its end).
        let alone = call(4, 1000, 3000, 2000, None);
        assert_eq!(check(&h(alone.clone()), &cfg()).failed_with_budget.len(), 1);
        let mut busy = alone.clone();
        busy.extend(asked(5, 900, 950, 3500, 1));
        assert!(check(&h(busy), &cfg()).violations().is_empty());
        let mut maybe = alone;
        maybe.extend(held(6, 1, 10, 500, 1, Kind::ReleaseFailed));
        assert!(check(&h(maybe.clone()), &cfg())
            .failed_with_budget
            .is_empty());
        // ... but not once that lease is over.
        maybe
            .iter_mut()
            .filter(|e| e.proc_id == 4)
            .for_each(|e| e.t += 600 * MS);
        assert_eq!(check(&h(maybe), &cfg()).failed_with_budget.len(), 1);
    }

    #[test]
    fn calls_past_their_deadline_by_more_than_an_op_timeout_are_flagged() {
        // 2 s wait, 500 ms op_timeout, 100 ms slop: up to 2.6 s is fine.
        let late = call(1, 0, 2700, 2000, Some(Failure::Backend));
        let r = check(&h(late.clone()), &cfg());
        assert_eq!(r.overruns.len(), 1, "{r:?}");
        assert_eq!(r.max_overrun_ns, 700 * MS);
        assert!(
            check(&h(call(1, 0, 2550, 2000, Some(Failure::Backend))), &cfg())
                .violations()
                .is_empty()
        );
        // An acquisition counts as well.
        let mut slow = vec![ev(0, 2, 1, ASK)];
        slow.extend(
            held(2, 1, 2800, 2900, 1, Kind::Released)
                .into_iter()
                .skip(1),
        );
        assert_eq!(check(&h(slow), &cfg()).overruns.len(), 1);
        // Paused meanwhile: not judged.
        let faults = vec![
            Fault {
                t: 100 * MS,
                proc_id: Some(1),
                kind: FaultKind::Stop,
            },
            Fault {
                t: 1600 * MS,
                proc_id: Some(1),
                kind: FaultKind::Cont,
            },
        ];
        let r = check(
            &History {
                events: late,
                faults,
            },
            &cfg(),
        );
        assert!(r.overruns.is_empty(), "{:?}", r.overruns);
    }

    /// A permit of `permits`: asked at `from - 1`, held `from`..`to`.
    fn permit(p: u32, from: u64, to: u64, fence: u64, permits: u64, end: Kind) -> Vec<Event> {
        vec![
            ev(
                from - 1,
                p,
                1,
                Kind::AttemptPermits {
                    wait_ms: 2000,
                    permits,
                },
            ),
            ev(from, p, 1, Kind::AcquiredPermit { fence }),
            ev(to, p, 1, Kind::Releasing),
            ev(to + 1, p, 1, end),
        ]
    }

    #[test]
    fn permit_lines_round_trip() {
        for kind in [
            Kind::AttemptPermits {
                wait_ms: 2000,
                permits: 3,
            },
            Kind::AcquiredPermit { fence: 9 },
        ] {
            let e = Event {
                t: 5,
                proc_id: 1,
                op: 2,
                key: "k".into(),
                kind,
            };
            assert_eq!(Event::parse(&e.to_line()), Some(e));
        }
    }

    #[test]
    fn permit_holders_up_to_their_limit_are_fine_and_one_more_is_flagged() {
        let mut two = permit(1, 10, 100, 1, 2, Kind::Released);
        two.extend(permit(2, 20, 110, 2, 2, Kind::Released));
        two.extend(permit(3, 105, 200, 3, 2, Kind::Released));
        let r = check(&h(two.clone()), &cfg());
        assert!(r.violations().is_empty(), "{:?}", r.violations());
        assert_eq!(r.permit_acquisitions, 3);
        assert_eq!(r.max_permit_holders, (2, 2));
        // A third while two hold.
        let mut three = two.clone();
        three.extend(permit(4, 50, 60, 4, 2, Kind::Released));
        let r = check(&h(three), &cfg());
        assert_eq!(r.over_permits.len(), 1, "{r:?}");
        assert!(
            r.over_permits[0].contains("3 permit holders granted before it, 2 allowed"),
            "{}",
            r.over_permits[0]
        );
        assert_eq!(r.culprits[0].ops.len(), 3);
        // A request with a larger limit is admitted beside two of N = 2;
        // one of N = 1 is not.
        let mut wider = two.clone();
        wider.extend(permit(5, 50, 60, 5, 3, Kind::Released));
        assert!(check(&h(wider.clone()), &cfg()).violations().is_empty());
        // ... and one of N = 2 granted before it may come back after it.
        let mut late = wider.clone();
        late.retain(|e| e.proc_id != 2);
        late.extend(permit(2, 55, 110, 2, 2, Kind::Released));
        assert!(check(&h(late), &cfg()).violations().is_empty());
        // But never four, nor a third of N = 2 beside the one of N = 3.
        let mut four = wider;
        four.extend(permit(7, 52, 58, 7, 3, Kind::Released));
        assert_eq!(check(&h(four), &cfg()).over_permits.len(), 1);
        let mut narrower = two;
        narrower.extend(permit(6, 150, 160, 6, 1, Kind::Released));
        assert_eq!(check(&h(narrower), &cfg()).over_permits.len(), 1);
    }

    #[test]
    fn a_paused_permit_holder_counts_until_its_last_renewal_may_have_lapsed() {
        // Proc 1 holds from 10 ms and is stopped at 20 ms for 2.5 s; with
        // N = 1, proc 2 takes a permit at `at`.
        let paused = |at: u64| {
            let mut events = permit(1, 10, 3000, 1, 1, Kind::ReleaseLost);
            events.extend(permit(2, at, at + 50, 2, 1, Kind::Released));
            let faults = [(20, FaultKind::Stop), (2500, FaultKind::Cont)]
                .into_iter()
                .map(|(t, kind)| Fault {
                    t: t * MS,
                    proc_id: Some(1),
                    kind,
                })
                .collect();
            History { events, faults }
        };
        // Within two thirds of its lease (1 s), less slop, after the pause:
        // its permit was still valid, and counts.
        let r = check(&paused(500), &cfg());
        assert_eq!(r.over_permits.len(), 1, "{r:?}");
        // Later, its last renewal may have lapsed.
        let r = check(&paused(700), &cfg());
        assert!(r.violations().is_empty(), "{:?}", r.violations());
        assert_eq!(r.max_permit_holders, (1, 2));
    }

    #[test]
    fn permit_tokens_must_differ_but_their_order_is_free() {
        let mut events = permit(1, 10, 100, 7, 2, Kind::Released);
        events.extend(permit(2, 20, 110, 5, 2, Kind::Released));
        assert!(check(&h(events.clone()), &cfg()).violations().is_empty());
        events.extend(permit(3, 200, 210, 7, 2, Kind::Released));
        assert_eq!(check(&h(events), &cfg()).fence_duplicates.len(), 1);
    }

    #[test]
    fn a_semaphore_timeout_needs_as_many_others_as_its_permits() {
        let wait = |p: u32, from: u64, to: u64| {
            vec![
                ev(
                    from,
                    p,
                    1,
                    Kind::AttemptPermits {
                        wait_ms: 2000,
                        permits: 2,
                    },
                ),
                ev(
                    to,
                    p,
                    1,
                    Kind::Timeout {
                        waited_ms: to - from,
                    },
                ),
            ]
        };
        let mut one = wait(9, 1000, 3000);
        one.extend(permit(1, 900, 3500, 1, 2, Kind::Released));
        assert_eq!(check(&h(one.clone()), &cfg()).failed_with_budget.len(), 1);
        let mut two = one;
        two.extend(permit(2, 950, 3600, 2, 2, Kind::Released));
        assert!(check(&h(two), &cfg()).violations().is_empty());
    }
}
