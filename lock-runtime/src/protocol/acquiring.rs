//! One lock request between its start and its guard: what each attempt
//! asks for, what each answer means, when to pause, listen or give up, and
//! what is left to take back if the request ends now.
//!
//! `request.rs` runs this loop with the network, the wake-ups and the
//! timers; each method here is one of its steps, with `now` passed in.

use std::time::Duration;

use super::handoff::{is_stale, lease_start, Queued, Stamp};
use super::Moment;

/// The client's retry timing (its `Config`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Timing {
    /// A waiter asks again at least this often.
    pub retry_delay: Duration,
    /// At most this much random delay on top of a nap.
    pub retry_jitter: Duration,
    /// How long one command may take.
    pub op_timeout: Duration,
}

/// The state of one request's acquire loop: the locals it keeps between
/// awaits, and the deadlines its wait sets.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Acquiring<I> {
    /// When the request started.
    pub started: I,
    /// When its wait runs out: nothing but one last attempt starts after.
    pub deadline: I,
    /// A server that refuses every connection ends the call here: within
    /// two operation timeouts (one for a call that tries once), however
    /// long its wait.
    unreachable_end: I,
    /// No attempt sent before the server ever answered runs past this.
    attempt_end: I,
    /// Failed attempts in a row (the pause doubles with each).
    pub failures: u32,
    /// Failed subscriptions in a row (the nap after one doubles with each).
    pub unheard: u32,
    /// An attempt of this owner may have joined the lock's queue.
    pub queued_once: bool,
    /// The last attempt that joined the queue: when it was sent, and the
    /// backend's clock then. A grant's lease is counted from there.
    pub queued_at: Option<(I, Queued)>,
    /// The lock was seen held by another: a wait that runs out is a
    /// `Timeout`, whatever failed last.
    pub seen_busy: bool,
    /// An attempt reached the server (it may have run there).
    pub reached: bool,
    /// An attempt of this owner may have taken the lock, or left it queued,
    /// unseen: a request that ends now must take it back (undo).
    pub pending: bool,
    /// The attempt in flight may queue.
    may_queue: bool,
    /// When the attempt in flight was sent.
    pub sent_at: I,
}

/// What the next attempt asks the backend for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Outgoing<I> {
    /// If busy, stay queued this long (renewed by every later attempt, so
    /// a waiter that died loses its place soon after); `None`: try once.
    pub stay: Option<Duration>,
    /// An earlier attempt of this owner may have queued it: a grant taken
    /// directly must leave the queue too.
    pub rejoin: bool,
    /// The server has not answered this request yet: the attempt ends by
    /// then, whatever it costs (see [`Acquiring`]'s deadlines).
    pub by: Option<I>,
}

/// What a busy answer leads to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AfterBusy {
    /// The wait is over: `Timeout`.
    GiveUp,
    /// Listen for a release (or a grant), then try again.
    Listen,
}

/// What a freshly made subscription leads to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Listening {
    /// Listening already, or no news missed: wait for a grant or the nap.
    Wait,
    /// A release between the queuing attempt and the subscription could not
    /// reach this client: ask the server whether the owner is still queued
    /// (or already handed the lock); if not, attempt again.
    AskQueued,
    /// It did not queue: attempt again at once.
    AttemptAgain,
}

/// What a hand-off grant that reached this request leads to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OnGrant<I> {
    /// Handed over before this owner queued again: attempt again.
    Stale,
    /// The backend wants a handed-over grant confirmed by an attempt of the
    /// new owner (Sentinel with `replica_acks`): attempt again, which is
    /// answered `Repeated`.
    Confirm,
    /// The lock is this request's, its lease counted from `from` (unless
    /// [`too_late`](Acquiring::too_late)).
    Take {
        /// Where the lease starts on this process's clock.
        from: I,
    },
}

