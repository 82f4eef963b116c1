//! The client's decisions, as the runtime makes them: every choice here is
//! a call into the runtime's own sans-IO protocol core
//! (`lock_runtime::__protocol`, `lock-runtime/src/protocol/`), with the
//! model's clock. What stays in this file is the wiring the runtime's
//! loops do between those calls (which decision follows which answer), so
//! that `world.rs` deals in connections and timers only. Each function
//! names the runtime code whose wiring it repeats.
//!
//! Times are model ms on one clock shared by the clients and the server
//! (the server's clock is this one plus [`crate::state::EPOCH_MS`]).

use std::time::Duration;

use lock_runtime::__protocol::{self as protocol, Moment};
pub use lock_runtime::__protocol::{
    AfterBusy, Listening, OnGrant, Queued, Route, Stamp, Tick, Verdict,
};

/// A moment on the model's clock, in ms.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Ms(pub u64);

impl Moment for Ms {
    fn checked_after(self, d: Duration) -> Option<Self> {
        Some(Ms(self
            .0
            .checked_add(u64::try_from(d.as_millis()).ok()?)?))
    }

    fn since(self, earlier: Self) -> Duration {
        Duration::from_millis(self.0.saturating_sub(earlier.0))
    }
}

/// Model ms of a duration.
pub fn ms(d: Duration) -> u64 {
    d.as_millis() as u64
}

fn dur(ms: u64) -> Duration {
    Duration::from_millis(ms)
}

/// One request's acquire loop (`protocol::Acquiring` on the model's clock).
pub type Acquiring = protocol::Acquiring<Ms>;
/// One held lock in the watchdog (`protocol::Renewing`).
pub type Renewing = protocol::Renewing<Ms>;

/// The runtime's timing: the client's `Config` and the constants of the
/// runtime the protocol leaves to the loops, in model ms.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Timing {
    /// `Config::retry_delay`.
    pub retry_delay: u64,
    /// `Config::retry_jitter`: in the queue stay in full; every random
    /// part (of a nap, of a pause) is 0 in the model.
    pub retry_jitter: u64,
    /// `Config::op_timeout`.
    pub op_timeout: u64,
    /// `protocol::ORPHAN_AFTER`.
    pub orphan_after: u64,
    /// `backend::LINGER`.
    pub linger: u64,
    /// `node.rs::MIN_SEND`: the least time a send is given.
    pub min_send: u64,
    /// `Config::fence_ttl`: how long a token counter outlives its last use.
    pub fence_ttl: u64,
}

impl Default for Timing {
    fn default() -> Self {
        Timing {
            retry_delay: 1000,
            retry_jitter: 50,
            op_timeout: 2000,
            orphan_after: ms(protocol::ORPHAN_AFTER),
            linger: 2000,
            min_send: 20,
            fence_ttl: 24 * 3600 * 1000,
        }
    }
}

impl Timing {
    /// The protocol's view of it.
    pub fn protocol(&self) -> protocol::Timing {
        protocol::Timing {
            retry_delay: dur(self.retry_delay),
            retry_jitter: dur(self.retry_jitter),
            op_timeout: dur(self.op_timeout),
        }
    }
}

/// An acquire attempt to send (`protocol::Outgoing`, what `request.rs`
/// builds its `Queue` from).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Attempt {
    /// Stay queued this long if busy; `None`: just try once.
    pub stay: Option<u64>,
    pub rejoin: bool,
    /// No answer from the server yet: the send ends by then.
    pub by: Option<u64>,
}

/// What an attempt came back with, as `RedisNode::acquire` reads
/// `acquire.lua`'s reply (or the transport's failure).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Answer {
    /// `{1, token}` or `{2, token}`.
    Granted { fence: u64 },
    /// `{0, pttl, queued at}`.
    Busy {
        ttl: Option<u64>,
        queued: Option<u64>,
    },
    /// A connection cut or no answer within `op_timeout`; `ran`: the
    /// command may have run (`Fault::may_have_run`).
    Transient { ran: bool },
    /// Taken, then given back under this owner id for want of replica
    /// acknowledgements (`Fault::GivenBack`); `released`: that release was
    /// answered.
    GivenBack { released: bool },
    /// A script error.
    Refused,
}

/// How a request ends without a guard.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Failed {
    /// `LockError::Timeout`: the lock was seen busy and the wait ran out.
    Timeout,
    /// A backend error (the lock never seen busy, or a refusal).
    Backend,
    /// The caller dropped the future.
    Cancelled,
}

/// What the request does next.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Next {
    /// Return a guard: the lock is held with `fence`, its lease counted
    /// from `from`; `settle`: a grant message of the same hand-off may
    /// still come (`Claim::settle`).
    Hold { fence: u64, from: u64, settle: bool },
    /// The grant came too late, or was given back: the old owner id is
    /// spent (undone in the background if `undo`); go on under a new
    /// owner (with a new claim), and pause until `pause`, or give up as
    /// `Failed` if there is no time for that.
    Late {
        pause: Result<u64, Failed>,
        undo: bool,
    },
    /// Sleep until `until`, then attempt again.
    Pause { until: u64 },
    /// End the request; the world undoes the owner if `pending`
    /// (`Unsure::drop`).
    GiveUp(Failed),
    /// Register as a waiter (subscribe if needed), then nap.
    Listen,
}

/// A new request (`request.rs`, `acquire_in_span`: `Acquiring::new`).
pub fn start(now: u64, wait: u64, t: &Timing) -> Acquiring {
    protocol::Acquiring::new(Ms(now), Ms(now + wait), dur(t.op_timeout))
}

