//! The guard of a held lock: what `lock().await` returns and a body's
//! scope holds.

use std::sync::Arc;

use tokio::time::Instant;

use crate::backend::Released;
use crate::hold::Hold;
use crate::key::Mode;
use crate::metrics;
use crate::scope::Scope;
use crate::watchdog::Left;
use crate::LockError;

/// A held lock. The watchdog keeps it alive until it is released.
///
/// [`release`](LockGuard::release) it to learn whether it was held to the
/// end; dropping it releases in the background. Guards that re-entered a
/// lock share its one acquisition: only the last one out releases it.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), lock_runtime::LockError> {
/// let client = lock_runtime::LockClient::memory();
/// let guard = client.lock("invoice:9").await?;
/// // Send the token with every write; the store rejects older ones.
/// let token = guard.fence();
/// assert!(token > 0 && !guard.is_lost());
/// guard.release().await?; // Err(Lost) had the lock expired meanwhile
/// # Ok(()) }
/// ```
#[must_use = "dropping the guard releases the lock at once"]
pub struct LockGuard {
    hold: Arc<Hold>,
    scope: Option<Arc<Scope>>,
    done: bool,
    /// Re-entered an outer hold rather than acquired.
    reentry: bool,
    /// A multi-key lock's other keys, in sorted order after this one.
    // Boxed: one pointer in every guard (a client may keep 100k of them)
    // rather than a Vec's three, for what only a multi-key guard uses.
    #[allow(clippy::box_collection)]
    rest: Option<Box<Vec<LockGuard>>>,
}

impl LockGuard {
    /// The first guard of a fresh acquisition; a lock joins `scope` so that
    /// nested calls there re-enter it. A permit joins no scope here: only
    /// its own body's ([`LockGuard::body_scope`]).
    pub(crate) fn fresh(hold: Hold, scope: Option<Arc<Scope>>) -> Self {
        metrics::holding(hold.label, hold.mode(), 1.0);
        let hold = Arc::new(hold);
        let permit = Mode::of(&hold.owner).permits().is_some();
        let scope = scope.filter(|_| !permit);
        if let Some(s) = &scope {
            s.insert(&hold.client.inner.id, &hold);
        }
        LockGuard {
            hold,
            scope,
            done: false,
            reentry: false,
            rest: None,
        }
    }

    /// The scope to run this guard's body in: for a fresh permit, a child
    /// of `outer` that holds it, so that only calls nested in the body
    /// re-enter it; `None` (run in `outer`) otherwise.
    pub(crate) fn body_scope(&mut self, outer: Option<Arc<Scope>>) -> Option<Arc<Scope>> {
        let permit = Mode::of(&self.hold.owner).permits().is_some();
        if !permit || self.reentry || self.scope.is_some() || self.rest.is_some() {
            return None;
        }
        let scope = Scope::body_of(outer, &self.hold.client.inner.id, &self.hold);
        self.scope = Some(scope.clone());
        Some(scope)
    }

    /// Another guard of a hold its scope already counted.
    pub(crate) fn reentered(hold: Arc<Hold>, scope: Arc<Scope>) -> Self {
        LockGuard {
            hold,
            scope: Some(scope),
            done: false,
            reentry: true,
            rest: None,
        }
    }

    /// One guard for several keys (sorted, this one first).
    pub(crate) fn with_rest(mut self, rest: Vec<LockGuard>) -> Self {
        self.rest = (!rest.is_empty()).then(|| Box::new(rest));
        self
    }

    /// A multi-key lock's other keys' guards (none for a single key).
    fn others(&self) -> &[LockGuard] {
        self.rest.as_deref().map_or(&[], Vec::as_slice)
    }

    /// The fencing tokens of all keys of a multi-key lock
    /// ([`LockClient::lock_all`](crate::LockClient::lock_all)), in the
    /// keys' sorted order; [`fence`](Self::fence) is the first. One token
    /// for a single-key lock.
    pub fn fences(&self) -> Vec<u64> {
        std::iter::once(self.fence())
            .chain(self.others().iter().map(LockGuard::fence))
            .collect()
    }

    /// The keys this guard holds, sorted; one for a single-key lock.
    pub fn keys(&self) -> Vec<&str> {
        std::iter::once(self.key())
            .chain(self.others().iter().map(LockGuard::key))
            .collect()
    }

    /// Why the lock was lost, as the error a body stopped by it returns
    /// (the first key's of a multi-key lock that was lost).
    pub(crate) fn lost_error_any(&self) -> LockError {
        std::iter::once(self)
            .chain(self.others())
            .find(|g| g.hold.is_lost())
            .unwrap_or(self)
            .lost_error()
    }

