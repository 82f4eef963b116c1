use std::sync::{Arc, Weak};
use std::time::Duration;

use crate::backend::endpoint::Access;
use crate::backend::node::NodeSettings;
use crate::backend::{Backend, Released};
use crate::claims::{Claims, ORPHAN_AFTER};
use crate::io::Io;
use crate::key::LockName;
use crate::protocol;
use crate::shutdown::Shutdown;
use crate::wakeups::Waiter;
use crate::watchdog::Watchdog;
use crate::LockError;

/// A handle to one lock service: a Redis deployment or this process.
///
/// Cheap to clone (an `Arc`); clones share connections and one watchdog.
/// It can be made in one tokio runtime and used from another: what
/// outlives a caller (the watchdog, background releases) runs on a small
/// I/O thread of the client's own, while a caller's commands go over a
/// connection its own runtime drives. Per Redis server that is at most one
/// connection per live runtime that used the client, plus the I/O
/// thread's, plus one for subscriptions (see `docs/DEPLOYMENTS.md`).
///
/// ```no_run
/// # async fn demo() -> Result<(), lock_runtime::LockError> {
/// use lock_runtime::LockClient;
/// use std::time::Duration;
///
/// let client = LockClient::connect("redis://127.0.0.1:6379").await?;
/// let guard = client.lock("order:42").wait(Duration::from_secs(5)).await?;
/// // ... exclusive work, pass guard.fence() to the store ...
/// guard.release().await?;
/// # Ok(()) }
/// ```
///
/// The in-process client has the same semantics (queue, fencing, leases):
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), lock_runtime::LockError> {
/// use lock_runtime::{LockClient, LockError};
/// use std::time::Duration;
///
/// let client = LockClient::memory();
/// let first = client.lock("order:42").await?;
/// // Busy: a second holder gives up after its `wait` (5 s by default).
/// let busy = client.lock("order:42").wait(Duration::ZERO).await;
/// assert!(matches!(busy, Err(LockError::Timeout { .. })));
/// let fence = first.fence();
/// first.release().await?;
/// let second = client.lock("order:42").await?;
/// assert!(second.fence() > fence);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct LockClient {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    /// Random per client: owner ids never collide across processes.
    pub(crate) id: Arc<str>,
    pub(crate) backend: Arc<Backend>,
    pub(crate) config: Config,
    pub(crate) watchdog: Watchdog,
    /// This client's requests under way, which grants are handed to.
    pub(crate) claims: Arc<Claims>,
    /// Closed ([`LockClient::close`]): no new locks.
    pub(crate) shutdown: Arc<Shutdown>,
    /// Declared last: the I/O thread stops after everything above is gone.
    pub(crate) io: Io,
}

#[derive(Debug, Clone)]
pub(crate) struct Config {
    pub(crate) lease: Duration,
    pub(crate) wait: Duration,
    pub(crate) prefix: Arc<str>,
    pub(crate) retry_delay: Duration,
    pub(crate) retry_jitter: Duration,
    pub(crate) op_timeout: Duration,
    pub(crate) connect_timeout: Duration,
    /// Sentinel: replicas that must confirm a fresh lock, and how long to
    /// wait for them.
    pub(crate) replica_acks: Option<(usize, Duration)>,
    /// TLS trust and the sentinels' credentials.
    pub(crate) access: Access,
    /// How long a token counter outlives its last use.
    pub(crate) fence_ttl: Duration,
    /// PostgreSQL: where the listening connection goes, if not to the
    /// URL's server (a pooler in transaction mode does not pass `LISTEN`).
    #[cfg(feature = "postgres")]
    pub(crate) listen_url: Option<String>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            lease: Duration::from_secs(30),
            wait: Duration::from_secs(5),
            prefix: "lock:".into(),
            retry_delay: Duration::from_secs(1),
            retry_jitter: Duration::from_millis(50),
            op_timeout: Duration::from_secs(2),
            connect_timeout: Duration::from_secs(2),
            replica_acks: None,
            access: Access::default(),
            fence_ttl: Duration::from_secs(24 * 3600),
            #[cfg(feature = "postgres")]
            listen_url: None,
        }
    }
}

