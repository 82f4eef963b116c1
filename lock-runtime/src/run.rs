//! A body run under a lock: what `#[distributed_lock]` expands to, and
//! the same by hand.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use crate::on_lost::OnLost;
use crate::scope::{self, BodyFences, Scope};
use crate::{spans, LockError, LockRequest};

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
    /// [`OnLost::Abort`] (`Err(LockError::MaxHoldReached)` if the body ran
    /// past the request's `max_hold`). A failed release after the body is logged, and
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
        // Boxed once here, and a pointer to it passed down: pinned on the
        // stack, the body would be in this future twice (argument and
        // pinned copy). An annotated fn pins its body in its own future
        // instead, and calls `run_pinned` (no box).
        let mut body = Box::pin(body);
        self.run_pinned(body.as_mut()).await
    }

    /// [`run`](LockRequest::run) of a body pinned by the caller: the
    /// layers below hold a pointer to it, not the body.
    pub(crate) async fn run_pinned<F: Future + ?Sized>(
        self,
        body: Pin<&mut F>,
    ) -> Result<F::Output, LockError> {
        // The outermost call opens the scope: handed to the request, and
        // set as a task-local only around the body (nested calls find it
        // there), not around the acquire and release, whose every poll
        // would pay for it.
        let scope = scope::current().unwrap_or_default();
        self.run_in_scope(scope, body).await
    }

    /// [`run`](LockRequest::run), except that a lock still busy after the
    /// request's `wait` is `Ok(None)` and the body does not run: what
    /// `#[distributed_lock(on_busy = "skip")]` does, for a job scheduled on
    /// every instance that only one of them should run. Without a `wait`
    /// of its own it tries once.
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
        let mut body = Box::pin(body);
        self.run_or_skip_pinned(body.as_mut()).await
    }

    /// [`run_or_skip`](LockRequest::run_or_skip) of a body pinned by the
    /// caller.
    pub(crate) async fn run_or_skip_pinned<F: Future + ?Sized>(
        self,
        body: Pin<&mut F>,
    ) -> Result<Option<F::Output>, LockError> {
        match self.trying_once().run_pinned(body).await {
            Ok(out) => Ok(Some(out)),
            Err(LockError::Timeout { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Without a `wait` of its own, this request tries once. (A plain fn,
    /// as [`in_scope`](Self::in_scope).)
    fn trying_once(mut self) -> Self {
        self.wait.get_or_insert(Duration::ZERO);
        self
    }

    /// This request, for a body of `scope`. (A plain fn: a `mut self` in
    /// an `async fn` is a second copy of the request in its future.)
    fn in_scope(mut self, scope: Arc<Scope>) -> Self {
        self.scope = Some(scope);
        self
    }

    async fn run_in_scope<F: Future + ?Sized>(
        self,
        outer: Arc<Scope>,
        body: Pin<&mut F>,
    ) -> Result<F::Output, LockError> {
        let on_lost = self.on_lost;
        let mut guard = self.in_scope(outer.clone()).await?;
        // A permit's own body is the only place that re-enters it.
        let scoped = guard.body_scope(Some(outer.clone()));
        // The body runs in a `lock.hold` span (DEBUG; INFO from a loss
        // on): a trace shows how long it held the lock, after the
        // `lock.acquire` span showed the wait.
        let (label, fence) = (guard.label(), guard.fence());
        let phases = spans::hold(guard.key(), label, fence);
        let fences = BodyFences::of(guard.key_fences());
        let body = scope::body(scoped.unwrap_or(outer), fences, body);
        let body = spans::Held::new(body, phases);
        tokio::pin!(body);
        let lost = guard.lost();
        let out = tokio::select! {
            biased;
            out = &mut body => out,
            () = lost => {
                let error = guard.lost_error_any();
                body.as_mut().lost(guard.key(), label, fence);
                match on_lost {
                    OnLost::Abort => {
                        body.as_mut().in_span(|| {
                            tracing::warn!(key = %guard.key(), error = %error, "lock lost; the body was stopped");
                        });
                        drop(guard);
                        return Err(error);
                    }
                    OnLost::Continue => {
                        body.as_mut().in_span(|| {
                            tracing::warn!(key = %guard.key(), error = %error, "lock lost; the body goes on (on_lost = continue)");
                        });
                        body.await
                    }
                }
            }
        };
        if let Err(e) = guard.release().await {
            tracing::warn!(error = %e, "releasing after the body finished failed; the body's result stands");
        }
        Ok(out)
    }
}

/// A return type an annotated fn may have: one that can carry a lock
/// error (`Result<T, E>` with `E: From<LockError>`, under any alias). The
/// attribute turns a lock error into it.
#[doc(hidden)]
#[diagnostic::on_unimplemented(
    message = "`#[distributed_lock]` fn returns `{Self}`, which cannot carry a lock error",
    label = "return `Result<T, E>` with `E: From<lock_runtime::LockError>`",
    note = "a busy or lost lock is reported through the fn's error: return `Result<T, YourError>` and add `impl From<lock_runtime::LockError> for YourError`, or return `Result<T, lock_runtime::LockError>`"
)]
pub trait LockResult {
    /// `T` of `Result<T, E>`.
    type Ok;

    /// The lock error as this type.
    fn from_lock_error(e: LockError) -> Self;
}

#[diagnostic::do_not_recommend]
impl<T, E: From<LockError>> LockResult for Result<T, E> {
    type Ok = T;

    fn from_lock_error(e: LockError) -> Self {
        Err(e.into())
    }
}

/// A return type `#[distributed_lock(on_busy = "skip")]` can skip with:
/// `Result<T, E>` whose `T` has a default.
#[doc(hidden)]
#[diagnostic::on_unimplemented(
    message = "`on_busy = \"skip\"` returns `Ok(T::default())` when the lock is busy, but the `T` of `{Self}` has no default",
    label = "`T` must implement `Default`",
    note = "derive or implement `Default` for the fn's `Ok` type, or leave `on_busy` at \"error\""
)]
pub trait SkipResult {
    /// `Ok(T::default())`.
    fn skipped() -> Self;
}

