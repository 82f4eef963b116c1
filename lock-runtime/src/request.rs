use std::borrow::Cow;
use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::fault::Fault;
use crate::backend::{Acquired, Queue, Queued, Renewal};
use crate::claims::Stamp;
use crate::guard::Hold;
use crate::key::LockName;
use crate::metrics;
use crate::scope::{self, Reentry, Scope};
use crate::spans;
use crate::wakeups::{Waiter, Woken};
use crate::{LockClient, LockError, LockGuard, OnLost};

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
    /// Shared (`LockClient::read_lock`) rather than exclusive.
    read: bool,
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
}

impl LockRequest {
    pub(crate) fn new(client: LockClient, key: String) -> Self {
        LockRequest {
            client,
            key,
            more: Vec::new(),
            read: false,
            lease: None,
            wait: None,
            on_lost: OnLost::default(),
            min_hold: None,
            max_hold: None,
            fence: true,
            label: "manual",
        }
    }

    /// A read lock: shared with other readers (see [`LockClient::read_lock`]).
    pub(crate) fn shared(mut self) -> Self {
        self.read = true;
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
    /// forever. Must be at least the lease and `min_hold`.
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
        match self.acquire().await {
            Ok(guard) => Ok(Some(guard)),
            Err(LockError::Timeout { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Acquire inside a `lock.acquire` span (DEBUG, INFO once it waits:
    /// see `spans.rs`), and count the outcome.
    async fn acquire(self) -> Result<LockGuard, LockError> {
        let phases = spans::acquire(&self.key, self.label, self.wait);
        spans::acquiring(phases, self.acquire_counted()).await
    }

    async fn acquire_counted(self) -> Result<LockGuard, LockError> {
        let label = self.label;
        let started = Instant::now();
        let out = if self.more.is_empty() {
            self.acquire_in_span().await
        } else {
            self.acquire_all().await
        };
        match &out {
            Ok(guard) if guard.is_reentry() => {
                spans::acquired(guard.key(), label, "reentered", Some(guard.fence()), false);
            }
            Ok(guard) => {
                spans::acquired(guard.key(), label, "acquired", Some(guard.fence()), false);
                metrics::acquired(label, started.elapsed());
            }
            Err(LockError::Timeout { key, .. }) => {
                spans::acquired(key, label, "busy", None, false);
                metrics::busy(label);
            }
            Err(LockError::Lost { key } | LockError::MaxHoldReached { key, .. }) => {
                spans::acquired(key, label, "lost", None, true);
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
                read: self.read,
                lease: self.lease,
                wait: Some(deadline.saturating_duration_since(Instant::now())),
                on_lost: self.on_lost,
                min_hold: self.min_hold,
                max_hold: self.max_hold,
                fence: self.fence,
                label: self.label,
            };
            match one.acquire_in_span().await {
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

    async fn acquire_in_span(self) -> Result<LockGuard, LockError> {
        let LockRequest {
            client,
            key,
            read,
            lease,
            wait,
            min_hold,
            max_hold,
            fence,
            label,
            ..
        } = self;
        let cfg = &client.inner.config;
        let lease = lease.unwrap_or(cfg.lease);
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
        let scope = scope::current();
        if let Some(guard) = reenter(&client, &scope, &name, lease, read)? {
            return Ok(guard);
        }
        // Unique to this acquisition: a repeated send is recognised, and a
        // clean-up can never touch another hold. A reader's says so, which
        // is how every backend tells the two kinds of hold apart.
        let mode = if read { "r" } else { "" };
        let new_owner =
            || -> Arc<str> { format!("{}:{mode}{}", client.inner.id, scope::next_holder()).into() };
        let mut owner = new_owner();
        // From before the first send until this request ends, a grant for
        // `owner` is this request's, whatever it is doing when the message
        // arrives (see `claims.rs`).
        let mut claim = client.inner.claims.open(&owner);
        let started = Instant::now();
        // A huge wait means "as long as it takes".
        let deadline = started.checked_add(wait).unwrap_or(started + MAX_LEASE);
        let mut unsure = Unsure {
            client: client.clone(),
            name: name.clone(),
            owner: owner.clone(),
            pending: false,
        };
        let mut waiter: Option<Waiter> = None;
        let mut failures = 0u32;
        // An attempt of `owner` may have joined the lock's queue.
        let mut queued_once = false;
        // The last attempt that joined the queue: when it was sent, and the
        // backend's clock then. A grant's lease is counted from there.
        let mut queued_at: Option<(Instant, Queued)> = None;
        // The lock was seen held by another: a wait that runs out is a
        // `Timeout`, whatever failed last.
        let seen_busy = AtomicBool::new(false);
        // A server that refuses every connection cannot be reached: the
        // call ends within two operation timeouts (one for a call that
        // tries once), however long its wait. One that takes commands but
        // answers slowly or not at all is tried until the deadline, and no
        // attempt sent before it answered runs past the deadline.
        let unreachable_end = deadline
            .min(started + 2 * cfg.op_timeout)
            .max(started + cfg.op_timeout);
        let attempt_end = deadline.max(started + cfg.op_timeout);
        // An attempt reached the server (it may have run there).
        let mut reached = false;
        let give_up_at = |reached: bool| {
            if reached || seen_busy.load(Ordering::Relaxed) {
                deadline
            } else {
                deadline.min(unreachable_end)
            }
        };
        let gave_up = |e: Fault, key: &str| -> LockError {
            if seen_busy.load(Ordering::Relaxed) {
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
            let left = deadline.saturating_duration_since(Instant::now());
            // A waiter asks again at least every `retry_delay` (+ jitter),
            // which renews its place; one that died loses it soon after.
            let queue = Queue {
                stay: (!left.is_zero())
                    .then(|| left.min(cfg.retry_delay) + cfg.retry_jitter + 2 * cfg.op_timeout),
                rejoin: queued_once,
                fence,
                // No answer from the server yet: this attempt ends by the
                // call's deadline (a call that tries once: after one
                // operation timeout), or sooner while the server refuses
                // connections.
                by: (!seen_busy.load(Ordering::Relaxed)).then_some(if reached {
                    attempt_end
                } else {
                    unreachable_end
                }),
            };
            // Sent from this task: if it is dropped before the answer,
            // `unsure` takes the attempt back.
            unsure.pending = true;
            // A later attempt must know an earlier one may have queued this
            // owner, even if its answer never came.
            let may_queue = queue.stay.is_some();
            let sent_at = Instant::now();
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
                    unsure.pending = false;
                    if let Some(w) = waiter.as_mut() {
                        w.consumed();
                    }
                    if queued_once {
                        // A hand-off's grant message may still come.
                        claim.settle();
                    }
                    return Ok(acquired(&key, guard, started));
                }
                Ok(Attempt::Busy { ttl, queued }) => {
                    seen_busy.store(true, Ordering::Relaxed);
                    if let Some(w) = waiter.as_mut() {
                        w.consumed();
                    }
                    failures = 0;
                    if let Some(q) = queued {
                        queued_once = true;
                        queued_at = Some((sent_at, q));
                    }
                    // Queued: a release may yet hand it over, and if this
                    // request ends first, `unsure` leaves the queue.
                    unsure.pending = queued_once;
                    ttl
                }
                Ok(Attempt::Late(e)) => {
                    reached = true;
                    // Being taken back under this owner id: go on with a new
                    // one, which that release cannot touch.
                    unsure.pending = false;
                    (owner, waiter, queued_once, queued_at) = (new_owner(), None, false, None);
                    claim = client.inner.claims.open(&owner);
                    unsure.owner = owner.clone();
                    failures += 1;
                    pause_or_give_up(&client, failures, give_up_at(reached), e)
                        .await
                        .map_err(|e| gave_up(e, &key))?;
                    continue;
                }
                Err(e) if e.is_transient() => {
                    // The attempt may have run: the next one (same owner) is
                    // answered `Repeated` if it did, and if this request ends
                    // first, `unsure` takes it back.
                    queued_once |= may_queue;
                    // (Refused now: down now, whatever an earlier attempt met.)
                    reached = e.may_have_run();
                    failures += 1;
                    tracing::debug!(key = %key, error = %e, "lock attempt failed; trying again");
                    pause_or_give_up(&client, failures, give_up_at(reached), e)
                        .await
                        .map_err(|e| gave_up(e, &key))?;
                    continue;
                }
                Err(e) => {
                    // A refusal (bad data, a script error): nothing taken.
                    unsure.pending = queued_once;
                    return Err(e.into());
                }
            };
            let now = Instant::now();
            if now >= deadline {
                tracing::debug!(key = %key, waited_ms = (now - started).as_millis() as u64, "lock busy; giving up");
                return Err(LockError::Timeout {
                    key,
                    waited: now - started,
                });
            }
            spans::waiting(&key, label, wait);
            // Futures joined in one body share their scope: if a scope-mate
            // took the key meanwhile, re-enter its hold.
            let joined = scope.as_ref().map(|s| s.joined());
            tokio::pin!(joined);
            if let Some(j) = joined.as_mut().as_pin_mut() {
                j.enable();
            }
            if let Some(guard) = reenter(&client, &scope, &name, lease, read)? {
                return Ok(guard);
            }
            if !matches!(&waiter, Some(w) if !w.is_stale()) {
                waiter = None;
                // Listening costs no more than the wait has left; what
                // then remains is one last attempt.
                let listen = async {
                    let (w, fresh) = client.subscribe(&name, &owner).await?;
                    // Listening afresh: a release between the attempt
                    // and the subscription could not reach this client.
                    // A queued waiter checks it is still queued; one
                    // that does not queue tries again.
                    let waits =
                        !fresh || client.still_waits(&name, &owner, queued_at.is_some()).await;
                    Ok::<_, LockError>((w, waits))
                };
                let out = tokio::select! {
                    out = listen => Some(out),
                    _ = client.sleep(deadline.saturating_duration_since(now)) => None,
                };
                match out {
                    Some(Ok((w, waits))) => {
                        waiter = Some(w);
                        if !waits {
                            continue;
                        }
                    }
                    Some(Err(e)) => {
                        tracing::debug!(key = %key, error = %e, "cannot listen for releases; retrying on a timer");
                    }
                    None => continue,
                }
            }
            let now = Instant::now();
            let jitter = cfg.retry_jitter.mul_f64(fastrand::f64());
            let nap = (ttl.unwrap_or(lease).min(cfg.retry_delay) + jitter)
                .min(deadline.saturating_duration_since(now));
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
                woken = released => match woken {
                    Woken::Granted(g) => Some(g),
                    Woken::Retry => None,
                },
                _ = scope_joined => None,
                _ = client.sleep(nap) => None,
            };
            let Some(grant) = grant else {
                continue;
            };
            if is_stale(queued_at, grant.at) {
                // Handed over before this owner queued again: the lock was
                // lost since (it expired unrenewed, or the data was lost),
                // and the attempt that queued again saw someone else hold it.
                continue;
            }
            // Handed over by the holder's release: the lock is ours.
            if client.inner.backend.grants_need_confirming() {
                // The next attempt is answered `Repeated`, and confirms.
                continue;
            }
            let from = lease_start(started, queued_at, grant.at);
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
                    unsure.pending = false;
                    return Ok(acquired(&key, guard, started));
                }
                Attempt::Late(e) => {
                    unsure.pending = false;
                    (owner, waiter, queued_once, queued_at) = (new_owner(), None, false, None);
                    claim = client.inner.claims.open(&owner);
                    unsure.owner = owner.clone();
                    failures += 1;
                    pause_or_give_up(&client, failures, give_up_at(reached), e)
                        .await
                        .map_err(|e| gave_up(e, &key))?;
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
    if granted_at.elapsed() + inner.backend.drift(lease) >= lease {
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

/// A grant from before the last attempt that queued (on the same clock).
fn is_stale(queued_at: Option<(Instant, Queued)>, at: Stamp) -> bool {
    match (queued_at, at) {
        (Some((_, Queued::At(q))), Stamp::ServerMs(g, _)) => g < q,
        (Some((sent, Queued::Here)), Stamp::Local(t)) => t < sent,
        _ => false,
    }
}

/// Where a handed-over lease starts on this process's clock, never later
/// than it did: the queuing attempt was sent at `sent` (local), and the
/// backend's clock then read `queued`; the grant happened `at` on that same
/// clock, and its message arrived no earlier. If the server's clock ran
/// ahead of ours in between (a failover to another server, a clock step),
/// the earliest possible start wins: the send.
fn lease_start(started: Instant, queued_at: Option<(Instant, Queued)>, at: Stamp) -> Instant {
    match (queued_at, at) {
        (_, Stamp::Local(t)) => t,
        (Some((sent, Queued::At(q))), Stamp::ServerMs(g, heard)) => {
            let server = Duration::from_millis(g.saturating_sub(q));
            if server > heard.saturating_duration_since(sent) {
                sent
            } else {
                sent + server
            }
        }
        (Some((sent, Queued::Here)), Stamp::ServerMs(..)) => sent,
        // The attempt that queued got no answer: the earliest moment this
        // request could have been granted.
        (None, Stamp::ServerMs(..)) => started,
    }
}

/// Re-enter `name` if the caller's scope holds it: a write hold serves
/// reads and writes, a read hold only reads (`read`).
fn reenter(
    client: &LockClient,
    scope: &Option<Arc<Scope>>,
    name: &LockName,
    lease: Duration,
    read: bool,
) -> Result<Option<LockGuard>, LockError> {
    let Some(s) = scope else {
        return Ok(None);
    };
    match s.reenter(&client.inner.id, &name.hash, read) {
        Reentry::Upgrade => Err(LockError::UpgradeRefused {
            key: name.key.to_string(),
        }),
        Reentry::Held(hold) => {
            client
                .inner
                .watchdog
                .raise_lease(&hold.held, (&hold.name.hash, &hold.owner), lease);
            tracing::trace!(key = %name.key, fence = hold.fence, "lock re-entered");
            Ok(Some(LockGuard::reentered(hold, s.clone())))
        }
        // The outer hold is gone: a fresh grant under it would hide that.
        Reentry::Lost => Err(LockError::Lost {
            key: name.key.to_string(),
        }),
        Reentry::No => Ok(None),
    }
}

/// Pause before trying again after the `failures`-th failed attempt in a
/// row, or give up with `e` if the pause would pass the deadline. The pause
/// is 20 ms doubling, at most the retry delay, with some jitter so that
/// clients cut off together do not come back together.
async fn pause_or_give_up(
    client: &LockClient,
    failures: u32,
    deadline: Instant,
    e: Fault,
) -> Result<(), Fault> {
    let cap = client
        .inner
        .config
        .retry_delay
        .max(Duration::from_millis(1));
    let base = Duration::from_millis(20) * (1u32 << failures.clamp(1, 7).saturating_sub(1));
    let base = base.min(cap);
    let pause = base + base.mul_f64(fastrand::f64() / 2.0);
    if Instant::now() + pause >= deadline {
        return Err(e);
    }
    client.sleep(pause).await;
    Ok(())
}

/// An attempt whose outcome is unknown: if the request ends before a later
/// attempt settles it (granted, or busy), the lock it may have taken is
/// released — also when the request future is dropped.
struct Unsure {
    client: LockClient,
    name: LockName,
    owner: Arc<str>,
    /// An attempt of `owner` may have taken the lock unseen.
    pending: bool,
}

impl Drop for Unsure {
    fn drop(&mut self) {
        if self.pending {
            self.client
                .undo_in_background(self.name.clone(), self.owner.clone());
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
            .field("lease", &self.lease)
            .field("wait", &self.wait)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_handed_over_lease_is_never_booked_later_than_it_started() {
        let started = Instant::now();
        let sent = started + Duration::from_millis(10);
        let heard = sent + Duration::from_millis(500);
        let queued = Some((sent, Queued::At(1_000)));
        // Handed over 300 ms (server clock) after queuing: 300 ms after the
        // send, which is no later than on the server.
        assert_eq!(
            lease_start(started, queued, Stamp::ServerMs(1_300, heard)),
            sent + Duration::from_millis(300)
        );
        // The server's clock claims more time passed than could have here
        // (another server, a clock step): the send.
        assert_eq!(
            lease_start(started, queued, Stamp::ServerMs(2_000, heard)),
            sent
        );
        // The queuing attempt's answer was lost: the request's start.
        assert_eq!(
            lease_start(started, None, Stamp::ServerMs(1_300, heard)),
            started
        );
        // A grant from before the latest queuing is stale.
        assert!(is_stale(queued, Stamp::ServerMs(999, heard)));
        assert!(!is_stale(queued, Stamp::ServerMs(1_000, heard)));
    }
}
