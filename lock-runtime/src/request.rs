use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::client::Attempt;
use crate::key::LockName;
use crate::scope::{self, Reentry, Scope};
use crate::wakeups::Waiter;
use crate::{LockClient, LockError, LockGuard};

/// Longest lease accepted: a year is already a lock that outlives deploys.
const MAX_LEASE: Duration = Duration::from_secs(366 * 24 * 3600);

/// A lock about to be taken; `.await` it.
///
/// Acquiring a free lock is one Redis round trip; re-entering one the
/// caller's annotated scope holds is none. A busy one is waited for up to
/// `wait`: the waiter subscribes to the lock's release channel and retries
/// when the holder releases, with a jittered fallback retry (capped by the
/// holder's remaining TTL) in case a message is lost. A failed attempt
/// (connection cut, no answer) is tried again while `wait` has time left;
/// an attempt whose answer was lost and that is not followed by a settled
/// one is taken back.
#[must_use = "a lock request does nothing until awaited"]
pub struct LockRequest {
    client: LockClient,
    key: String,
    lease: Option<Duration>,
    wait: Option<Duration>,
}

impl LockRequest {
    pub(crate) fn new(client: LockClient, key: String) -> Self {
        LockRequest {
            client,
            key,
            lease: None,
            wait: None,
        }
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

    async fn acquire(self) -> Result<LockGuard, LockError> {
        let LockRequest {
            client,
            key,
            lease,
            wait,
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
        let scope = scope::current();
        if let Some(guard) = reenter(&client, &scope, &name, lease)? {
            return Ok(guard);
        }
        // Unique to this acquisition: a repeated send is recognised, and a
        // clean-up can never touch another hold.
        let new_owner =
            || -> Arc<str> { format!("{}:{}", client.inner.id, scope::next_holder()).into() };
        let mut owner = new_owner();
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
        loop {
            let out = client.attempt(&name, &owner, lease, scope.clone()).await;
            let ttl = match out {
                Ok(Attempt::Held(guard)) => {
                    unsure.pending = false;
                    if let Some(w) = waiter.as_mut() {
                        w.consumed();
                    }
                    tracing::debug!(
                        key = %key,
                        fence = guard.fence(),
                        waited_ms = started.elapsed().as_millis() as u64,
                        "lock acquired"
                    );
                    return Ok(guard);
                }
                Ok(Attempt::Busy(ttl)) => {
                    // Someone else holds it: no earlier attempt of ours does.
                    unsure.pending = false;
                    if let Some(w) = waiter.as_mut() {
                        w.consumed();
                    }
                    failures = 0;
                    ttl
                }
                Ok(Attempt::Late(e)) => {
                    // Being taken back under this owner id: go on with a new
                    // one, which that release cannot touch.
                    unsure.pending = false;
                    owner = new_owner();
                    unsure.owner = owner.clone();
                    failures += 1;
                    pause_or_give_up(&client, failures, deadline, e).await?;
                    continue;
                }
                Err(e) if e.is_transient() => {
                    // The attempt may have run: the next one (same owner) is
                    // answered `Repeated` if it did, and if this request ends
                    // first, `unsure` takes it back.
                    unsure.pending = true;
                    failures += 1;
                    tracing::debug!(key = %key, error = %e, "lock attempt failed; trying again");
                    pause_or_give_up(&client, failures, deadline, e).await?;
                    continue;
                }
                Err(e) => return Err(e),
            };
            let now = Instant::now();
            if now >= deadline {
                tracing::debug!(key = %key, waited_ms = (now - started).as_millis() as u64, "lock busy; giving up");
                return Err(LockError::Timeout {
                    key,
                    waited: now - started,
                });
            }
            // Futures joined in one body share their scope: if a scope-mate
            // took the key meanwhile, re-enter its hold.
            let joined = scope.as_ref().map(|s| s.joined());
            tokio::pin!(joined);
            if let Some(j) = joined.as_mut().as_pin_mut() {
                j.enable();
            }
            if let Some(guard) = reenter(&client, &scope, &name, lease)? {
                return Ok(guard);
            }
            if !matches!(&waiter, Some(w) if !w.is_stale()) {
                waiter = None;
                // Listen first, then try again: a release between the failed
                // attempt and the subscription is not lost. If listening
                // fails, fall back to timed retries.
                match client.subscribe(&name).await {
                    Ok(w) => {
                        waiter = Some(w);
                        continue;
                    }
                    Err(e) => {
                        tracing::debug!(key = %key, error = %e, "cannot listen for releases; retrying on a timer");
                    }
                }
            }
            let jitter = cfg.retry_jitter.mul_f64(fastrand::f64());
            let nap = (ttl.unwrap_or(lease).min(cfg.retry_delay) + jitter).min(deadline - now);
            let released = async {
                match waiter.as_mut() {
                    Some(w) => w.released().await,
                    None => std::future::pending().await,
                }
            };
            let scope_joined = async {
                match joined.as_mut().as_pin_mut() {
                    Some(j) => j.await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = released => {}
                _ = scope_joined => {}
                _ = client.sleep(nap) => {}
            }
        }
    }
}

/// Re-enter `name` if the caller's scope holds it.
fn reenter(
    client: &LockClient,
    scope: &Option<Arc<Scope>>,
    name: &LockName,
    lease: Duration,
) -> Result<Option<LockGuard>, LockError> {
    let Some(s) = scope else {
        return Ok(None);
    };
    match s.reenter(&client.inner.id, &name.hash) {
        Reentry::Held(hold) => {
            client.inner.watchdog.raise_lease(&hold.held, lease);
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
    e: LockError,
) -> Result<(), LockError> {
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
                .release_in_background(self.name.clone(), self.owner.clone());
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
