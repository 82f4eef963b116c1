//! The seam between the lock protocol (client, watchdog, guards) and where
//! locks live. Each backend speaks the same four verbs.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::key::{LockName, Mode};
use crate::wakeups::Waiter;
use fault::Fault;

#[cfg(feature = "cluster")]
pub(crate) mod cluster;
pub(crate) mod endpoint;
pub(crate) mod fault;
pub(crate) mod memory;
pub(crate) mod node;
#[cfg(feature = "postgres")]
pub(crate) mod postgres;
pub(crate) mod pubsub;
pub(crate) mod redis;
pub(crate) mod redlock;
pub(crate) mod runtimes;
pub(crate) mod sentinel;
pub(crate) mod subscribers;

/// How long a client stays subscribed to a lock's channel after its last
/// waiter there left.
pub(crate) const LINGER: Duration = Duration::from_secs(2);

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
    /// `queued`: this owner now waits in the lock's queue, and a release
    /// will hand it the lock through its [`Waiter`]; the value is the
    /// server's clock (ms) when it queued, to count a later grant's lease
    /// from (None: the backend's own clock, in this process).
    Busy {
        ttl: Option<Duration>,
        queued: Option<Queued>,
    },
}

pub(crate) use crate::protocol::Queued;

/// What a busy attempt does besides saying so.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Queue {
    /// Join the lock's queue (or, where there is none, make its release
    /// wake waiters) for at most this long; `None`: just try once.
    pub(crate) stay: Option<Duration>,
    /// An earlier attempt of this owner may have queued it: a grant taken
    /// directly must leave the queue too.
    pub(crate) rejoin: bool,
    /// The request has had no answer from the server yet (it may be
    /// unreachable): this attempt ends by then, whatever it costs.
    pub(crate) by: Option<tokio::time::Instant>,
    /// Hand out a fencing token (`fence = false`: none, and the lock costs
    /// no more than a bare `SET NX PX`).
    pub(crate) fence: bool,
}

/// Outcome of one release.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Released {
    /// The lock is gone and waiters were woken.
    Freed,
    /// The lock was not ours any more (expired or deleted).
    NotOwner,
}

/// What a deployment holds of one lock, read for an operator
/// ([`Backend::inspect`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Seen {
    /// Owner ids holding it: one writer, or the readers in their lease.
    pub(crate) holders: Vec<String>,
    /// The lease left; `None` if nobody holds it.
    pub(crate) ttl: Option<Duration>,
    /// Waiters queued, of every client, still within their wait.
    pub(crate) waiters: usize,
    /// The last token handed out.
    pub(crate) fence: Option<u64>,
}

impl Seen {
    /// Whether `holder` is among the holders.
    pub(crate) fn holds(&self, holder: &str) -> bool {
        self.holders.iter().any(|h| h == holder)
    }
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
    Failed(Fault),
}

impl Renewed {
    /// A whole batch's outcome when its one round trip failed: no verdict
    /// for any of its `n` holds.
    pub(crate) fn all_failed(n: usize, fault: &Fault) -> Vec<Renewed> {
        let msg = fault.to_string();
        (0..n)
            .map(|_| Renewed::Failed(Fault::other(msg.clone())))
            .collect()
    }
}

/// Where locks live: one variant per deployment, each with the same verbs.
/// An enum, not a trait object: the set of deployments is closed, and a
/// match costs less than a boxed future at every call.
pub(crate) enum Backend {
    Memory(memory::MemoryBackend),
    Redis(redis::RedisBackend),
    #[cfg(feature = "cluster")]
    Cluster(cluster::ClusterBackend),
    Sentinel(sentinel::SentinelBackend),
    Redlock(redlock::RedlockBackend),
    /// One PostgreSQL server (feature `postgres`).
    #[cfg(feature = "postgres")]
    Postgres(Box<postgres::PostgresBackend>),
    /// A stand-in for unit tests of the protocol around the backend.
    #[cfg(test)]
    Fake(std::sync::Arc<dyn fake::Fake>),
}

/// Calls `$call` on whichever deployment `$b` is.
macro_rules! each {
    ($b:expr, $x:ident => $call:expr, fake $f:ident => $fake:expr) => {
        match $b {
            Backend::Memory($x) => $call,
            Backend::Redis($x) => $call,
            #[cfg(feature = "cluster")]
            Backend::Cluster($x) => $call,
            Backend::Sentinel($x) => $call,
            Backend::Redlock($x) => $call,
            #[cfg(feature = "postgres")]
            Backend::Postgres($x) => $call,
            #[cfg(test)]
            Backend::Fake($f) => $fake,
        }
    };
}

