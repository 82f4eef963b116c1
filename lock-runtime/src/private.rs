//! The attribute's only door into the runtime: re-exports, so that the
//! expansion names nothing the user's crate must depend on. Not public API:
//! names here may change in any release.

pub use std::format;
pub use std::time::Duration;

pub use crate::run::{LockResult, SkipResult};

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
