use std::borrow::Cow;
use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::fault::Fault;
use crate::backend::{Acquired, Queue, Queued, Renewal};
use crate::hold::Hold;
use crate::key::{LockName, Mode};
use crate::metrics;
use crate::on_lost::OnLost;
use crate::protocol::{self, Acquiring, AfterBusy, Listening, OnGrant};
use crate::scope::{self, Reentry, Scope};
use crate::spans;
use crate::wakeups::{Waiter, Woken};
use crate::{LockClient, LockError, LockGuard};

/// Longest lease accepted: a year is already a lock that outlives deploys.
const MAX_LEASE: Duration = Duration::from_secs(366 * 24 * 3600);

/// A lock about to be taken; `.await` it for a guard, or
/// [`run`](LockRequest::run) a body under it.
///
/// Acquiring a free lock is one Redis round trip; re-entering one the
/// caller's annotated scope holds is none. A busy one is waited for up to
/// `wait`: the attempt joins the lock's queue, and the holder's release
/// hands the lock to the first waiter in it (`docs/HANDOFF.md`), with a
/// jittered fallback retry (capped by the holder's remaining TTL) in case a
/// message is lost. A failed attempt (connection cut, no answer) is tried
/// again while `wait` has time left; an attempt whose answer was lost and
/// that is not followed by a settled one is taken back.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), lock_runtime::LockError> {
/// use std::time::Duration;
///
/// let client = lock_runtime::LockClient::memory();
/// let held = client.lock("stock:7").lease(Duration::from_secs(10)).await?;
/// // Queued behind `held`, handed the lock when it is released.
/// let waiter = tokio::spawn({
///     let client = client.clone();
///     async move { client.lock("stock:7").wait(Duration::from_secs(5)).await }
/// });
/// held.release().await?;
/// let next = waiter.await.unwrap()?;
/// assert_eq!(next.key(), "stock:7");
/// next.release().await?;
/// # Ok(()) }
/// ```
#[must_use = "a lock request does nothing until awaited"]
pub struct LockRequest {
    pub(crate) client: LockClient,
    pub(crate) key: String,
    /// A multi-key lock's other keys (`LockClient::lock_all`).
    more: Vec<String>,
    /// Exclusive, shared (`LockClient::read_lock`), or one permit of a
    /// semaphore (`LockClient::semaphore`).
    mode: Mode,
    lease: Option<Duration>,
    pub(crate) wait: Option<Duration>,
    pub(crate) on_lost: OnLost,
    min_hold: Option<Duration>,
    max_hold: Option<Duration>,
    /// Hand out a fencing token (the default).
    fence: bool,
    /// What metrics and spans call this lock: the attribute's key template,
    /// or the name given by hand.
    label: &'static str,
    /// The scope of the body this request is for (see `run.rs`), handed
    /// over directly: the outermost annotated call's scope is no
    /// task-local while it acquires. `None`: the task's, if any.
    pub(crate) scope: Option<Arc<Scope>>,
}

impl LockClient {
    /// Start building a lock request for `key`; `.await` it to acquire.
    ///
    /// Inside a `#[distributed_lock]` body, a key the body's scope already
    /// holds is re-entered; elsewhere every call is a separate holder.
    pub fn lock(&self, key: impl Into<String>) -> LockRequest {
        LockRequest::new(self.clone(), key.into())
    }

    /// A read lock on `key`: shared by every reader, excluded by a writer.
    ///
    /// Readers hold the key together, each on its own lease (a reader that
    /// dies lapses alone, and does not cut the others' leases short). A
    /// writer waits for all of them to leave; once one waits, new readers
    /// queue behind it, so a stream of readers cannot starve writers. When
    /// a writer releases, every reader queued behind it gets the lock at
    /// once; the last reader out hands it to the next writer. No polling.
    ///
    /// The first reader of a fresh read hold takes a token above every
    /// earlier writer's, and readers that join the hold share it
    /// ([`fence`](crate::LockGuard::fence)); the next writer's is higher
    /// still. In a scope that
    /// holds the write lock, a read lock of the same key re-enters it; in
    /// one that holds the read lock, asking for the write lock is
    /// [`LockError::UpgradeRefused`] at once, since waiting for the other
    /// readers could deadlock.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), lock_runtime::LockError> {
    /// use lock_runtime::{LockClient, LockError};
    /// use std::time::Duration;
    ///
    /// let client = LockClient::memory();
    /// let a = client.read_lock("doc:7").await?;
    /// let b = client.read_lock("doc:7").await?; // readers share
    /// let writer = client.write_lock("doc:7").wait(Duration::ZERO).await;
    /// assert!(matches!(writer, Err(LockError::Timeout { .. })));
    /// let read_token = a.fence();
    /// assert_eq!(b.fence(), read_token);
    /// a.release().await?;
    /// b.release().await?;
    /// let w = client.write_lock("doc:7").await?;
    /// assert!(w.fence() > read_token);
    /// # Ok(()) }
    /// ```
    pub fn read_lock(&self, key: impl Into<String>) -> LockRequest {
        LockRequest::new(self.clone(), key.into()).shared()
    }