impl Config {
    pub(crate) fn node_settings(&self) -> NodeSettings {
        NodeSettings {
            op_timeout: self.op_timeout,
            connect_timeout: self.connect_timeout,
            access: self.access.clone(),
            fence_ttl: self.fence_ttl,
        }
    }
}

impl std::fmt::Debug for LockClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockClient")
            .field("id", &self.inner.id)
            .field("prefix", &self.inner.config.prefix)
            .finish_non_exhaustive()
    }
}

impl LockClient {
    /// This client's random id, the prefix of every holder id it writes.
    pub fn id(&self) -> &str {
        &self.inner.id
    }

    /// How many locks this client is keeping alive right now.
    pub fn held_count(&self) -> usize {
        self.inner.watchdog.len()
    }

    /// How many tasks of this client (this process, through this client
    /// and its clones) wait for `key` to be released. Waiters of other
    /// clients are not counted. A task counts from when a release would
    /// reach it (it has queued and listens), so a test that sees a waiter
    /// here can release the lock and know the waiter hears it. (If the
    /// subscription then drops, its waiters stay counted and ask again.)
    pub fn waiting_here(&self, key: &str) -> usize {
        LockName::new(&self.inner.config.prefix, key).map_or(0, |n| self.inner.backend.waiting(&n))
    }

    /// [`waiting_here`](Self::waiting_here): this client's waiters only.
    #[deprecated(note = "counts this client's waiters only: use `waiting_here`")]
    pub fn waiting(&self, key: &str) -> usize {
        self.waiting_here(key)
    }

    /// A client over a connected backend and the I/O thread its
    /// connections live on (the builder makes both).
    pub(crate) fn from_parts(config: Config, backend: Backend, io: Io) -> LockClient {
        let id: Arc<str> = uuid::Uuid::new_v4().simple().to_string().into();
        // Owner ids are "<client id>:<rest>": the scripts and `Mode::of`
        // read the rest after the first ':'.
        debug_assert!(!id.contains(':'), "a client id with a ':': {id}");
        let inner = Arc::new_cyclic(|me: &Weak<Inner>| {
            let me = me.clone();
            Inner {
                claims: Claims::register(
                    &id,
                    Box::new(move |channel, owner| {
                        let Some(inner) = me.upgrade() else {
                            return;
                        };
                        if let Some(name) =
                            LockName::of_grant_channel(channel, &inner.config.prefix)
                        {
                            LockClient { inner }.release_orphan(name, owner);
                        }
                    }),
                ),
                id,
                shutdown: Arc::default(),
                backend: Arc::new(backend),
                config,
                watchdog: Watchdog::new(),
                io,
            }
        });
        LockClient { inner }
    }

    /// A grant (on the lock `name`, for `owner`) that no request of this
    /// client claims: `owner`'s request ended, and took its attempts back
    /// (a release that failed, or an entry left by an attempt whose answer
    /// was lost). Unless `owner` holds the lock (its attempt found the lock
    /// handed over and took it), it is released after [`ORPHAN_AFTER`],
    /// passing the lock on instead of leaving it to nobody for a lease.
    fn release_orphan(&self, name: LockName, owner: Arc<str>) {
        let client = self.clone();
        self.inner.io.spawn(async move {
            tokio::time::sleep(ORPHAN_AFTER).await;
            if protocol::orphan_released(client.inner.watchdog.holds(&name.hash, &owner)) {
                tracing::debug!(key = %name.key, "a lock handed to a waiter that is gone; passing it on");
                client.release_in_background(name, owner, None);
            }
        });
    }

