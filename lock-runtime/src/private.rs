//! The attribute's only door into the runtime: re-exports, so that the
//! expansion names nothing the user's crate must depend on. Not public API:
//! names here may change in any release.

pub use std::format;
pub use std::time::Duration;

pub use crate::run::{LockResult, SkipResult};

use std::future::Future;
use std::pin::Pin;

use crate::{LockError, LockRequest};

/// [`LockRequest::run`] of a body the expansion pinned in the annotated
/// fn's own future: the body is there once, and nothing is boxed.
pub fn run<'a, F: Future + ?Sized>(
    request: LockRequest,
    body: Pin<&'a mut F>,
) -> impl Future<Output = Result<F::Output, LockError>> + 'a {
    request.run_pinned(body)
}

/// [`LockRequest::run_or_skip`] of a body pinned as for [`run`].
pub fn run_or_skip<'a, F: Future + ?Sized>(
    request: LockRequest,
    body: Pin<&'a mut F>,
) -> impl Future<Output = Result<Option<F::Output>, LockError>> + 'a {
    request.run_or_skip_pinned(body)
}

/// What `client = <expr>` may name: a client, or a reference to one.
#[diagnostic::on_unimplemented(
    message = "`client = ...` must be a `LockClient` or a `&LockClient`, not `{Self}`",
    label = "not a lock client",
    note = "name the client in the fn's scope, e.g. `client = app.locks` where `app.locks: LockClient`"
)]
pub trait AsLockClient {
    /// The client.
    fn as_lock_client(&self) -> &crate::LockClient;
}

impl AsLockClient for crate::LockClient {
    fn as_lock_client(&self) -> &crate::LockClient {
        self
    }
}

impl<T: AsLockClient + ?Sized> AsLockClient for &T {
    fn as_lock_client(&self) -> &crate::LockClient {
        (**self).as_lock_client()
    }
}

impl<T: AsLockClient + ?Sized> AsLockClient for std::sync::Arc<T> {
    fn as_lock_client(&self) -> &crate::LockClient {
        (**self).as_lock_client()
    }
}

/// The client `client = <expr>` names.
pub fn lock_client<C: AsLockClient + ?Sized>(c: &C) -> &crate::LockClient {
    c.as_lock_client()
}