    /// The exclusive lock on `key`: the same as [`lock`](Self::lock), named
    /// to pair with [`read_lock`](Self::read_lock).
    pub fn write_lock(&self, key: impl Into<String>) -> LockRequest {
        self.lock(key)
    }

    /// One permit of the semaphore `key`: at most `permits` holders at
    /// once, across every client and process (`docs/SEMAPHORES.md`).
    ///
    /// A request is admitted while fewer than its own `permits` hold the
    /// key, so two versions of a service that disagree on the number each
    /// keep their own limit, and nothing is set up first. Each permit has
    /// its own lease, renewed by the watchdog (a holder that dies frees its
    /// permit one lease later), and its own fencing token, unique and
    /// increasing per key. Waiters queue first come first served, and a
    /// returned permit is handed to the first of them directly. Inside a
    /// body that holds a permit of `key`, a request for it re-enters (no
    /// second permit); futures joined beside that body do not, as each is
    /// a body of its own, and a permit taken by `.await` (not `run`) is
    /// re-entered by nobody. `.lease()`, `.wait()`, `.fence(false)`,
    /// `.min_hold()`, `.max_hold()` mean what they mean for a lock.
    ///
    /// `permits` 0 admits nobody: the request fails with
    /// [`LockError::Config`].
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), lock_runtime::LockError> {
    /// # let client = lock_runtime::LockClient::memory();
    /// # if client.semaphore("x", 1).await.is_err() { return Ok(()) }
    /// use std::time::Duration;
    ///
    /// let a = client.semaphore("render:acme", 2).await?;
    /// let b = client.semaphore("render:acme", 2).await?;
    /// let third = client.semaphore("render:acme", 2).wait(Duration::ZERO).await;
    /// assert!(matches!(third, Err(lock_runtime::LockError::Timeout { .. })));
    /// assert_ne!(a.fence(), b.fence());
    /// a.release().await?;
    /// b.release().await?;
    /// # Ok(()) }
    /// ```
    pub fn semaphore(&self, key: impl Into<String>, permits: u32) -> LockRequest {
        let mut request = LockRequest::new(self.clone(), key.into());
        request.mode = Mode::Permit(permits);
        request
    }

    /// [`lock_all`](Self::lock_all) with read locks: all keys read-held, or
    /// none (what `#[distributed_lock(keys = [...], mode = "read")]` takes).
    pub fn read_lock_all(&self, keys: impl IntoIterator<Item = impl Into<String>>) -> LockRequest {
        self.lock_all(keys).shared()
    }

    /// One lock over several keys: all of them or none. Keys are taken in
    /// sorted order (two callers naming the same keys in different orders
    /// cannot deadlock), duplicates count once, and a key that cannot be
    /// taken within the request's `wait` releases the others at once. The
    /// guard's [`fence`](crate::LockGuard::fence) is the first key's token (sorted
    /// order), [`fences`](crate::LockGuard::fences) all of them; the watchdog
    /// renews all keys in its one call per tick. On a Cluster the keys may
    /// live in different slots (one round trip per key to take them); on
    /// Redlock each key is a Redlock.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), lock_runtime::LockError> {
    /// let client = lock_runtime::LockClient::memory();
    /// let guard = client.lock_all(["account:9", "account:1", "account:9"]).await?;
    /// assert_eq!(guard.keys(), ["account:1", "account:9"]);
    /// assert_eq!(guard.fences().len(), 2);
    /// guard.release().await?;
    /// # Ok(()) }
    /// ```
    pub fn lock_all(&self, keys: impl IntoIterator<Item = impl Into<String>>) -> LockRequest {
        let mut keys = keys.into_iter().map(Into::into);
        let first = keys.next().unwrap_or_default();
        LockRequest::new(self.clone(), first).and_keys(keys.collect())
    }
}

impl LockRequest {
    pub(crate) fn new(client: LockClient, key: String) -> Self {
        LockRequest {
            client,
            key,
            more: Vec::new(),
            mode: Mode::Write,
            lease: None,
            wait: None,
            on_lost: OnLost::default(),
            min_hold: None,
            max_hold: None,
            fence: true,
            label: "manual",
            scope: None,
        }
    }

    /// A read lock: shared with other readers (see [`LockClient::read_lock`]).
    pub(crate) fn shared(mut self) -> Self {
        self.mode = Mode::Read;
        self
    }

