//! One held lock in the watchdog: when it falls due, what a tick sends for
//! it, and what the answer (or no answer) means.

use std::time::Duration;

use super::Moment;

/// How often a lock is renewed: every third of its lease.
pub fn interval(lease: Duration) -> Duration {
    (lease / 3).max(Duration::from_millis(1))
}

/// The watchdog's clock for one held lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Renewing<I> {
    /// When it next wants renewing.
    pub next_due: I,
    /// The lease runs out here unless a renewal succeeds.
    pub deadline: I,
    /// `max_hold`: no renewal reaches past this, and the hold is lost here.
    pub until: Option<I>,
}

/// What a tick does for one lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Tick {
    /// Held for its `max_hold`: renewals stop and the hold is over.
    MaxHold,
    /// Renew it with this lease (cut to end at `max_hold`).
    Renew(Duration),
    /// Not due before the next tick.
    NotYet,
}

/// What a renewal came back with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Verdict {
    /// Extended.
    Renewed,
    /// The server no longer has it for this holder: lost now.
    NotOwner,
    /// No verdict (network, timeout): lost only once the lease runs out.
    NoAnswer,
}

impl<I: Moment> Renewing<I> {
    /// A lock granted at `granted_at` (when its acquire was sent: the
    /// lease counts from there) for `lease`, of which the holder must not
    /// count on `drift` (clocks of several servers); renewed until `until`.
    pub fn start(granted_at: I, lease: Duration, drift: Duration, until: Option<I>) -> Self {
        Renewing {
            next_due: granted_at.after(interval(lease)),
            deadline: granted_at.after(lease.saturating_sub(drift)),
            until,
        }
    }

    /// When the watchdog must next look at this lock.
    pub fn due(&self) -> I {
        let due = self.next_due.min(self.deadline);
        self.until.map_or(due, |u| due.min(u))
    }

    /// A tick at `now`, the lock's lease being `lease`: everything that
    /// would fall due before its next tick goes now.
    pub fn tick(&self, now: I, lease: Duration) -> Tick {
        let left = self.until.map(|u| u.since(now));
        if left.is_some_and(|l| l < Duration::from_millis(1)) {
            return Tick::MaxHold;
        }
        if self.next_due <= now.after(interval(lease)) || self.deadline <= now {
            // The last renewals end the lease at `max_hold`.
            return Tick::Renew(left.map_or(lease, |l| lease.min(l)));
        }
        Tick::NotYet
    }

    /// The answer to the renewal sent at `sent_at` with `sent` as its lease,
    /// heard at `now`; `lease` is what the lock asks for by now (a nested
    /// holder may have raised it), `drift` as in [`start`](Self::start).
    /// Deadlines are booked from the lease that was sent. Returns whether
    /// the hold is lost.
    pub fn answered(
        &mut self,
        verdict: Verdict,
        (sent_at, sent): (I, Duration),
        lease: Duration,
        drift: Duration,
        now: I,
    ) -> bool {
        match verdict {
            Verdict::Renewed => {
                self.deadline = sent_at.after(sent.saturating_sub(drift));
                self.next_due = sent_at.after(interval(sent));
                false
            }
            Verdict::NotOwner => true,
            Verdict::NoAnswer => {
                if now >= self.deadline {
                    return true;
                }
                // Try again soon, well before the lease runs out.
                let left = self.deadline.since(now);
                let iv = interval(lease.min(sent));
                self.next_due = now.after((left / 4).clamp(Duration::from_millis(10), iv));
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::moment::tests::Ms;

    #[test]
    fn renewals_end_the_lease_at_max_hold_then_stop() {
        let lease = Duration::from_millis(3_000);
        let mut r = Renewing::start(Ms(0), lease, Duration::ZERO, Some(Ms(4_000)));
        assert_eq!(r.due(), Ms(1_000));
        // Not due before the next tick (of a lock renewed every 400 ms).
        assert_eq!(r.tick(Ms(500), Duration::from_millis(1_200)), Tick::NotYet);
        assert_eq!(r.tick(Ms(1_000), lease), Tick::Renew(lease));
        assert!(!r.answered(
            Verdict::Renewed,
            (Ms(1_000), lease),
            lease,
            Duration::ZERO,
            Ms(1_001)
        ));
        assert_eq!((r.deadline, r.next_due), (Ms(4_000), Ms(2_000)));
        assert_eq!(
            r.tick(Ms(2_000), lease),
            Tick::Renew(Duration::from_millis(2_000))
        );
        assert_eq!(r.tick(Ms(4_000), lease), Tick::MaxHold);
    }

    #[test]
    fn no_answer_is_lost_only_once_the_lease_ran_out() {
        let lease = Duration::from_millis(3_000);
        let mut r = Renewing::start(Ms(0), lease, Duration::ZERO, None);
        assert!(!r.answered(
            Verdict::NoAnswer,
            (Ms(1_000), lease),
            lease,
            Duration::ZERO,
            Ms(2_000)
        ));
        assert_eq!(
            r.next_due,
            Ms(2_250),
            "again after a quarter of what is left"
        );
        assert!(r.answered(
            Verdict::NoAnswer,
            (Ms(2_250), lease),
            lease,
            Duration::ZERO,
            Ms(3_000)
        ));
        assert!(r.clone().answered(
            Verdict::NotOwner,
            (Ms(0), lease),
            lease,
            Duration::ZERO,
            Ms(1)
        ));
    }
}
