//! What a lock client decides, as plain functions of (state, event) →
//! what to do next: the sans-IO core of the runtime as the model runs it.
//! Each function says which runtime code it mirrors; once the runtime has
//! these decisions as functions of its own, the model calls those instead.
//!
//! Times are ms on one clock shared by the clients and the server (the
//! server's clock is this one plus [`crate::world::EPOCH_MS`]).

use crate::defects::Defects;

/// The runtime's timing constants, in model ms.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Timing {
    /// `Config::retry_delay`.
    pub retry_delay: u64,
    /// `Config::retry_jitter` (the model takes no jitter: 0 for the
    /// random part, this much in the queue stay).
    pub retry_jitter: u64,
    /// `Config::op_timeout`.
    pub op_timeout: u64,
    /// `wakeups::ORPHAN_AFTER`.
    pub orphan_after: u64,
    /// `backend::LINGER`.
    pub linger: u64,
}

impl Default for Timing {
    fn default() -> Self {
        Timing {
            retry_delay: 1000,
            retry_jitter: 50,
            op_timeout: 2000,
            orphan_after: 1000,
            linger: 2000,
        }
    }
}

/// The part of a lock request the acquire loop keeps between awaits
/// (`request.rs`, `acquire_in_span`: the locals of its `loop`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Acquiring {
    pub lease: u64,
    pub started: u64,
    pub deadline: u64,
    pub failures: u8,
    /// `queued_once`: an attempt of this owner may have joined the queue.
    pub queued_once: bool,
    /// `queued_at`: when the last queuing attempt was sent (local ms) and
    /// the server's clock then (server ms).
    pub queued_at: Option<(u64, u64)>,
    /// `Unsure::pending`: an attempt of this owner may have taken the lock
    /// unseen; a request that ends now releases it.
    pub pending: bool,
    /// When the attempt in flight was sent, and whether it may queue.
    pub sent_at: u64,
    pub may_queue: bool,
    /// The holder's remaining TTL from the last busy answer.
    pub ttl: Option<u64>,
}

/// An acquire attempt to send (`request.rs`: the `Queue` built at the top
/// of the loop).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Attempt {
    /// Stay queued this long if busy; `None`: just try once.
    pub stay: Option<u64>,
    pub rejoin: bool,
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
    /// A connection cut or no answer within `op_timeout`.
    Transient,
    /// A script error.
    Refused,
}

/// How a request ends without a guard.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Failed {
    /// `LockError::Timeout`: busy until the wait ran out.
    Timeout,
    /// A backend error (transient faults until the wait ran out, or a
    /// refusal).
    Backend,
    /// The caller dropped the future.
    Cancelled,
}

/// What the request does next.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Next {
    /// Send this attempt (the request has marked itself `pending`).
    Attempt(Attempt),
    /// Return a guard: the lock is held with `fence`, its lease counted
    /// from `from`.
    Hold { fence: u64, from: u64 },
    /// The grant came too late: release the old owner in the background
    /// (`client.release_in_background`), go on under a new owner, and
    /// pause until `until` (or give up, see [`Next::GiveUp`]).
    Late { pause: Option<u64> },
    /// Sleep until `until`, then attempt again (`pause_or_give_up`).
    Pause { until: u64 },
    /// End the request; the world releases the owner if `pending`
    /// (`Unsure::drop`).
    GiveUp(Failed),
    /// Register as a waiter (subscribe if needed), then nap.
    Listen,
}

/// The top of the acquire loop: build and send an attempt
/// (`request.rs`, `loop { let left = ...; let queue = Queue {...};
/// unsure.pending = true; ... }`).
pub fn attempt(a: &mut Acquiring, now: u64, t: &Timing) -> Attempt {
    let left = a.deadline.saturating_sub(now);
    let stay = (left > 0).then(|| left.min(t.retry_delay) + t.retry_jitter + 2 * t.op_timeout);
    a.pending = true;
    a.may_queue = stay.is_some();
    a.sent_at = now;
    Attempt {
        stay,
        rejoin: a.queued_once,
    }
}