    /// More keys for this lock (see [`LockClient::lock_all`]).
    pub(crate) fn and_keys(mut self, keys: Vec<String>) -> Self {
        self.more = keys;
        self
    }

    /// What metrics (label `lock`) and tracing spans call this lock:
    /// `#[distributed_lock]` passes its key template as written
    /// (`"order:{id}"`); by hand, default `"manual"`. Never the formatted
    /// key, whose values are unbounded. A name that is not `'static` is
    /// kept for the life of the process (interned once), so use a bounded
    /// set of names, as for any metric label.
    pub fn name(mut self, name: impl Into<Cow<'static, str>>) -> Self {
        self.label = metrics::intern(name.into());
        self
    }

    /// TTL set in Redis; the watchdog renews it every lease/3.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = Some(lease);
        self
    }

    /// How long to wait for a busy lock; zero tries once.
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = Some(wait);
        self
    }

    /// Keep the lock taken until at least this long after it was acquired,
    /// even if it is released sooner: the release then leaves it to expire
    /// at that point, unrenewed (ShedLock's `lockAtLeastFor`). A job that
    /// runs on every instance then runs once per period even when the
    /// instances' clocks or schedules differ a little. Counted from when
    /// the acquire was sent. A reentry keeps the outer hold's bounds.
    pub fn min_hold(mut self, min_hold: Duration) -> Self {
        self.min_hold = Some(min_hold);
        self
    }

    /// Renew the lock for at most this long after it was acquired
    /// (ShedLock's `lockAtMostFor`): the last renewal ends the lease there,
    /// and the hold counts as lost from then on ([`run`](Self::run) stops
    /// the body under [`OnLost::Abort`]). A hung body cannot keep a lock
    /// forever. Must be at least `min_hold`, and at least a lease set on
    /// this request (else [`LockError::Config`] naming both). A lease left
    /// to the client's default is bounded by it instead: `max_hold` of 10 s
    /// under a default lease of 30 s takes the lock with a lease of 10 s.
    pub fn max_hold(mut self, max_hold: Duration) -> Self {
        self.max_hold = Some(max_hold);
        self
    }

    /// Whether the lock hands out a fencing token (default `true`).
    ///
    /// `fence(false)` is for work whose store cannot check tokens: no token
    /// is issued or stored, and the lock costs Redis what a bare
    /// `SET … NX PX` lock costs (an uncontended acquire is that very
    /// command, and its release one native compare-and-delete where the
    /// server has one). Owner-checked release, reentry, the watchdog and
    /// the FIFO hand-off stay. [`LockGuard::fence`] is then 0, which no
    /// fenced acquisition ever hands out, and inside such a body
    /// [`current_fence`](crate::current_fence) is `None`. A request that
    /// re-enters a hold of its scope shares that hold: re-entering one
    /// taken without a token, a fenced request gets 0 too.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), lock_runtime::LockError> {
    /// let client = lock_runtime::LockClient::memory();
    /// let guard = client.lock("cart:7").fence(false).await?;
    /// assert_eq!(guard.fence(), 0);
    /// guard.release().await?;
    /// # Ok(()) }
    /// ```
    pub fn fence(mut self, fence: bool) -> Self {
        self.fence = fence;
        self
    }

    /// Take the lock if it is free within `wait`, else `Ok(None)`: what a
    /// job that runs on every instance wants, where "busy" means "another
    /// instance runs it now". Other failures are `Err` as for `.await`.
    ///
    /// Without a `wait` of its own it tries once (the client's default
    /// `wait` is for requests that queue).
    pub async fn try_acquire(mut self) -> Result<Option<LockGuard>, LockError> {
        self.wait.get_or_insert(Duration::ZERO);
        // Boxed, as `.await` on the request is: inline it made this
        // future 6 KB.
        match self.into_future().await {
            Ok(guard) => Ok(Some(guard)),
            Err(LockError::Timeout { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Acquire inside a `lock.acquire` span (DEBUG, INFO once it waits:
    /// see `spans.rs`), and count the outcome.
    ///
    /// Not an `async fn`: one would keep the request's future twice, as
    /// its argument and inside the span's, and every lock builds it on the
    /// stack and moves it into its box.
    fn acquire(self) -> impl Future<Output = Result<LockGuard, LockError>> + Send {
        // The wait it has: its own, else the client's.
        let wait = self.wait.unwrap_or(self.client.inner.config.wait);
        let phases = spans::acquire(&self.key, self.label, self.mode.label(), wait);
        spans::acquiring(phases, self.acquire_counted())
    }

    async fn acquire_counted(self) -> Result<LockGuard, LockError> {
        let (label, mode) = (self.label, self.mode.label());
        let started = Instant::now();
        let out = if self.more.is_empty() {
            self.acquire_open().await
        } else {
            // Boxed: it holds a one-key request's future of its own.
            Box::pin(self.acquire_all()).await
        };
        match &out {
            Ok(guard) if guard.is_reentry() => {
                spans::acquired(guard.key(), label, "reentered", Some(guard.fence()), false);
            }
            Ok(guard) => {
                spans::acquired(guard.key(), label, "acquired", Some(guard.fence()), false);
                metrics::acquired(label, mode, started.elapsed());
            }
            Err(LockError::Timeout { key, .. }) => {
                spans::acquired(key, label, "busy", None, false);
                metrics::busy(label, mode);
            }
            Err(LockError::Lost { key } | LockError::MaxHoldReached { key, .. }) => {
                spans::acquired(key, label, "lost", None, true);
            }
            Err(LockError::Closed) => {
                spans::acquired("", label, "closed", None, false);
            }
            Err(_) => {
                spans::acquired("", label, "failed", None, false);
            }
        }
        out
    }

    /// A multi-key lock: every key, in sorted order (two callers naming the
    /// same keys in any order cannot deadlock), duplicates once, within one
    /// `wait`. A key that cannot be taken releases the ones taken before it
    /// at once, and is the error.
    async fn acquire_all(self) -> Result<LockGuard, LockError> {
        let mut keys: Vec<String> = std::iter::once(self.key.clone())
            .chain(self.more.iter().cloned())
            .collect();
        keys.sort();
        keys.dedup();
        let wait = self.wait.unwrap_or(self.client.inner.config.wait);
        let started = Instant::now();
        let deadline = started.checked_add(wait).unwrap_or(started + MAX_LEASE);
        let mut held: Vec<LockGuard> = Vec::with_capacity(keys.len());
        for key in keys {
            let one = LockRequest {
                client: self.client.clone(),
                key,
                more: Vec::new(),
                mode: self.mode,
                lease: self.lease,
                wait: Some(deadline.saturating_duration_since(Instant::now())),
                on_lost: self.on_lost,
                min_hold: self.min_hold,
                max_hold: self.max_hold,
                fence: self.fence,
                label: self.label,
                scope: self.scope.clone(),
            };
            match one.acquire_open().await {
                Ok(guard) => held.push(guard),
                Err(e) => {
                    // Dropped midway, the guards release in the background.
                    for g in held.into_iter().rev() {
                        if let Err(r) = g.release().await {
                            tracing::debug!(error = %r, "releasing a multi-key lock's key after another failed");
                        }
                    }
                    return Err(e);
                }
            }
        }
        let mut held = held.into_iter();
        let first = held.next().expect("at least one key");
        Ok(first.with_rest(held.collect()))
    }

    /// One key, while the client is open. A request under way when the
    /// client closes ends with `Closed` (what it queued or took is taken
    /// back, as for any dropped request), and a lock granted just as it
    /// closes is released again. Re-entering a hold of the caller's scope
    /// still works: a body finishing in its grace period may need it.
    async fn acquire_open(self) -> Result<LockGuard, LockError> {
        let client = self.client.clone();
        let shutdown = &client.inner.shutdown;
        let out = tokio::select! {
            biased;
            out = self.acquire_in_span() => out,
            () = shutdown.closed() => Err(LockError::Closed),
        };
        match out {
            // Granted as the close began: the close may not have seen it.
            Ok(guard) if !guard.is_reentry() && shutdown.is_closed() => {
                if let Err(e) = guard.release().await {
                    tracing::debug!(error = %e, "releasing a lock granted as the client closed");
                }
                Err(LockError::Closed)
            }
            out => out,
        }
    }

    async fn acquire_in_span(self) -> Result<LockGuard, LockError> {
        let LockRequest {
            client,
            key,
            mode,
            lease,
            wait,
            min_hold,
            max_hold,
            fence,
            label,
            scope,
            ..
        } = self;
        let cfg = &client.inner.config;
        // A lease left to the client's default is bounded by `max_hold`:
        // the hold ends there anyway. (One set on the request is checked
        // below.)
        let lease = match (lease, max_hold) {
            (Some(lease), _) => lease,
            (None, Some(max)) if !max.is_zero() => cfg.lease.min(max),
            (None, _) => cfg.lease,
        };
        let wait = wait.unwrap_or(cfg.wait);
        let name = LockName::new(&cfg.prefix, &key)?;
        if lease.is_zero() || lease > MAX_LEASE {
            return Err(LockError::Config(format!(
                "lock `{key}`: the lease must be longer than zero and at most {MAX_LEASE:?} (got {lease:?})"
            )));
        }
        if let Some(max) = max_hold {
            if max < lease || min_hold.is_some_and(|min| max < min) {
                return Err(LockError::Config(format!(
                    "lock `{key}`: max_hold ({max:?}) must be at least the lease ({lease:?}){}",
                    min_hold.map_or(String::new(), |m| format!(" and min_hold ({m:?})"))
                )));
            }
        }
        let bounds = Bounds {
            min_hold,
            max_hold,
            label,
            contended: false,
        };
        let scope = scope.or_else(scope::current);
        if mode == Mode::Permit(0) {
            return Err(LockError::Config(format!(
                "semaphore `{key}`: permits must be at least 1 (0 admits nobody)"
            )));
        }
        if let Some(guard) = reenter(&client, &scope, &name, lease, mode)? {
            return Ok(guard);
        }
        if client.inner.shutdown.is_closed() {
            return Err(LockError::Closed);
        }
        // Unique to this acquisition: a repeated send is recognised, and a
        // clean-up can never touch another hold. A reader's says so, which
        // is how every backend tells the kinds of hold apart (`Mode::of`).
        let new_owner = || -> Arc<str> { mode.owner(&client.inner.id, scope::next_holder()) };
        let mut owner = new_owner();
        // From before the first send until this request ends, a grant for
        // `owner` is this request's, whatever it is doing when the message
        // arrives (see `claims.rs`).
        let mut claim = client.inner.claims.open(&owner);
        let started = Instant::now();
        // A huge wait means "as long as it takes".
        let deadline = started.checked_add(wait).unwrap_or(started + MAX_LEASE);
        let timing = protocol::Timing {
            retry_delay: cfg.retry_delay,
            retry_jitter: cfg.retry_jitter,
            op_timeout: cfg.op_timeout,
        };
        // The loop's decisions and the deadlines its wait sets (see
        // `protocol/acquiring.rs`); `unsure` takes back what an attempt may
        // have left if the request ends without the lock.
        let mut unsure = Unsure {
            from: client.caller_runtime(),
            client: client.clone(),
            name: name.clone(),
            owner: owner.clone(),
            acq: Acquiring::new(started, deadline, cfg.op_timeout),
        };
        let mut waiter: Option<Waiter> = None;
        // When a release's wake-up last ended a wait.
        let mut woken: Option<Instant> = None;
        let gave_up = |e: Fault, acq: &Acquiring<Instant>, key: &str| -> LockError {
            if acq.ends_as_timeout() {
                tracing::debug!(key = %key, error = %e, "lock busy; giving up (the last attempt failed)");
                LockError::Timeout {
                    key: key.to_owned(),
                    waited: started.elapsed(),
                }
            } else {
                e.into()
            }
        };
        // Nothing starts after the deadline but one last attempt, and every
        // attempt is bounded by the backend: a call ends by its deadline
        // plus at most one attempt.
        loop {
            // Sent from this task: if it is dropped before the answer,
            // `unsure` takes the attempt back.
            let next = unsure.acq.attempt(Instant::now(), &timing);
            let queue = Queue {
                stay: next.stay,
                rejoin: next.rejoin,
                fence,
                by: next.by,
            };
            let out = attempt(
                &client,
                &name,
                &owner,
                (lease, bounds),
                queue,
                scope.clone(),
            )
            .await;
            let ttl = match out {
                Ok(Attempt::Held(guard)) => {
                    if let Some(w) = waiter.as_mut() {
                        w.consumed();
                    }
                    if unsure.acq.held(true) {
                        // A hand-off's grant message may still come.
                        claim.settle();
                    }
                    return Ok(acquired(&key, guard, started));
                }
                Ok(Attempt::Busy { ttl, queued }) => {
                    if let Some(w) = waiter.as_mut() {
                        w.consumed();
                    }
                    match unsure.acq.busy(queued, Instant::now()) {
                        AfterBusy::GiveUp => {
                            let waited = started.elapsed();
                            tracing::debug!(key = %key, waited_ms = waited.as_millis() as u64, "lock busy; giving up");
                            return Err(LockError::Timeout { key, waited });
                        }
                        AfterBusy::Listen => ttl,
                    }
                }
                Ok(Attempt::Late(e)) => {
                    // Being taken back under this owner id: go on with a new
                    // one, which that release cannot touch.
                    unsure.acq.late(true);
                    (owner, waiter) = (new_owner(), None);
                    claim = client.inner.claims.open(&owner);
                    unsure.owner = owner.clone();
                    pause_or_give_up(&client, &unsure.acq, &timing, e)
                        .await
                        .map_err(|e| gave_up(e, &unsure.acq, &key))?;
                    continue;
                }
                Err(Fault::GivenBack { message, released }) => {
                    // Taken and given back under this owner id, which the
                    // backend remembers as released (a failover sends that
                    // release again): go on under a new one, which that
                    // release cannot touch.
                    tracing::debug!(key = %key, error = %message, "lock attempt given back; trying again under a new owner id");
                    if !released {
                        client.undo_in_background(name.clone(), owner.clone());
                    }
                    unsure.acq.late(true);
                    (owner, waiter) = (new_owner(), None);
                    claim = client.inner.claims.open(&owner);
                    unsure.owner = owner.clone();
                    let e = Fault::GivenBack { message, released };
                    pause_or_give_up(&client, &unsure.acq, &timing, e)
                        .await
                        .map_err(|e| gave_up(e, &unsure.acq, &key))?;
                    continue;
                }
                Err(e) if e.is_transient() => {
                    // A deployment that answers "not now" (a slot on the
                    // move, too few replicas, a failover under way) is
                    // waited out until the deadline.
                    unsure.acq.failed(e.reached());
                    tracing::debug!(key = %key, error = %e, "lock attempt failed; trying again");
                    pause_or_give_up(&client, &unsure.acq, &timing, e)
                        .await
                        .map_err(|e| gave_up(e, &unsure.acq, &key))?;
                    continue;
                }
                Err(e) => {
                    unsure.acq.refused();
                    return Err(e.into());
                }
            };
            let now = Instant::now();
            spans::waiting(&key, label, wait);
            // Futures joined in one body share their scope: if a scope-mate
            // took the key meanwhile, re-enter its hold.
            let joined = scope.as_ref().map(|s| s.joined());
            tokio::pin!(joined);
            if let Some(j) = joined.as_mut().as_pin_mut() {
                j.enable();
            }
            if let Some(guard) = reenter(&client, &scope, &name, lease, mode)? {
                return Ok(guard);
            }
            if !matches!(&waiter, Some(w) if !w.is_stale()) {
                waiter = None;
                // Listening costs no more than the wait has left; what
                // then remains is one last attempt.
                let acq = &unsure.acq;
                let listen = async {
                    let (w, fresh) = client.subscribe(&name, &owner).await?;
                    // Listening afresh: a release between the attempt
                    // and the subscription could not reach this client.
                    let waits = match acq.listening(fresh) {
                        Listening::Wait => true,
                        Listening::AskQueued => client.still_queued(&name, &owner).await,
                        Listening::AttemptAgain => false,
                    };
                    Ok::<_, LockError>((w, waits))
                };
                // Boxed: taken only when busy, and as large as an attempt.
                let out = tokio::select! {
                    out = Box::pin(listen) => Some(out),
                    _ = client.sleep(deadline.saturating_duration_since(now)) => None,
                };
                match out {
                    Some(Ok((w, waits))) => {
                        unsure.acq.listened(true);
                        waiter = Some(w);
                        if !waits {
                            continue;
                        }
                    }
                    Some(Err(e)) => {
                        unsure.acq.listened(false);
                        tracing::debug!(key = %key, error = %e, failures = unsure.acq.unheard, "cannot listen for releases; asking again soon");
                    }
                    None => continue,
                }
            }
            let mut nap = unsure
                .acq
                .nap(ttl, lease, Instant::now(), fastrand::f64(), &timing);
            if waiter.is_none() {
                // Unheard, a release would pass this waiter over: the next
                // attempt listens again soon.
                nap = unsure.acq.nap_unheard(nap, fastrand::f64(), &timing);
            }
            if let Some(at) = woken.filter(|_| client.inner.backend.releases_node_by_node()) {
                nap = Acquiring::nap_after_wake(nap, at, Instant::now(), &timing);
            }
            let mailbox = claim.mailbox();
            let released = async {
                match waiter.as_mut() {
                    Some(w) => w.released().await,
                    // Not listening (the subscription failed): a grant
                    // heard anyway still lands in this request's mailbox.
                    None => loop {
                        let arrived = mailbox.arrived.notified();
                        if let Some(g) = mailbox.take() {
                            break Woken::Granted(g);
                        }
                        arrived.await;
                    },
                }
            };
            let scope_joined = async {
                match joined.as_mut().as_pin_mut() {
                    Some(j) => j.await,
                    None => std::future::pending().await,
                }
            };
            let grant = tokio::select! {
                out = released => match out {
                    Woken::Granted(g) => Some(g),
                    Woken::Retry => {
                        woken = Some(Instant::now());
                        None
                    }
                },
                _ = scope_joined => None,
                _ = client.sleep(nap) => None,
            };
            let Some(grant) = grant else {
                continue;
            };
            // Handed over by the holder's release: the lock is ours, unless
            // the grant is stale or must be confirmed by the next attempt
            // (answered `Repeated`).
            let confirming = client.inner.backend.grants_need_confirming();
            let from = match unsure.acq.on_grant(grant.at, confirming) {
                OnGrant::Stale | OnGrant::Confirm => continue,
                OnGrant::Take { from } => from,
            };
            match granted(
                &client,
                name.clone(),
                owner.clone(),
                (
                    lease,
                    Bounds {
                        contended: true,
                        ..bounds
                    },
                ),
                grant.fence,
                from,
                scope.clone(),
            ) {
                Attempt::Held(guard) => {
                    unsure.acq.held(false);
                    return Ok(acquired(&key, guard, started));
                }
                Attempt::Late(e) => {
                    unsure.acq.late(false);
                    (owner, waiter) = (new_owner(), None);
                    claim = client.inner.claims.open(&owner);
                    unsure.owner = owner.clone();
                    pause_or_give_up(&client, &unsure.acq, &timing, e)
                        .await
                        .map_err(|e| gave_up(e, &unsure.acq, &key))?;
                }
                Attempt::Busy { .. } => unreachable!("a grant is never busy"),
            }
        }
    }
}

/// What one acquire attempt came back with.
enum Attempt {
    Held(LockGuard),
    /// Someone else holds it for about this long; `queued`: this attempt
    /// joined the lock's queue (see [`Acquired::Busy`]).
    Busy {
        ttl: Option<Duration>,
        queued: Option<Queued>,
    },
    /// Granted too late to use; being taken back.
    Late(Fault),
}

/// One acquire attempt, sent from the caller's task. If the caller
/// drops it midway, the request's `Unsure` guard takes the attempt back.
///
/// A `Repeated` grant (an earlier send of this owner's ran) counts its
/// lease from this send too: the script set the lease again.
async fn attempt(
    client: &LockClient,
    name: &LockName,
    owner: &Arc<str>,
    (lease, bounds): (Duration, Bounds),
    queue: Queue,
    scope: Option<Arc<Scope>>,
) -> Result<Attempt, Fault> {
    let inner = &client.inner;
    let sent_at = Instant::now();
    let bounds = Bounds {
        contended: queue.rejoin,
        ..bounds
    };
    let fut = inner.backend.acquire(name, owner, lease, queue);
    match inner.io.here(fut).await? {
        Acquired::Busy { ttl, queued } => Ok(Attempt::Busy { ttl, queued }),
        Acquired::Fresh { fence } | Acquired::Repeated { fence } => Ok(granted(
            client,
            name.clone(),
            owner.clone(),
            (lease, bounds),
            fence,
            sent_at,
            scope,
        )),
    }
}

/// How long a fresh hold lasts at least and at most (see
/// [`LockRequest::min_hold`], [`LockRequest::max_hold`]), and what it is
/// called in metrics.
#[derive(Debug, Clone, Copy)]
struct Bounds {
    min_hold: Option<Duration>,
    max_hold: Option<Duration>,
    label: &'static str,
    /// Taken after queuing (or handed over): someone may wait behind it.
    contended: bool,
}

/// Turn a grant into a guard, unless it came back too late to be one.
fn granted(
    client: &LockClient,
    name: LockName,
    owner: Arc<str>,
    (lease, bounds): (Duration, Bounds),
    fence: u64,
    granted_at: Instant,
    scope: Option<Arc<Scope>>,
) -> Attempt {
    let inner = &client.inner;
    // The lease counts from the send: a grant that comes back after it
    // ran out may already be someone else's lock.
    if Acquiring::too_late(
        granted_at,
        Instant::now(),
        lease,
        inner.backend.drift(lease),
    ) {
        let err = Fault::timed_out(
            format!(
                "acquiring lock `{}`: the grant came back after its lease had run out",
                name.key
            ),
            lease,
        );
        // Taken back in the background: this owner id is spent, and a
        // later attempt must use another (its grant would be deleted).
        client.undo_in_background(name, owner);
        return Attempt::Late(err);
    }
    let held = inner.watchdog.hold(
        &inner.io,
        &inner.backend,
        Renewal {
            name: name.clone(),
            owner: owner.clone(),
            lease,
        },
        granted_at,
        bounds.max_hold.map(|max| granted_at + max),
    );
    let hold = Hold {
        client: client.clone(),
        name,
        owner,
        fence,
        held,
        min_hold_ms: bounds.min_hold.map_or(0, |min| {
            u32::try_from(min.as_millis().max(1)).unwrap_or(u32::MAX)
        }),
        acquired_at: granted_at,
        label: bounds.label,
        contended: bounds.contended,
    };
    Attempt::Held(LockGuard::fresh(hold, scope))
}

fn acquired(key: &str, guard: LockGuard, started: Instant) -> LockGuard {
    tracing::debug!(
        key = %key,
        fence = guard.fence(),
        waited_ms = started.elapsed().as_millis() as u64,
        "lock acquired"
    );
    guard
}

/// Re-enter `name` if the caller's scope holds it: a write hold serves
/// every request, a read hold only reads, a permit only permits.
fn reenter(
    client: &LockClient,
    scope: &Option<Arc<Scope>>,
    name: &LockName,
    lease: Duration,
    mode: Mode,
) -> Result<Option<LockGuard>, LockError> {
    let Some(s) = scope else {
        return Ok(None);
    };
    let (found, at) = s.reenter(&client.inner.id, &name.hash, mode);
    match found {
        Reentry::Upgrade => Err(LockError::UpgradeRefused {
            key: name.key.to_string(),
        }),
        Reentry::Mixed => Err(LockError::Config(format!(
            "`{}` is held in this scope as a {}: a key is used as a lock or as a semaphore, not both (the request would wait for this scope itself)",
            name.key,
            if mode.permits().is_some() { "read lock" } else { "semaphore permit" }
        ))),
        Reentry::Held(hold) => {
            client
                .inner
                .watchdog
                .raise_lease(&hold.held, (&hold.name.hash, &hold.owner), lease);
            tracing::trace!(key = %name.key, fence = hold.fence, "lock re-entered");
            Ok(Some(LockGuard::reentered(hold, at)))
        }
        // The outer hold is gone: a fresh grant under it would hide that.
        Reentry::Lost => Err(LockError::Lost {
            key: name.key.to_string(),
        }),
        Reentry::No => Ok(None),
    }
}

/// Pause before trying again after a failed attempt (at most until the
/// point where the request gives up), or give up with `e` once that has
/// come (see [`Acquiring::pause`]).
async fn pause_or_give_up(
    client: &LockClient,
    acq: &Acquiring<Instant>,
    timing: &protocol::Timing,
    e: Fault,
) -> Result<(), Fault> {
    match acq.pause(Instant::now(), fastrand::f64(), timing) {
        Some(pause) => {
            client.sleep(pause).await;
            Ok(())
        }
        None => Err(e),
    }
}

/// An attempt whose outcome is unknown: if the request ends before a later
/// attempt settles it (granted, or busy), the lock it may have taken is
/// released — also when the request future is dropped.
struct Unsure {
    /// The runtime whose connection the attempts go over: the undo follows
    /// them there.
    from: Option<tokio::runtime::Id>,
    client: LockClient,
    name: LockName,
    owner: Arc<str>,
    /// The request's loop; its `pending` says an attempt of `owner` may
    /// have taken the lock, or queued it, unseen.
    acq: Acquiring<Instant>,
}

impl Drop for Unsure {
    fn drop(&mut self) {
        if self.acq.pending {
            self.client
                .undo_sent_from(self.from, self.name.clone(), self.owner.clone());
        }
    }
}

impl IntoFuture for LockRequest {
    type Output = Result<LockGuard, LockError>;
    type IntoFuture = Pin<Box<dyn Future<Output = Self::Output> + Send>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(self.acquire())
    }
}

impl std::fmt::Debug for LockRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockRequest")
            .field("key", &self.key)
            .field("mode", &self.mode)
            .field("lease", &self.lease)
            .field("wait", &self.wait)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The size of the future `f` returns (`f` is never called).
    fn size<A, F: Future>(_: impl FnOnce(A) -> F) -> usize {
        std::mem::size_of::<F>()
    }

    /// Every lock builds its request's future on the stack and moves it
    /// into a box: its size is copied on each one (15 KB, twice its
    /// content, when the span's wrapper was an `async fn`).
    #[test]
    fn a_request_s_future_holds_its_work_once() {
        let whole = size(|r: LockRequest| r.acquire());
        let work = size(|r: LockRequest| r.acquire_counted());
        println!("a request's future: {whole} bytes, its work {work} bytes");
        assert!(whole < work + 512, "{whole} bytes for {work} bytes of work");
    }

    /// A rarer deployment's larger futures are boxed, not carried by
    /// every request on one Redis.
    #[test]
    fn one_redis_s_request_carries_no_larger_deployment_s_future() {
        let q = Queue {
            stay: None,
            rejoin: false,
            by: None,
            fence: true,
        };
        let name: &'static LockName = Box::leak(Box::new(LockName::new("", "k").unwrap()));
        let owner: &'static Arc<str> = Box::leak(Box::new(Arc::from("o")));
        let lease = Duration::from_secs(1);
        use crate::backend::{redis::RedisBackend, Backend};
        let any = size(|b: &'static Backend| b.acquire(name, owner, lease, q));
        let one = size(|b: &'static RedisBackend| b.acquire(name, owner, lease, q));
        let release = size(|b: &'static Backend| b.release_held(name, owner, 1, false, None));
        let release_one = size(|b: &'static RedisBackend| b.node.release_writer(name, owner, 1));
        println!("acquire: {any} bytes ({one} on one Redis); release: {release} ({release_one})");
        assert!(any < one + 256, "acquire: {any} bytes, {one} on one Redis");
        assert!(
            release < release_one + 512,
            "release: {release} bytes, {release_one} on one Redis"
        );
    }
}