impl<I: Moment> Acquiring<I> {
    /// A request started at `started` that may wait until `deadline`.
    pub fn new(started: I, deadline: I, op_timeout: Duration) -> Self {
        Acquiring {
            started,
            deadline,
            unreachable_end: deadline
                .min(started.after(2 * op_timeout))
                .max(started.after(op_timeout)),
            attempt_end: deadline.max(started.after(op_timeout)),
            failures: 0,
            unheard: 0,
            queued_once: false,
            queued_at: None,
            seen_busy: false,
            reached: false,
            pending: false,
            may_queue: false,
            sent_at: started,
        }
    }

    /// The top of the loop: what the next attempt asks for. From here the
    /// attempt is sent from the caller's task, so it is `pending` until an
    /// answer settles it.
    pub fn attempt(&mut self, now: I, t: &Timing) -> Outgoing<I> {
        let left = self.deadline.since(now);
        let out = Outgoing {
            // The longest nap (below) and a round trip or two.
            stay: (!left.is_zero())
                .then(|| left.min(t.retry_delay * 3 / 2) + t.retry_jitter + 2 * t.op_timeout),
            rejoin: self.queued_once,
            by: (!self.seen_busy).then_some(if self.reached {
                self.attempt_end
            } else {
                self.unreachable_end
            }),
        };
        self.pending = true;
        // A later attempt must know an earlier one may have queued this
        // owner, even if its answer never came.
        self.may_queue = out.stay.is_some();
        self.sent_at = now;
        out
    }

    /// The lock is held (granted by an attempt, or handed over). Returns
    /// whether the request's claim must settle: an attempt that took the
    /// lock after this owner queued may yet be followed by the grant
    /// message of the same hand-off, which then names a lock already held.
    pub fn held(&mut self, by_attempt: bool) -> bool {
        self.pending = false;
        by_attempt && self.queued_once
    }

    /// A busy answer, `now`; `queued`: the attempt joined the queue.
    pub fn busy(&mut self, queued: Option<Queued>, now: I) -> AfterBusy {
        self.seen_busy = true;
        self.failures = 0;
        if let Some(q) = queued {
            self.queued_once = true;
            self.queued_at = Some((self.sent_at, q));
        }
        // Queued: a release may yet hand it over, and if this request ends
        // first, the undo leaves the queue.
        self.pending = self.queued_once;
        if now >= self.deadline {
            AfterBusy::GiveUp
        } else {
            AfterBusy::Listen
        }
    }

    /// A grant came too late to use (see [`too_late`](Self::too_late)), or
    /// the backend gave it back (too few replicas acknowledged it): it is
    /// taken back under this owner id, so the request goes on under a new
    /// one that this release cannot touch, and pauses first.
    /// `answered`: it was an attempt's answer (the server was reached), not
    /// a grant message.
    pub fn late(&mut self, answered: bool) {
        if answered {
            self.reached = true;
        }
        self.pending = false;
        self.queued_once = false;
        self.queued_at = None;
        self.failures += 1;
    }

    /// An attempt failed in a way that may pass (no answer, a cut
    /// connection, a cluster slot on the move); `reached`: it may have
    /// reached the server, or the deployment answered that it cannot run
    /// it yet (a slot on the move, too few replicas, a failover under
    /// way): the whole wait is then tried. The next attempt (same owner) is answered
    /// `Repeated` if it ran, and if the request ends first, the undo takes
    /// it back.
    pub fn failed(&mut self, reached: bool) {
        self.queued_once |= self.may_queue;
        // Refused now: down now, whatever an earlier attempt met.
        self.reached = reached;
        self.failures += 1;
    }

    /// The backend refused the attempt (bad data, a script error): nothing
    /// was taken by it, but an earlier attempt may have queued this owner.
    pub fn refused(&mut self) {
        self.pending = self.queued_once;
    }

    /// Whether a grant that began at `granted_at` (when its attempt was
    /// sent) is past its lease at `now`, less the backend's clock `drift`:
    /// it may already be someone else's lock.
    pub fn too_late(granted_at: I, now: I, lease: Duration, drift: Duration) -> bool {
        now.since(granted_at) + drift >= lease
    }