#[diagnostic::do_not_recommend]
impl<T: Default, E> SkipResult for Result<T, E> {
    fn skipped() -> Self {
        Ok(T::default())
    }
}

#[cfg(test)]
mod tests {
    /// An annotated body's future carries the lock's work inline: acquiring
    /// is boxed already, and so is releasing, so that nested and joined
    /// bodies stay small on the caller's stack (debug builds overflowed a
    /// test thread's 2 MiB with 7 KiB per body).
    #[tokio::test]
    async fn a_body_s_future_carries_no_release_inline() {
        let client = crate::LockClient::memory();
        let run = client.lock("k").run(async {});
        let size = std::mem::size_of_val(&run);
        assert!(size < 3 * 1024, "a run future is {size} bytes");
    }
}

#[cfg(test)]
mod permit_scope_tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use crate::LockClient;

    /// Bodies of a one-permit semaphore, joined inside a locked body: the
    /// lock's scope-mates share the lock, but never a permit, so no two of
    /// these bodies run at once.
    #[tokio::test]
    async fn joined_permit_calls_in_a_locked_body_never_overlap() {
        let client = LockClient::memory();
        let (inside, most, ran) = (
            AtomicUsize::new(0),
            AtomicUsize::new(0),
            AtomicUsize::new(0),
        );
        let call = || async {
            client
                .semaphore("provider", 1)
                .wait(Duration::from_secs(10))
                .run(async {
                    let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    inside.fetch_sub(1, Ordering::SeqCst);
                    ran.fetch_add(1, Ordering::SeqCst);
                })
                .await
        };
        let outs = client
            .lock("order:1")
            .run(async { futures_util::future::join_all([call(), call(), call()]).await })
            .await
            .unwrap();
        assert!(outs.iter().all(Result::is_ok), "{outs:?}");
        assert_eq!(ran.load(Ordering::SeqCst), 3);
        assert_eq!(
            most.load(Ordering::SeqCst),
            1,
            "bodies of a 1-permit semaphore at once"
        );
    }

    /// A call nested in a permit's body re-enters that permit, also when
    /// every permit is in use (here the one permit is the body's: it would
    /// otherwise wait for itself); so do futures joined inside that body,
    /// which are part of it.
    #[tokio::test]
    async fn a_nested_call_re_enters_its_permit_when_all_are_in_use() {
        let client = LockClient::memory();
        let fences = client
            .semaphore("provider", 1)
            .run(async {
                let outer = crate::current_fence();
                let nested = || async {
                    client
                        .semaphore("provider", 1)
                        .run(async { crate::current_fence() })
                        .await
                        .unwrap()
                };
                let (a, b) = futures_util::future::join(nested(), nested()).await;
                (outer, a, b)
            })
            .await
            .unwrap();
        assert!(fences.0.is_some());
        assert_eq!(fences.0, fences.1);
        assert_eq!(fences.0, fences.2);
        // And the permit was released after the body: it is free again.
        let again = client
            .semaphore("provider", 1)
            .wait(Duration::ZERO)
            .await
            .unwrap();
        again.release().await.unwrap();
    }

    /// Two futures joined in a permit's body wait for a key held elsewhere.
    /// The one handed the lock passes it up to the scope around the
    /// permit's body, and its sibling is woken there at once and re-enters
    /// it, instead of waiting for its next try (a retry delay of 5 s here).
    #[tokio::test(start_paused = true)]
    async fn a_sibling_in_a_permit_body_re_enters_a_lock_as_soon_as_it_is_taken() {
        let client = LockClient::builder()
            .retry_delay(Duration::from_secs(5))
            .memory()
            .unwrap();
        let outside = client.lock("order:1").await.unwrap();
        let started = tokio::time::Instant::now();
        let body = client.semaphore("provider", 1).run(async {
            let call = || async {
                let g = client
                    .lock("order:1")
                    .wait(Duration::from_secs(60))
                    .await
                    .unwrap();
                let took = (started.elapsed(), g.fence());
                tokio::time::sleep(Duration::from_secs(1)).await;
                drop(g);
                took
            };
            futures_util::future::join(call(), call()).await
        });
        let release = async {
            tokio::time::sleep(Duration::from_millis(500)).await;
            outside.release().await.unwrap();
        };
        let (took, ()) = tokio::join!(body, release);
        let (a, b) = took.unwrap();
        let (first, second) = (a.0.min(b.0), a.0.max(b.0));
        assert!(first >= Duration::from_millis(500), "{first:?}");
        assert!(
            second - first < Duration::from_millis(100),
            "the second joined call took the lock {:?} after the first",
            second - first
        );
        assert_eq!(a.1, b.1, "one hold, one token");
    }

    /// A body that takes many locks (its scope's holds move from a short
    /// list to a map past a few): each is re-entered with its own token,
    /// and each is free again once its guards are gone.
    #[tokio::test]
    async fn a_scope_holding_many_locks_re_enters_and_frees_each() {
        let client = LockClient::memory();
        let keys: Vec<String> = (0..20).map(|i| format!("batch:{i}")).collect();
        client
            .lock("job")
            .run(async {
                let mut held = Vec::new();
                for k in &keys {
                    held.push(client.lock(k).await.unwrap());
                }
                for (k, g) in keys.iter().zip(&held) {
                    let again = client.lock(k).wait(Duration::ZERO).await.unwrap();
                    assert!(again.is_reentry(), "{k}");
                    assert_eq!(again.fence(), g.fence(), "{k}");
                    again.release().await.unwrap();
                }
                for g in held {
                    g.release().await.unwrap();
                }
            })
            .await
            .unwrap();
        for k in &keys {
            let g = client.lock(k).wait(Duration::ZERO).await.unwrap();
            assert!(!g.is_reentry());
            g.release().await.unwrap();
        }
    }
}