impl Backend {
    /// One acquire attempt (see [`Acquired`]).
    pub(crate) async fn acquire(
        &self,
        name: &LockName,
        owner: &Arc<str>,
        lease: Duration,
        queue: Queue,
    ) -> Result<Acquired, Fault> {
        // Sentinel's failover loop around a node's acquire is boxed: the
        // largest arm sets the size of every request's future, which each
        // lock builds and moves into its box.
        match self {
            Backend::Memory(b) => b.acquire(name, owner, lease, queue).await,
            Backend::Redis(b) => b.acquire(name, owner, lease, queue).await,
            #[cfg(feature = "cluster")]
            Backend::Cluster(b) => b.acquire(name, owner, lease, queue).await,
            Backend::Sentinel(b) => Box::pin(b.acquire(name, owner, lease, queue)).await,
            Backend::Redlock(b) => b.acquire(name, owner, lease, queue).await,
            #[cfg(feature = "postgres")]
            Backend::Postgres(b) => b.acquire(name, owner, lease, queue).await,
            #[cfg(test)]
            Backend::Fake(_) => Err(Fault::other("not used")),
        }
    }

    /// Release `owner`'s lock, or take it out of the lock's queue.
    /// `until`: when the lock expires by itself (the hold's deadline); a
    /// Redis Cluster whose slot is on the move is waited out until then
    /// (without it, until the lock's expiry on the server).
    pub(crate) async fn release(
        &self,
        name: &LockName,
        owner: &Arc<str>,
        until: Option<Instant>,
    ) -> Result<Released, Fault> {
        let _ = until;
        // Boxed for the same reason as in `acquire`.
        match self {
            Backend::Memory(b) => b.release(name, owner).await,
            Backend::Redis(b) => b.release(name, owner).await,
            #[cfg(feature = "cluster")]
            Backend::Cluster(b) => b.release_until(name, owner, until).await,
            Backend::Sentinel(b) => Box::pin(b.release(name, owner)).await,
            Backend::Redlock(b) => b.release(name, owner).await,
            #[cfg(feature = "postgres")]
            Backend::Postgres(b) => b.release(name, owner).await,
            #[cfg(test)]
            Backend::Fake(_) => Err(Fault::other("not used")),
        }
    }

    /// Release a hold of `owner`'s with token `fence` (0: none): a writer's
    /// that nobody is likely to wait behind (`contended` false) is deleted
    /// by the server's own compare-and-delete where it has one. `until` as
    /// for [`release`](Self::release).
    pub(crate) async fn release_held(
        &self,
        name: &LockName,
        owner: &Arc<str>,
        fence: u64,
        contended: bool,
        until: Option<Instant>,
    ) -> Result<Released, Fault> {
        if contended || Mode::of(owner) != Mode::Write {
            return self.release(name, owner, until).await;
        }
        match self {
            Backend::Redis(b) => b.node.release_writer(name, owner, fence).await,
            #[cfg(feature = "cluster")]
            Backend::Cluster(b) => b.release_writer_until(name, owner, fence, until).await,
            Backend::Sentinel(b) => Box::pin(b.release_writer(name, owner, fence)).await,
            _ => Box::pin(self.release(name, owner, until)).await,
        }
    }

    /// Take back an attempt of `owner` whose outcome is unknown (its answer
    /// was lost, or its caller went away before it came): release what it
    /// may have taken, or take it out of the queue. Sent where it cannot
    /// overtake the attempt it undoes: on the connection that attempt went
    /// on, after it.
    pub(crate) async fn undo(&self, name: &LockName, owner: &Arc<str>) -> Result<Released, Fault> {
        match self {
            Backend::Sentinel(b) => b.undo(name, owner).await,
            _ => self.release(name, owner, None).await,
        }
    }

    /// End `owner`'s hold, leaving the lock taken for `left` more
    /// (`min_hold`): a renewal of `owner` that comes after this extends
    /// nothing, and sending this twice is harmless. `until` as for
    /// [`release`](Self::release).
    ///
    /// `keep.lua` only shortens a hold. A `min_hold` that outlasts what the
    /// lease still gives (`min_hold = "50s"` beside a 30 s lease) is first
    /// stretched to by a renewal of `left`, which Sentinel's replicas
    /// acknowledge like any renewal; without it the lock lapsed at its
    /// lease and a job could run twice in one period.
    pub(crate) async fn keep(
        &self,
        name: &LockName,
        owner: &Arc<str>,
        left: Duration,
        until: Option<Instant>,
    ) -> Result<Released, Fault> {
        let until = match until {
            Some(deadline) if left > deadline.saturating_duration_since(Instant::now()) => {
                let sent_at = Instant::now();
                let stretch = Renewal {
                    name: name.clone(),
                    owner: owner.clone(),
                    lease: left,
                };
                match self.renew(vec![stretch]).await.into_iter().next() {
                    Some(Renewed::Yes) => Some(sent_at + left.saturating_sub(self.drift(left))),
                    Some(Renewed::NotOwner) => return Ok(Released::NotOwner),
                    // No verdict: kept for what the lease still gives.
                    _ => Some(deadline),
                }
            }
            other => other,
        };
        #[cfg(feature = "cluster")]
        if let (Backend::Cluster(b), Some(until)) = (self, until) {
            return b.keep_until(name, owner, left, until).await;
        }
        let _ = until;
        each!(self, b => b.keep(name, owner, left).await,
            fake _f => Err(Fault::other("not used")))
    }

