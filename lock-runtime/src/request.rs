use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::client::Attempt;
use crate::key::LockName;
use crate::{scope, LockClient, LockError, LockGuard};

/// Longest lease accepted: a year is already a lock that outlives deploys.
const MAX_LEASE: Duration = Duration::from_secs(366 * 24 * 3600);

/// A lock about to be taken; `.await` it.
///
/// Acquiring a free lock is one Redis round trip. A busy one is waited for
/// up to `wait`: the waiter subscribes to the lock's release channel and
/// retries when the holder releases, with a jittered fallback retry (capped
/// by the holder's remaining TTL) in case a message is lost.
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
        let holder = scope.as_ref().map_or_else(scope::next_holder, |s| s.holder);
        let owner: Arc<str> = format!("{}:{holder}", client.inner.id).into();
        let started = Instant::now();
        // A huge wait means "as long as it takes".
        let deadline = started.checked_add(wait).unwrap_or(started + MAX_LEASE);
        let mut waiter = None;
        loop {
            match client.attempt(&name, &owner, lease, scope.clone()).await? {
                Attempt::Held(guard) => {
                    tracing::debug!(
                        key = %key,
                        fence = guard.fence(),
                        waited_ms = started.elapsed().as_millis() as u64,
                        "lock acquired"
                    );
                    return Ok(guard);
                }
                Attempt::Busy(ttl) => {
                    let now = Instant::now();
                    if now >= deadline {
                        tracing::debug!(key = %key, waited_ms = (now - started).as_millis() as u64, "lock busy; giving up");
                        return Err(LockError::Timeout {
                            key,
                            waited: now - started,
                        });
                    }
                    let Some(w) = waiter.as_mut() else {
                        // Listen first, then try again: a release between
                        // the failed attempt and the subscription is not lost.
                        waiter = Some(client.subscribe(&name).await?);
                        continue;
                    };
                    let jitter = cfg.retry_jitter.mul_f64(fastrand::f64());
                    let nap =
                        (ttl.unwrap_or(lease).min(cfg.retry_delay) + jitter).min(deadline - now);
                    tokio::select! {
                        _ = w.released() => {}
                        _ = client.sleep(nap) => {}
                    }
                }
            }
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
