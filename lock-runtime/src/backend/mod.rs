//! The seam between the lock protocol (client, watchdog, guards) and where
//! locks live. Each backend speaks the same four verbs.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use crate::key::LockName;
use crate::wakeups::Waiter;
use crate::LockError;

pub(crate) mod cluster;
pub(crate) mod memory;
pub(crate) mod redis;
pub(crate) mod redlock;
pub(crate) mod sentinel;
pub(crate) mod subscribers;

pub(crate) type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// Outcome of one acquire attempt. Owner ids are unique per acquisition
/// (reentry never reaches the backend), so an attempt sent twice is
/// recognised: the second answer is `Repeated` with the same token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Acquired {
    /// Taken; the fence counter moved past every earlier token.
    Fresh { fence: u64 },
    /// Already held by this owner: an earlier send of this same attempt
    /// ran and its reply was lost. `fence` is the token it was given.
    Repeated { fence: u64 },
    /// Held by someone else for about `ttl` more (None: unknown).
    Busy { ttl: Option<Duration> },
}

/// Outcome of one release.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Released {
    /// The lock is gone and waiters were woken.
    Freed,
    /// The lock was not ours any more (expired or deleted).
    NotOwner,
}

/// One lock for the watchdog to extend.
#[derive(Debug, Clone)]
pub(crate) struct Renewal {
    pub(crate) name: LockName,
    pub(crate) owner: Arc<str>,
    pub(crate) lease: Duration,
}

/// Outcome of renewing one lock.
#[derive(Debug)]
pub(crate) enum Renewed {
    Yes,
    /// Redis says the lock is no longer ours: lost now.
    NotOwner,
    /// No verdict (network, timeout): lost only once the lease runs out.
    Failed(LockError),
}

/// Where locks live. Futures are `'static` so the client can run them on its
/// own I/O runtime, where they finish even if the caller goes away.
pub(crate) trait Backend: Send + Sync + 'static {
    fn acquire(
        &self,
        name: &LockName,
        owner: &Arc<str>,
        lease: Duration,
    ) -> BoxFuture<Result<Acquired, LockError>>;

    fn release(&self, name: &LockName, owner: &Arc<str>) -> BoxFuture<Result<Released, LockError>>;

    /// Renew a batch in as few round trips as the backend allows; one
    /// outcome per item, in order.
    fn renew(&self, batch: Vec<Renewal>) -> BoxFuture<Vec<Renewed>>;

    /// Start listening for the lock's release. The returned waiter is
    /// subscribed before this resolves, so a release after it is not missed.
    fn subscribe(&self, name: &LockName) -> BoxFuture<Result<Waiter, LockError>>;

    /// Tasks of this client waiting for the lock's release.
    fn waiting(&self, name: &LockName) -> usize;

    /// How much of a lease the holder must not count on: clocks of several
    /// servers drift apart (Redlock). A lock is valid for `lease - drift`
    /// after its acquire or renewal was sent.
    fn drift(&self, _lease: Duration) -> Duration {
        Duration::ZERO
    }
}