    /// When the request gives up after failures: at its deadline once the
    /// server answered or the lock was seen busy, sooner while the server
    /// refuses connections.
    pub fn give_up_at(&self) -> I {
        if self.reached || self.seen_busy {
            self.deadline
        } else {
            self.deadline.min(self.unreachable_end)
        }
    }

    /// The pause before the next attempt after the `failures`-th failure in
    /// a row: 20 ms doubling, at most the retry delay, plus up to half of
    /// it at random (`jitter` in [0, 1), so that clients cut off together do
    /// not come back together), cut short to end where the request gives
    /// up: the last attempt goes then, so a call uses all its wait. `None`:
    /// that point has come, so it gives up now.
    pub fn pause(&self, now: I, jitter: f64, t: &Timing) -> Option<Duration> {
        let pause = backoff(self.failures, 7, jitter, t);
        let end = self.give_up_at();
        if now >= end {
            return None;
        }
        Some(pause.min(end.since(now)))
    }

    /// Whether a request that gives up now ends as `Timeout` (the lock was
    /// seen busy; the last failure is only logged) rather than with that
    /// failure.
    pub fn ends_as_timeout(&self) -> bool {
        self.seen_busy
    }

    /// After subscribing: `fresh` says whether this subscribed afresh (a
    /// release published before could not reach this client).
    pub fn listening(&self, fresh: bool) -> Listening {
        if !fresh {
            Listening::Wait
        } else if self.queued_at.is_some() {
            Listening::AskQueued
        } else {
            Listening::AttemptAgain
        }
    }

    /// How long to wait for a grant or a release before asking again: the
    /// holder's remaining `ttl` (else the lease), at most the retry delay,
    /// plus `jitter` in [0, 1) of the retry jitter; never past the
    /// deadline. A queued request spreads its ask over up to half as long
    /// again: a release hands it over, so its own ask is the fallback (a
    /// lease that ran out, a grant lost), and every waiter of a long queue
    /// was told the same `ttl`, so that unspread they would all ask at that
    /// one moment, each ask reading the queue. (Its queue entry outlasts
    /// the longest nap: see `attempt`'s `stay`.)
    pub fn nap(
        &self,
        ttl: Option<Duration>,
        lease: Duration,
        now: I,
        jitter: f64,
        t: &Timing,
    ) -> Duration {
        let base = ttl.unwrap_or(lease).min(t.retry_delay);
        let spread = if self.queued_at.is_some() {
            t.retry_jitter.max(base / 2)
        } else {
            t.retry_jitter
        };
        (base + spread.mul_f64(jitter)).min(self.deadline.since(now))
    }

    /// The nap after a busy answer, where a release reaches its nodes one
    /// by one (Redlock) and this request was last woken at `woken_at`: the
    /// node that woke it may have had that release before the others had
    /// theirs, which publish where nobody of this client listens. For one
    /// operation timeout of this client (the releaser's own bound, where
    /// clients share their settings) it asks again every quarter of one,
    /// instead of sleeping out the holder's lease (`nap`). Best effort: a
    /// release slower than that is waited out as before.
    pub fn nap_after_wake(nap: Duration, woken_at: I, now: I, t: &Timing) -> Duration {
        if now.since(woken_at) >= t.op_timeout {
            return nap;
        }
        nap.min((t.op_timeout / 4).max(Duration::from_millis(1)))
    }

    /// Listening for releases after a busy answer succeeded, or failed once
    /// more in a row.
    pub fn listened(&mut self, ok: bool) {
        self.unheard = if ok { 0 } else { self.unheard + 1 };
    }

    /// The nap after a busy answer when listening for releases failed
    /// (`unheard` times in a row): 20 ms doubling up to the retry delay,
    /// so that the next attempt listens again soon. A release serves only
    /// waiters whose client listens; a waiter that napped the holder's
    /// lease unheard would be passed over, and take the lock only by asking
    /// after it.
    pub fn nap_unheard(&self, nap: Duration, jitter: f64, t: &Timing) -> Duration {
        nap.min(backoff(self.unheard, 32, jitter, t))
    }

