//! One acquisition from Redis, shared by the guards (and the task-local
//! scope) that re-enter it.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::key::LockName;
use crate::metrics;
use crate::protocol;
use crate::watchdog::{Ended, Held};
use crate::{LockClient, LockError};

/// One acquisition from Redis, shared by the guards that re-enter it.
pub(crate) struct Hold {
    pub(crate) client: LockClient,
    pub(crate) name: LockName,
    /// Unique to this acquisition: Redis knows the lock by it.
    pub(crate) owner: Arc<str>,
    pub(crate) fence: u64,
    pub(crate) held: Held,
    /// `min_hold` in ms (0: none): a release before `acquired_at` plus
    /// this leaves the lock to expire then. (Milliseconds: a held lock's
    /// every byte counts when a client holds 100k.)
    pub(crate) min_hold_ms: u32,
    /// When the acquire was sent: the lease counts from here.
    pub(crate) acquired_at: Instant,
    /// What metrics call this lock.
    pub(crate) label: &'static str,
    /// Taken after queuing, or handed over: someone may wait behind it,
    /// and its release goes straight to the script that hands it on.
    pub(crate) contended: bool,
}

impl Hold {
    /// What metrics call this hold's mode (`key::Mode::label`).
    pub(crate) fn mode(&self) -> &'static str {
        crate::key::Mode::of(&self.owner).label()
    }

    pub(crate) fn is_lost(&self) -> bool {
        self.held.is_lost()
    }

    /// The error for a hold the watchdog ended: `Lost`, or
    /// `MaxHoldReached` when it was held for its `max_hold`.
    pub(crate) fn lost_error(&self) -> LockError {
        let key = self.name.key.to_string();
        match self.held.ended() {
            Some((Ended::MaxHold, Some(max_hold))) => LockError::MaxHoldReached { key, max_hold },
            _ => LockError::Lost { key },
        }
    }

    /// Until when a release leaves the lock taken (`min_hold`).
    fn keep_until(&self) -> Option<Instant> {
        let min_hold =
            (self.min_hold_ms > 0).then(|| Duration::from_millis(u64::from(self.min_hold_ms)));
        protocol::keep_until(self.acquired_at, min_hold)
    }

    /// How long the lock must stay taken after a release now (`min_hold`):
    /// `None` releases it.
    pub(crate) fn keep_for(&self) -> Option<Duration> {
        protocol::keep_for(self.keep_until(), Instant::now())
    }

    /// End the hold from the background: release it, or leave it to
    /// expire at its `min_hold`. `deadline`: when the lock expires by
    /// itself (see [`Backend::release`](crate::backend::Backend::release)).
    pub(crate) fn end_in_background(&self, deadline: Option<Instant>) {
        let (name, owner) = (self.name.clone(), self.owner.clone());
        match self.keep_for() {
            Some(_) => self
                .client
                .keep_in_background(name, owner, self.keep_until(), deadline),
            None => self.client.release_in_background(name, owner, deadline),
        }
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        metrics::holding(self.label, self.mode(), -1.0);
    }
}