/// The top of the acquire loop (`unsure.acq.attempt(now)`).
pub fn attempt(a: &mut Acquiring, now: u64, t: &Timing) -> Attempt {
    let out = a.attempt(Ms(now), &t.protocol());
    Attempt {
        stay: out.stay.map(ms),
        rejoin: out.rejoin,
        by: out.by.map(|m| m.0),
    }
}

/// Pause or give up after a failure (`request.rs::pause_or_give_up`, with
/// `gave_up` choosing the error).
fn pause_or_give_up(a: &Acquiring, now: u64, t: &Timing) -> Result<u64, Failed> {
    match a.pause(Ms(now), 0.0, &t.protocol()) {
        Some(p) => Ok(now + ms(p)),
        None if a.ends_as_timeout() => Err(Failed::Timeout),
        None => Err(Failed::Backend),
    }
}

/// The answer of an attempt (`request.rs`, `match out { ... }` after
/// `attempt(..).await`, with `granted()`'s lateness check).
pub fn on_answer(a: &mut Acquiring, now: u64, answer: Answer, lease: u64, t: &Timing) -> Next {
    match answer {
        Answer::Granted { fence } => {
            // The lease counts from the send.
            let from = a.sent_at;
            if protocol::Acquiring::too_late(from, Ms(now), dur(lease), Duration::ZERO) {
                a.late(true);
                return Next::Late {
                    pause: pause_or_give_up(a, now, t),
                    undo: true,
                };
            }
            let settle = a.held(true);
            Next::Hold {
                fence,
                from: from.0,
                settle,
            }
        }
        Answer::Busy { ttl: _, queued } => match a.busy(queued.map(Queued::At), Ms(now)) {
            AfterBusy::GiveUp => Next::GiveUp(Failed::Timeout),
            AfterBusy::Listen => Next::Listen,
        },
        Answer::Transient { ran } => {
            a.failed(ran);
            match pause_or_give_up(a, now, t) {
                Ok(until) => Next::Pause { until },
                Err(f) => Next::GiveUp(f),
            }
        }
        Answer::GivenBack { released } => {
            // The owner id is spent (a failover replays its release).
            a.late(true);
            Next::Late {
                pause: pause_or_give_up(a, now, t),
                undo: !released,
            }
        }
        Answer::Refused => {
            a.refused();
            Next::GiveUp(Failed::Backend)
        }
    }
}

/// A grant handed over by a release reached the request (`request.rs`,
/// after `Woken::Granted(g)`: `on_grant`, then `granted()`). `at_server`:
/// the server ms of the hand-off, heard `now`. `None`: attempt again.
pub fn on_grant(
    a: &mut Acquiring,
    now: u64,
    (fence, at_server): (u64, u64),
    confirming: bool,
    lease: u64,
    t: &Timing,
) -> Option<Next> {
    let from = match a.on_grant(Stamp::ServerMs(at_server, Ms(now)), confirming) {
        OnGrant::Stale | OnGrant::Confirm => return None,
        OnGrant::Take { from } => from,
    };
    if protocol::Acquiring::too_late(from, Ms(now), dur(lease), Duration::ZERO) {
        a.late(false);
        return Some(Next::Late {
            pause: pause_or_give_up(a, now, t),
            undo: true,
        });
    }
    a.held(false);
    Some(Next::Hold {
        fence,
        from: from.0,
        settle: false,
    })
}

/// After subscribing (`request.rs`, the `listen` future).
pub fn listening(a: &Acquiring, fresh: bool) -> Listening {
    a.listening(fresh)
}

/// When the nap before the next attempt ends (`unsure.acq.nap(ttl, ..)`).
pub fn nap_until(a: &Acquiring, ttl: Option<u64>, lease: u64, now: u64, t: &Timing) -> u64 {
    now + ms(a.nap(ttl.map(dur), dur(lease), Ms(now), 0.0, &t.protocol()))
}

/// Where a grant message goes (`claims.rs::granted`).
pub fn route_grant(live: bool, settled: bool) -> Route {
    protocol::route(live, settled)
}

/// An orphan's timer fired (`client.rs::release_orphan`).
pub fn release_orphan(watchdog_holds: bool) -> bool {
    protocol::orphan_released(watchdog_holds)
}

/// A guard's release at `now` (`guard.rs::Hold::keep_for`): leave the
/// lock to expire this many ms from now (`min_hold` not over: keep), or
/// `None`: release it.
pub fn keep_for(acquired_at: u64, min_hold: Option<u64>, now: u64) -> Option<u64> {
    let until = protocol::keep_until(Ms(acquired_at), min_hold.map(dur));
    protocol::keep_for(until, Ms(now)).map(ms)
}

/// `Watchdog::insert` (no drift: one server).
pub fn start_renewing(lease: u64, granted_at: u64, until: Option<u64>) -> Renewing {
    protocol::Renewing::start(Ms(granted_at), dur(lease), Duration::ZERO, until.map(Ms))
}

/// The watchdog's tick for one lock (`watchdog.rs::tick`).
pub fn tick(r: &Renewing, now: u64, lease: u64) -> Tick {
    r.tick(Ms(now), dur(lease))
}

/// A renewal's answer (`watchdog.rs::tick`, matching the outcomes back):
/// whether the hold is lost.
pub fn on_renewed(
    r: &mut Renewing,
    verdict: Verdict,
    (sent_at, sent): (u64, u64),
    lease: u64,
    now: u64,
) -> bool {
    r.answered(
        verdict,
        (Ms(sent_at), dur(sent)),
        dur(lease),
        Duration::ZERO,
        Ms(now),
    )
}