/// The answer of an attempt (`request.rs`, `match out { ... }` after
/// `attempt(..).await`, with `attempt()` and `granted()`).
pub fn on_answer(a: &mut Acquiring, now: u64, answer: Answer, t: &Timing) -> Next {
    match answer {
        Answer::Granted { fence } => {
            // `granted()`: the lease counts from the send.
            if now.saturating_sub(a.sent_at) >= a.lease {
                a.pending = false;
                a.failures += 1;
                reset_owner(a);
                return Next::Late {
                    pause: pause_or_give_up(a, now, t),
                };
            }
            a.pending = false;
            Next::Hold {
                fence,
                from: a.sent_at,
            }
        }
        Answer::Busy { ttl, queued } => {
            a.failures = 0;
            if let Some(q) = queued {
                a.queued_once = true;
                a.queued_at = Some((a.sent_at, q));
            }
            a.pending = a.queued_once;
            a.ttl = ttl;
            if now >= a.deadline {
                return Next::GiveUp(Failed::Timeout);
            }
            Next::Listen
        }
        Answer::Transient => {
            a.queued_once |= a.may_queue;
            a.failures += 1;
            match pause_or_give_up(a, now, t) {
                Some(until) => Next::Pause { until },
                None => Next::GiveUp(Failed::Backend),
            }
        }
        Answer::Refused => {
            a.pending = a.queued_once;
            Next::GiveUp(Failed::Backend)
        }
    }
}

/// A new owner id after a late grant (`(owner, waiter, queued_once,
/// queued_at) = (new_owner(), None, false, None)`).
fn reset_owner(a: &mut Acquiring) {
    a.queued_once = false;
    a.queued_at = None;
}

/// `request.rs::pause_or_give_up`: 20 ms doubling up to `retry_delay`
/// (without its random half); `None` if the pause would pass the deadline.
pub fn pause_or_give_up(a: &Acquiring, now: u64, t: &Timing) -> Option<u64> {
    let cap = t.retry_delay.max(1);
    let base = (20u64 << (a.failures.clamp(1, 7) - 1)).min(cap);
    (now + base < a.deadline).then_some(now + base)
}

/// After a fresh subscription (`if fresh && !client.still_waits(..)`):
/// whether to ask the server if the owner still waits (`Some(true)`:
/// ask), or attempt again at once (`Some(false)`); `None`: just nap.
pub fn after_subscribe(a: &Acquiring, fresh: bool) -> Option<bool> {
    fresh.then_some(a.queued_at.is_some())
}

/// The nap before the next attempt (`let nap = (ttl.unwrap_or(lease)
/// .min(retry_delay) + jitter).min(deadline - now)`).
pub fn nap_until(a: &Acquiring, now: u64, t: &Timing) -> u64 {
    let nap = a.ttl.unwrap_or(a.lease).min(t.retry_delay);
    (now + nap).min(a.deadline)
}

/// A grant handed over by a release reached this waiter (`request.rs`,
/// after `Woken::Granted(g)`: `is_stale`, `grants_need_confirming`,
/// `lease_start`, `granted`). `at`: the server ms of the hand-off.
pub fn on_grant(
    a: &mut Acquiring,
    now: u64,
    fence: u64,
    at_server: u64,
    needs_confirming: bool,
    t: &Timing,
) -> Option<Next> {
    if is_stale(a.queued_at, at_server) || needs_confirming {
        // Attempt again: `continue`.
        return None;
    }
    let from = lease_start(a.started, a.queued_at, at_server, now);
    if now.saturating_sub(from) >= a.lease {
        a.pending = false;
        a.failures += 1;
        reset_owner(a);
        return Some(Next::Late {
            pause: pause_or_give_up(a, now, t),
        });
    }
    a.pending = false;
    Some(Next::Hold { fence, from })
}

/// `request.rs::is_stale`.
pub fn is_stale(queued_at: Option<(u64, u64)>, at_server: u64) -> bool {
    matches!(queued_at, Some((_, q)) if at_server < q)
}

/// `request.rs::lease_start` (server and local clocks are one here, so
/// `heard` is now).
pub fn lease_start(started: u64, queued_at: Option<(u64, u64)>, at_server: u64, heard: u64) -> u64 {
    match queued_at {
        Some((sent, q)) => {
            let server = at_server.saturating_sub(q);
            if server > heard.saturating_sub(sent) {
                sent
            } else {
                sent + server
            }
        }
        None => started,
    }
}