    /// The key and token of each key, for [`current_fences`](crate::current_fences).
    pub(crate) fn key_fences(&self) -> impl Iterator<Item = (&Arc<str>, u64)> + '_ {
        std::iter::once(self)
            .chain(self.others())
            .map(|g| (&g.hold.name.key, g.hold.fence))
    }

    /// Whether this guard re-entered a hold of its scope.
    pub(crate) fn is_reentry(&self) -> bool {
        self.reentry
    }

    /// What metrics and spans call this lock.
    pub(crate) fn label(&self) -> &'static str {
        self.hold.label
    }

    /// The fencing token: strictly increasing per key across all clients.
    /// Send it with every write to the protected resource and have the
    /// resource reject tokens lower than the highest it has seen. A reentry
    /// has the token of the acquisition it re-entered.
    pub fn fence(&self) -> u64 {
        self.hold.fence
    }

    /// The key as the user gave it.
    pub fn key(&self) -> &str {
        &self.hold.name.key
    }

    /// The owner id written into the lock in Redis.
    pub fn holder(&self) -> &str {
        &self.hold.owner
    }

    /// Whether the watchdog found the lock lost.
    pub fn is_lost(&self) -> bool {
        self.hold.is_lost() || self.others().iter().any(LockGuard::is_lost)
    }

    /// Resolves when the lock is lost (never, if it is released first).
    /// Race work against it to stop as soon as exclusivity is gone.
    pub fn lost(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        // The clock says lost at the deadline, also while the watchdog's
        // timer is late: on the timers of the client's background work.
        let timer = self.hold.client.inner.io.handle();
        let first = self.hold.held.lost(&timer);
        // Boxed only for a multi-key guard: a single key allocates nothing.
        let others: Vec<_> = self
            .others()
            .iter()
            .map(|g| Box::pin(g.hold.held.lost(&timer)))
            .collect();
        async move {
            if others.is_empty() {
                first.await
            } else {
                let mut all = others;
                all.push(Box::pin(first));
                futures_util::future::select_all(all).await;
            }
        }
    }

    /// Release and report whether the lock was still ours:
    /// `Err(Lost)` if it expired or was deleted while held. A guard that
    /// re-entered a lock still held by an outer guard sends nothing.
    pub async fn release(mut self) -> Result<(), LockError> {
        // A multi-key lock: every key, and the first failure is the answer.
        let mut first_error = None;
        for g in self.rest.take().map(|r| *r).unwrap_or_default() {
            if let Err(e) = Box::pin(g.release()).await {
                first_error.get_or_insert(e);
            }
        }
        let out = self.release_one().await;
        match first_error {
            Some(e) => Err(e),
            None => out,
        }
    }

    async fn release_one(mut self) -> Result<(), LockError> {
        self.done = true;
        // Counted before the hold leaves the watchdog, until the release
        // has landed: a close waits for it (dropped unfinished, after the
        // background release below has taken over the count).
        let _releasing = self.hold.client.inner.shutdown.releasing();
        let Some(Left { was_lost, deadline }) = self.leave() else {
            return if self.hold.is_lost() {
                Err(self.lost_error())
            } else {
                Ok(())
            };
        };
        let hold = &self.hold;
        let inner = &hold.client.inner;
        // Sent from the caller's task; if the caller drops this future
        // before the answer, the release is finished in the background.
        let unfinished = Unfinished(Some((hold, deadline)));
        let out = match hold.keep_for() {
            // `min_hold`: left to expire then, if still ours.
            Some(left) => {
                inner
                    .io
                    .here(Box::pin(inner.backend.keep(
                        &hold.name,
                        &hold.owner,
                        left,
                        deadline,
                    )))
                    .await
            }
            // Both boxed: a release is a deep state machine (retries, a
            // native delete, the script), and an annotated body's future
            // would carry it inline, on the caller's stack.
            None => {
                inner
                    .io
                    .here(Box::pin(inner.backend.release_held(
                        &hold.name,
                        &hold.owner,
                        hold.fence,
                        hold.contended,
                        deadline,
                    )))
                    .await
            }
        };
        unfinished.done();
        match out {
            Ok(Released::NotOwner) => {
                if !was_lost {
                    // Found out only now: lost before the release.
                    metrics::lost(hold.label, hold.mode());
                }
                Err(self.lost_error())
            }
            Ok(_) if was_lost => Err(self.lost_error()),
            Ok(Released::Freed) => {
                tracing::debug!(key = %hold.name.key, "lock released");
                Ok(())
            }
            Err(e) => Err(e.into()),
        }
    }

    fn lost_error(&self) -> LockError {
        self.hold.lost_error()
    }

    /// End this guard. If it was the last of its acquisition, renewals stop
    /// (before the caller sends the release, so none is issued after it)
    /// and this says whether the watchdog had found the lock lost, and
    /// when the lock expires by itself; `None` while other guards still
    /// hold it.
    fn leave(&mut self) -> Option<Left> {
        let hold = &self.hold;
        if let Some(scope) = &self.scope {
            if !scope.leave(&hold.client.inner.id, hold) {
                return None;
            }
        }
        let left = hold
            .client
            .inner
            .watchdog
            .leave(&hold.held, (&hold.name.hash, &hold.owner));
        if left.was_lost {
            metrics::lost(hold.label, hold.mode());
        }
        metrics::held(hold.label, hold.mode(), hold.acquired_at.elapsed());
        Some(left)
    }
}

/// A release in flight: dropped unfinished, it is sent again in the
/// background (a release is idempotent).
struct Unfinished<'a>(Option<(&'a Hold, Option<Instant>)>);

impl Unfinished<'_> {
    fn done(mut self) {
        self.0 = None;
    }
}

impl Drop for Unfinished<'_> {
    fn drop(&mut self) {
        if let Some((hold, deadline)) = self.0 {
            hold.end_in_background(deadline);
        }
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        // Counted from before the hold leaves the watchdog until the
        // background release is counted in its own right.
        let _releasing = self.hold.client.inner.shutdown.releasing();
        if let Some(left) = self.leave() {
            self.hold.end_in_background(left.deadline);
        }
    }
}

impl std::fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockGuard")
            .field("key", &self.hold.name.key)
            .field("fence", &self.hold.fence)
            .field("holder", &self.hold.owner)
            .finish()
    }
}
