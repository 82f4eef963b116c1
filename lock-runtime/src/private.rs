//! The attribute's only door into the runtime. Not public API: names here
//! may change in any release.

use std::future::Future;

pub use std::format;
pub use std::time::Duration;

use crate::{scope, LockError};

/// What the body does when its lock is lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnLost {
    /// Drop the body and return `Err(Lost)`.
    Abort,
    /// Let the body finish; the loss is logged.
    Continue,
}

/// The attribute's options, checked at compile time.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    pub lease: Option<Duration>,
    pub wait: Option<Duration>,
    pub on_lost: OnLost,
}

/// A return type an annotated fn may have.
#[diagnostic::on_unimplemented(
    message = "`#[distributed_lock]` fn returns `{Self}`, which cannot carry a lock error",
    label = "return `Result<T, E>` with `E: From<lock_runtime::LockError>`",
    note = "add `impl From<lock_runtime::LockError> for YourError`, or return `Result<T, lock_runtime::LockError>`"
)]
pub trait LockResult {
    fn from_lock_error(e: LockError) -> Self;
}

impl<T, E: From<LockError>> LockResult for Result<T, E> {
    fn from_lock_error(e: LockError) -> Self {
        Err(e.into())
    }
}

/// Run `body` under the lock `key` of the global client. `fail` turns a
/// lock error into the fn's return type; the macro passes
/// `<Ret as LockResult>::from_lock_error`, so a return type that cannot
/// carry a lock error is reported once, at that one place.
pub async fn locked<R, F>(key: String, options: Options, fail: fn(LockError) -> R, body: F) -> R
where
    F: Future<Output = R>,
{
    let client = match crate::client() {
        Ok(c) => c,
        Err(e) => return fail(e),
    };
    if scope::current().is_some() {
        run(client, key, options, fail, body).await
    } else {
        scope::enter(run(client, key, options, fail, body)).await
    }
}

async fn run<R, F>(
    client: crate::LockClient,
    key: String,
    options: Options,
    fail: fn(LockError) -> R,
    body: F,
) -> R
where
    F: Future<Output = R>,
{
    let mut request = client.lock(key);
    if let Some(lease) = options.lease {
        request = request.lease(lease);
    }
    if let Some(wait) = options.wait {
        request = request.wait(wait);
    }
    let guard = match request.await {
        Ok(guard) => guard,
        Err(e) => return fail(e),
    };
    let body = scope::with_fence(guard.fence(), body);
    let out = match options.on_lost {
        OnLost::Abort => {
            let lost = guard.lost();
            tokio::select! {
                biased;
                out = body => out,
                () = lost => {
                    let key = guard.key().to_owned();
                    tracing::warn!(key = %key, "lock lost; the body was stopped");
                    drop(guard);
                    return fail(LockError::Lost { key });
                }
            }
        }
        OnLost::Continue => body.await,
    };
    if let Err(e) = guard.release().await {
        tracing::warn!(error = %e, "releasing after the body finished failed; the body's result stands");
    }
    out
}
