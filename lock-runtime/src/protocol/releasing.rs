//! A guard's end: let go of the lock, or leave it taken until its
//! `min_hold` is over.

use std::time::Duration;

use super::Moment;

/// Until when a release leaves the lock taken: `min_hold` after the
/// acquire was sent (when the lease began).
pub fn keep_until<I: Moment>(acquired_at: I, min_hold: Option<Duration>) -> Option<I> {
    Some(acquired_at.after(min_hold?))
}

/// How long a release at `now` must leave the lock taken (the hold is
/// renamed and left to expire then: keep), or `None` (release it): less
/// than a millisecond left is nothing left.
pub fn keep_for<I: Moment>(until: Option<I>, now: I) -> Option<Duration> {
    let left = until?.since(now);
    (left >= Duration::from_millis(1)).then_some(left)
}