/// Where a grant message goes (`wakeups.rs::Wakeups::granted`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GrantRoute {
    /// Into the mailbox of the waiter registered under its owner.
    Mailbox,
    /// Its owner took the lock by asking again (`settled`): dropped.
    Settled,
    /// Kept for a waiter about to register; released after
    /// `ORPHAN_AFTER` if nobody claims it (`client::unclaimed_grant`).
    Unclaimed,
}

pub fn route_grant(has_mailbox: bool, settled: bool) -> GrantRoute {
    if has_mailbox {
        GrantRoute::Mailbox
    } else if settled {
        GrantRoute::Settled
    } else {
        GrantRoute::Unclaimed
    }
}

/// The orphan timer fired (`client.rs::unclaimed_grant`, the spawned
/// task: `if wakeups.take_unclaimed(&owner) && !watchdog.holds(..)`):
/// whether to release the owner's lock. `request_alive`: the owner's
/// request has an attempt in flight or is a registered waiter (what the
/// fix of the orphan race looks at; today's code does not).
pub fn release_orphan(
    still_unclaimed: bool,
    watchdog_holds: bool,
    request_alive: bool,
    d: &Defects,
) -> bool {
    still_unclaimed && !watchdog_holds && (d.orphan_ignores_inflight || !request_alive)
}

/// A guard's release (`guard.rs::release_one` / `Hold::end_in_background`
/// with `keep_for`): leave the lock to expire `left` ms from now
/// (`min_hold` not over: `keep`, a compare-and-expire through the renewal
/// script), or release it.
pub fn release_kind(acquired_at: u64, min_hold: Option<u64>, now: u64) -> Option<u64> {
    let until = acquired_at + min_hold?;
    let left = until.saturating_sub(now);
    (left >= 1).then_some(left)
}

/// One held lock in the watchdog (`watchdog.rs::Entry`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Renewing {
    pub lease: u64,
    pub next_due: u64,
    pub deadline: u64,
    /// `max_hold`: no renewal reaches past this, and the hold is lost here.
    pub until: Option<u64>,
}

/// `watchdog.rs::interval`.
pub fn interval(lease: u64) -> u64 {
    (lease / 3).max(1)
}

/// `Watchdog::insert`.
pub fn start_renewing(lease: u64, granted_at: u64, until: Option<u64>) -> Renewing {
    Renewing {
        lease,
        next_due: granted_at + interval(lease),
        deadline: granted_at + lease,
        until,
    }
}

/// When the watchdog looks at an entry next (`Entry::due`).
pub fn due(r: &Renewing) -> u64 {
    let d = r.next_due.min(r.deadline);
    r.until.map_or(d, |u| d.min(u))
}

/// The watchdog's tick for one entry (`watchdog.rs::tick`, building the
/// batch): `Err(())` the hold is lost (`max_hold` reached), `Ok(Some(lease))`
/// renew with this lease, `Ok(None)` not yet.
#[allow(clippy::result_unit_err)]
pub fn tick(r: &Renewing, now: u64) -> Result<Option<u64>, ()> {
    let left = r.until.map(|u| u.saturating_sub(now));
    if left.is_some_and(|l| l < 1) {
        return Err(());
    }
    if r.next_due <= now + interval(r.lease) || r.deadline <= now {
        return Ok(Some(left.map_or(r.lease, |l| r.lease.min(l))));
    }
    Ok(None)
}

/// What a renewal's answer means (`watchdog.rs::tick`, matching the
/// outcomes): `Some(true)` renewed, `Some(false)` lost now, `None` failed.
/// Returns whether the hold is lost.
pub fn on_renewed(
    r: &mut Renewing,
    sent_at: u64,
    lease_sent: u64,
    renewed: Option<bool>,
    now: u64,
) -> bool {
    match renewed {
        Some(true) => {
            r.deadline = sent_at + lease_sent;
            r.next_due = sent_at + interval(lease_sent);
            false
        }
        Some(false) => true,
        None => {
            if now >= r.deadline {
                return true;
            }
            let iv = interval(r.lease.min(lease_sent));
            let left = r.deadline - now;
            r.next_due = now + (left / 4).clamp(10, iv);
            false
        }
    }
}
