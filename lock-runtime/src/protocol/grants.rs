//! Where a hand-off grant goes, and when one nobody claims is released.
//!
//! A release hands the lock to a queued owner and tells its client. The
//! grant belongs to the request that queued that owner for as long as the
//! request lives, whatever it is doing when the message arrives (parked,
//! sending an attempt again, waiting for a late answer): a request's owner
//! is registered before its first attempt is sent. Only a grant whose
//! request is over is an orphan; its client releases it after
//! [`ORPHAN_AFTER`] unless that owner holds the lock through an attempt of
//! its own.

use std::time::Duration;

/// How long a grant nobody claims waits before its client releases it
/// (its owner may hold the lock through an attempt of its own).
pub const ORPHAN_AFTER: Duration = Duration::from_secs(1);

/// Where a grant message goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Route {
    /// Into the mailbox of its owner's request, which is under way.
    Mailbox,
    /// Its owner's request took the lock by asking again (answered
    /// `Repeated` after the hand-off): the message names a lock already
    /// held. Dropped.
    Settled,
    /// Nobody claims it: released after [`ORPHAN_AFTER`], unless its owner
    /// holds the lock then ([`orphan_released`]).
    Orphan,
}

/// Where a grant for an owner goes: `live`, the owner's request is under
/// way; `settled`, it ended holding the lock it got by asking again.
pub fn route(live: bool, settled: bool) -> Route {
    if live {
        Route::Mailbox
    } else if settled {
        Route::Settled
    } else {
        Route::Orphan
    }
}

/// An orphan's timer fired: release it unless its owner holds the lock
/// (`watchdog_holds`: it is being renewed).
pub fn orphan_released(watchdog_holds: bool) -> bool {
    !watchdog_holds
}