    /// Release `owner`'s lock on the I/O thread. The task keeps the client
    /// (and so its I/O thread) alive until the release is through, also
    /// when the last handle to the client is dropped meanwhile.
    pub(crate) fn release_in_background(
        &self,
        name: LockName,
        owner: Arc<str>,
        deadline: Option<tokio::time::Instant>,
    ) {
        let client = self.clone();
        let busy = self.inner.shutdown.releasing();
        self.inner.io.spawn(async move {
            match client.inner.backend.release(&name, &owner, deadline).await {
                Ok(Released::NotOwner) => {
                    tracing::debug!(key = %name.key, "background release: the lock was no longer ours")
                }
                Ok(Released::Freed) => {
                    tracing::debug!(key = %name.key, "lock released in the background")
                }
                Err(e) => {
                    tracing::warn!(key = %name.key, error = %e, "background release failed; the lock expires with its lease")
                }
            }
            drop((client, busy));
        });
    }

    /// Take back, on the I/O thread, an attempt of `owner` whose outcome is
    /// unknown (see [`Backend::undo`]), sent from the runtime this runs on.
    pub(crate) fn undo_in_background(&self, name: LockName, owner: Arc<str>) {
        self.undo_sent_from(self.inner.io.caller_runtime(), name, owner);
    }

    /// The runtime whose connection an operation started here goes over
    /// (`None`: the I/O thread's), for [`undo_sent_from`](Self::undo_sent_from).
    pub(crate) fn caller_runtime(&self) -> Option<tokio::runtime::Id> {
        self.inner.io.caller_runtime()
    }

    /// Take back, on the I/O thread, an attempt of `owner` whose outcome is
    /// unknown and that was sent from the runtime `from`: behind it, on that
    /// runtime's connection, or once that connection can carry nothing
    /// more (see `backend/runtimes.rs`).
    pub(crate) fn undo_sent_from(
        &self,
        from: Option<tokio::runtime::Id>,
        name: LockName,
        owner: Arc<str>,
    ) {
        let client = self.clone();
        let busy = self.inner.shutdown.releasing();
        self.inner.io.spawn_behind(from, async move {
            if let Err(e) = client.inner.backend.undo(&name, &owner).await {
                tracing::warn!(key = %name.key, error = %e, "taking back a lock attempt failed; what it took expires with its lease");
            }
            drop((client, busy));
        });
    }

    /// The background release of a hold with `min_hold` time left: the
    /// lock is left to expire at `until` instead of deleted (if it is still
    /// `owner`'s; a release is what it becomes once that time has passed).
    /// `deadline`: when the lock expires by itself (see
    /// [`Backend::release`](crate::backend::Backend::release)).
    pub(crate) fn keep_in_background(
        &self,
        name: LockName,
        owner: Arc<str>,
        until: Option<tokio::time::Instant>,
        deadline: Option<tokio::time::Instant>,
    ) {
        let client = self.clone();
        let busy = self.inner.shutdown.releasing();
        self.inner.io.spawn(async move {
            let backend = &client.inner.backend;
            let out = match protocol::keep_for(until, tokio::time::Instant::now()) {
                Some(left) => backend.keep(&name, &owner, left, deadline).await,
                None => backend.release(&name, &owner, deadline).await,
            };
            if let Err(e) = out {
                tracing::warn!(key = %name.key, error = %e, "background release failed; the lock expires with its lease");
            }
            drop((client, busy));
        });
    }

    pub(crate) async fn subscribe(
        &self,
        name: &LockName,
        owner: &Arc<str>,
    ) -> Result<(Waiter, bool), LockError> {
        let fut = self.inner.backend.subscribe(name, owner);
        Ok(self.inner.io.here(fut).await?)
    }

    /// Whether `owner` still waits in the lock's queue, or was handed the
    /// lock (asked after a fresh subscription: if neither, a release passed
    /// it over meanwhile, and it should try again). A failure counts as no.
    pub(crate) async fn still_queued(&self, name: &LockName, owner: &Arc<str>) -> bool {
        let fut = self.inner.backend.still_queued(name, owner);
        matches!(self.inner.io.here(fut).await, Ok(true))
    }

    /// A timer on the client's own runtime, usable from any runtime.
    pub(crate) fn sleep(&self, d: Duration) -> tokio::time::Sleep {
        self.inner.io.sleep(d)
    }
}
