//! A body run under a lock: what `#[distributed_lock]` expands to, and
//! the same by hand.

use std::future::Future;

use tracing::Instrument;

use crate::{scope, LockError, LockRequest};

/// What a body run under a lock does when the lock is lost while it runs
/// (the watchdog could not renew it in time, or Redis no longer has it).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum OnLost {
    /// Drop the body at its next await point and return
    /// `Err(LockError::Lost)`: nothing runs unprotected past the loss.
    #[default]
    Abort,
    /// Let the body finish; the loss is logged, and the result stands.
    Continue,
}

impl LockRequest {
    /// What [`run`](LockRequest::run) does if the lock is lost while the
    /// body runs; [`OnLost::Abort`] unless set.
    pub fn on_lost(mut self, on_lost: OnLost) -> Self {
        self.on_lost = on_lost;
        self
    }

    /// Take the lock, run `body` under it, and release it: what
    /// `#[distributed_lock]` does around an annotated fn.
    ///
    /// The body sees its token in [`current_fence`](crate::current_fence),
    /// and a nested request for the same key in it re-enters this hold. A
    /// lock that cannot be taken is `Err` without running the body; a lock
    /// lost while the body runs is `Err(LockError::Lost)` with
    /// [`OnLost::Abort`]. A failed release after the body is logged, and
    /// the body's output stands (the lock then expires with its lease).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), lock_runtime::LockError> {
    /// let client = lock_runtime::LockClient::memory();
    /// let fence = client
    ///     .lock("order:42")
    ///     .run(async { lock_runtime::current_fence() })
    ///     .await?;
    /// assert!(fence.is_some());
    /// # Ok(()) }
    /// ```
    pub async fn run<F: Future>(self, body: F) -> Result<F::Output, LockError> {
        if scope::current().is_some() {
            self.run_in_scope(body).await
        } else {
            scope::enter(self.run_in_scope(body)).await
        }
    }

    /// [`run`](LockRequest::run), except that a lock still busy after the
    /// request's `wait` is `Ok(None)` and the body does not run: what
    /// `#[distributed_lock(on_busy = "skip")]` does, for a job scheduled on
    /// every instance that only one of them should run.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), lock_runtime::LockError> {
    /// let client = lock_runtime::LockClient::memory();
    /// let held = client.lock("job:report").await?;
    /// let ran = client.lock("job:report").run_or_skip(async { "ran" }).await?;
    /// assert_eq!(ran, None); // another holder runs it now
    /// held.release().await?;
    /// # Ok(()) }
    /// ```
    pub async fn run_or_skip<F: Future>(self, body: F) -> Result<Option<F::Output>, LockError> {
        match self.run(body).await {
            Ok(out) => Ok(Some(out)),
            Err(LockError::Timeout { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    async fn run_in_scope<F: Future>(self, body: F) -> Result<F::Output, LockError> {
        let on_lost = self.on_lost;
        let guard = self.await?;
        // The body runs in a `lock.hold` span: a trace shows how long it
        // held the lock, after the `lock.acquire` span showed the wait.
        let span = tracing::info_span!(
            "lock.hold",
            key = %guard.key(),
            lock = %guard.label(),
            fence = guard.fence(),
        );
        let body = scope::with_fence(guard.fence(), body).instrument(span);
        let out = match on_lost {
            OnLost::Abort => {
                let lost = guard.lost();
                tokio::select! {
                    biased;
                    out = body => out,
                    () = lost => {
                        let key = guard.key().to_owned();
                        tracing::warn!(key = %key, "lock lost; the body was stopped");
                        drop(guard);
                        return Err(LockError::Lost { key });
                    }
                }
            }
            OnLost::Continue => body.await,
        };
        if let Err(e) = guard.release().await {
            tracing::warn!(error = %e, "releasing after the body finished failed; the body's result stands");
        }
        Ok(out)
    }
}

/// A return type an annotated fn may have: one that can carry a lock
/// error. The attribute turns a lock error into it.
#[doc(hidden)]
#[diagnostic::on_unimplemented(
    message = "`#[distributed_lock]` fn returns `{Self}`, which cannot carry a lock error",
    label = "return `Result<T, E>` with `E: From<lock_runtime::LockError>`",
    note = "add `impl From<lock_runtime::LockError> for YourError`, or return `Result<T, lock_runtime::LockError>`"
)]
pub trait LockResult {
    /// The lock error as this type.
    fn from_lock_error(e: LockError) -> Self;
}

impl<T, E: From<LockError>> LockResult for Result<T, E> {
    fn from_lock_error(e: LockError) -> Self {
        Err(e.into())
    }
}