    /// Renew a batch in as few round trips as the backend allows; one
    /// outcome per item, in order.
    pub(crate) async fn renew(&self, batch: Vec<Renewal>) -> Vec<Renewed> {
        each!(self, b => b.renew(batch).await, fake f => f.renew(batch).await)
    }

    /// Start listening for `owner`'s grant (or, where waiters do not
    /// queue, the lock's release). The returned waiter is subscribed before
    /// this resolves; the second value says whether this subscribed afresh
    /// (a grant sent before that went unheard, and its queue entry was
    /// skipped).
    pub(crate) async fn subscribe(
        &self,
        name: &LockName,
        owner: &Arc<str>,
    ) -> Result<(Waiter, bool), Fault> {
        each!(self, b => b.subscribe(name, owner).await,
            fake _f => Err(Fault::other("not used")))
    }

    /// Whether `owner` still waits in the lock's queue, or was handed the
    /// lock (after a fresh subscription: if neither, a release passed it
    /// over meanwhile). Redlock waiters do not queue: always true.
    pub(crate) async fn still_queued(
        &self,
        name: &LockName,
        owner: &Arc<str>,
    ) -> Result<bool, Fault> {
        match self {
            Backend::Memory(b) => b.still_queued(name, owner).await,
            Backend::Redis(b) => b.still_queued(name, owner).await,
            #[cfg(feature = "cluster")]
            Backend::Cluster(b) => b.still_queued(name, owner).await,
            Backend::Sentinel(b) => b.still_queued(name, owner).await,
            Backend::Redlock(_) => Ok(true),
            #[cfg(feature = "postgres")]
            Backend::Postgres(b) => b.still_queued(name, owner).await,
            #[cfg(test)]
            Backend::Fake(_) => Ok(true),
        }
    }

    /// A grant handed over by a release must be confirmed by an attempt of
    /// the new owner (Sentinel with `replica_acks`: that attempt waits for
    /// the replicas, as a fresh grant does).
    pub(crate) fn grants_need_confirming(&self) -> bool {
        matches!(self, Backend::Sentinel(b) if b.grants_need_confirming())
    }

    /// A release reaches the deployment's nodes one by one, each telling
    /// its own listeners (Redlock): a wake-up may come before the lock is
    /// gone everywhere.
    pub(crate) fn releases_node_by_node(&self) -> bool {
        matches!(self, Backend::Redlock(_))
    }

    /// Tasks of this client waiting for the lock.
    pub(crate) fn waiting(&self, name: &LockName) -> usize {
        each!(self, b => b.waiting(name), fake _f => 0)
    }

    /// What the deployment holds of this lock; changes nothing.
    pub(crate) async fn inspect(&self, name: &LockName) -> Result<Seen, Fault> {
        each!(self, b => b.inspect(name).await,
            fake _f => Err(Fault::other("not used")))
    }

    /// End every hold of this lock as its holder's own release would,
    /// serving the queue, but without recording the holder as the one that
    /// handed over (its own later release finds the lock lost). Returns the
    /// holders whose hold this removed.
    pub(crate) async fn force_release(&self, name: &LockName) -> Result<Vec<String>, Fault> {
        each!(self, b => b.force_release(name).await,
            fake _f => Err(Fault::other("not used")))
    }

    /// End `holder`'s hold of this lock as [`force_release`] ends each
    /// hold, and only if `holder` still holds it. Whether it ended one.
    ///
    /// [`force_release`]: Self::force_release
    pub(crate) async fn force_release_if(
        &self,
        name: &LockName,
        holder: &str,
    ) -> Result<bool, Fault> {
        each!(self, b => b.force_release_if(name, holder).await,
            fake _f => Err(Fault::other("not used")))
    }

    /// The Redis names matching the glob `pattern` (`SCAN`, on every
    /// primary or node); the caller picks the locks among them.
    pub(crate) async fn scan(&self, pattern: &str) -> Result<Vec<String>, Fault> {
        each!(self, b => b.scan(pattern).await,
            fake _f => Err(Fault::other("not used")))
    }

    /// How much of a lease the holder must not count on: clocks of several
    /// servers drift apart (Redlock). A lock is valid for `lease - drift`
    /// after its acquire or renewal was sent.
    pub(crate) fn drift(&self, lease: Duration) -> Duration {
        match self {
            Backend::Redlock(_) => redlock::drift(lease),
            _ => Duration::ZERO,
        }
    }
}

#[cfg(test)]
pub(crate) mod fake {
    use std::future::Future;
    use std::pin::Pin;

    use super::{Renewal, Renewed};

    pub(crate) type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

    /// What a unit test's stand-in backend answers.
    pub(crate) trait Fake: Send + Sync {
        fn renew(&self, batch: Vec<Renewal>) -> BoxFuture<Vec<Renewed>>;
    }
}