    /// A hand-off grant stamped `at` reached this request; `confirming`:
    /// the backend wants it confirmed by an attempt.
    pub fn on_grant(&self, at: Stamp<I>, confirming: bool) -> OnGrant<I> {
        if is_stale(self.queued_at, at) {
            return OnGrant::Stale;
        }
        if confirming {
            return OnGrant::Confirm;
        }
        OnGrant::Take {
            from: lease_start(self.started, self.queued_at, at),
        }
    }
}

/// The pause after the `failures`-th failure in a row: 20 ms doubling (for
/// at most `steps` failures, `steps` ≤ 32), at most the retry delay, plus
/// up to half of it at random (`jitter` in [0, 1)).
fn backoff(failures: u32, steps: u32, jitter: f64, t: &Timing) -> Duration {
    let cap = t.retry_delay.max(Duration::from_millis(1));
    let doublings = failures.clamp(1, steps) - 1;
    let base = Duration::from_millis(20).saturating_mul(1 << doublings);
    let base = base.min(cap);
    base + base.mul_f64(jitter / 2.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::moment::tests::Ms;

    const T: Timing = Timing {
        retry_delay: Duration::from_millis(1000),
        retry_jitter: Duration::from_millis(50),
        op_timeout: Duration::from_millis(2000),
    };

    #[test]
    fn a_busy_answer_within_an_operation_of_a_wake_up_is_asked_again_soon() {
        let nap = Duration::from_millis(9_000);
        let soon = Acquiring::nap_after_wake(nap, Ms(1_000), Ms(1_100), &T);
        assert_eq!(soon, T.op_timeout / 4);
        // Once the releaser's commands must have ended: the nap as it was.
        let late = Acquiring::nap_after_wake(nap, Ms(1_000), Ms(3_000), &T);
        assert_eq!(late, nap);
        // Never longer than the nap.
        let short = Duration::from_millis(10);
        assert_eq!(Acquiring::nap_after_wake(short, Ms(0), Ms(0), &T), short);
    }

    #[test]
    fn a_waiter_that_could_not_listen_asks_again_soon_and_backs_off() {
        let mut a = Acquiring::new(Ms(0), Ms(10_000), T.op_timeout);
        let nap = Duration::from_millis(9_000);
        let after = |a: &mut Acquiring<Ms>, failures: u32, jitter: f64, t: &Timing| {
            a.listened(true);
            for _ in 0..failures {
                a.listened(false);
            }
            a.nap_unheard(nap, jitter, t)
        };
        assert_eq!(after(&mut a, 1, 0.0, &T), Duration::from_millis(20));
        // Doubling with each failure in a row, up to the retry delay (and
        // up to half of it again at random): a subscription that keeps
        // failing ends at the pace of attempts that keep failing.
        assert_eq!(after(&mut a, 4, 0.0, &T), Duration::from_millis(160));
        let many = after(&mut a, 30, 0.999, &T);
        assert!(
            many >= T.retry_delay && many <= T.retry_delay * 3 / 2,
            "{many:?}"
        );
        // Past failed attempts' 1.28 s as well: a subscription that keeps
        // failing comes back to the nap's pace, with a long retry delay too.
        let long = Timing {
            retry_delay: Duration::from_secs(30),
            ..T
        };
        assert_eq!(after(&mut a, 30, 0.0, &long), nap);
        assert_eq!(after(&mut a, 9, 0.0, &long), Duration::from_millis(5_120));
        // A subscription that worked starts the count again.
        a.listened(true);
        a.listened(false);
        assert_eq!(a.nap_unheard(nap, 0.0, &long), Duration::from_millis(20));
        // Never longer than the nap.
        let short = Duration::from_millis(5);
        assert_eq!(a.nap_unheard(short, 0.0, &T), short);
    }

    #[test]
    fn a_server_that_never_answers_ends_the_call_within_two_operation_timeouts() {
        let mut a = Acquiring::new(Ms(0), Ms(10_000), T.op_timeout);
        let out = a.attempt(Ms(0), &T);
        assert_eq!(out.by, Some(Ms(4_000)));
        assert!(a.pending);
        // Refused: nothing reached the server.
        a.failed(false);
        assert_eq!(a.give_up_at(), Ms(4_000));
        assert_eq!(
            a.pause(Ms(3_990), 0.0, &T),
            Some(Duration::from_millis(10)),
            "the last attempt goes when the request gives up"
        );
        assert_eq!(a.pause(Ms(4_000), 0.0, &T), None);
        assert!(!a.ends_as_timeout());
        // Once it answered, the whole wait counts.
        a.failed(true);
        assert_eq!(a.give_up_at(), Ms(10_000));
        assert_eq!(a.attempt(Ms(4_000), &T).by, Some(Ms(10_000)));
    }

    #[test]
    fn a_busy_queued_answer_keeps_the_request_pending_and_ends_as_timeout() {
        let mut a = Acquiring::new(Ms(0), Ms(3_000), T.op_timeout);
        let out = a.attempt(Ms(100), &T);
        assert_eq!(out.stay, Some(Duration::from_millis(1500 + 50 + 4000)));
        assert!(!out.rejoin);
        assert_eq!(a.busy(Some(Queued::At(7)), Ms(120)), AfterBusy::Listen);
        assert!(a.pending, "a queued owner must leave the queue if it ends");
        assert_eq!(a.queued_at, Some((Ms(100), Queued::At(7))));
        assert!(a.attempt(Ms(1_000), &T).rejoin);
        assert_eq!(
            a.attempt(Ms(3_000), &T).stay,
            None,
            "past the deadline: try once"
        );
        assert_eq!(a.busy(None, Ms(3_000)), AfterBusy::GiveUp);
        assert!(a.ends_as_timeout());
        // Taken directly after queuing: the claim settles.
        assert!(a.held(true));
        assert!(!a.pending);
    }

    #[test]
    fn queued_requests_spread_their_asks_within_their_stay() {
        let mut a = Acquiring::new(Ms(0), Ms(60_000), T.op_timeout);
        let stay = a.attempt(Ms(0), &T).stay.unwrap();
        let ttl = Some(Duration::from_secs(20));
        let lease = Duration::from_secs(30);
        // Not queued: the retry delay, and the retry jitter at most.
        a.busy(None, Ms(5));
        assert_eq!(a.nap(ttl, lease, Ms(5), 0.0, &T), T.retry_delay);
        assert!(a.nap(ttl, lease, Ms(5), 0.999, &T) <= T.retry_delay + T.retry_jitter);
        // Queued: over half as long again, and still within its stay.
        a.busy(Some(Queued::At(7)), Ms(10));
        let (first, last) = (
            a.nap(ttl, lease, Ms(10), 0.0, &T),
            a.nap(ttl, lease, Ms(10), 0.999, &T),
        );
        assert_eq!(first, T.retry_delay);
        assert!(last >= T.retry_delay * 14 / 10, "{last:?}");
        assert!(last + T.op_timeout < stay, "{last:?} {stay:?}");
        // A short ttl: spread over half of it.
        let short = Some(Duration::from_millis(200));
        assert!(a.nap(short, lease, Ms(10), 0.999, &T) >= Duration::from_millis(290));
    }

    #[test]
    fn a_stale_or_unconfirmed_grant_is_not_taken() {
        let mut a = Acquiring::new(Ms(0), Ms(5_000), T.op_timeout);
        a.attempt(Ms(0), &T);
        a.busy(Some(Queued::At(1_000)), Ms(5));
        assert_eq!(
            a.on_grant(Stamp::ServerMs(999, Ms(6)), false),
            OnGrant::Stale
        );
        assert_eq!(
            a.on_grant(Stamp::ServerMs(1_200, Ms(300)), true),
            OnGrant::Confirm
        );
        assert_eq!(
            a.on_grant(Stamp::ServerMs(1_200, Ms(300)), false),
            OnGrant::Take { from: Ms(200) }
        );
        assert!(Acquiring::too_late(
            Ms(200),
            Ms(3_200),
            Duration::from_secs(3),
            Duration::ZERO
        ));
        a.late(false);
        assert!(!a.pending && !a.queued_once && a.queued_at.is_none());
    }
}
