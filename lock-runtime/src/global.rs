use std::sync::OnceLock;

use crate::{LockClient, LockError};

static GLOBAL: OnceLock<LockClient> = OnceLock::new();

/// Install the client that `#[distributed_lock]` functions use. Call once at
/// start-up; a second call is `Err(AlreadyInitialized)`.
///
/// ```no_run
/// # async fn demo() -> Result<(), lock_runtime::LockError> {
/// lock_runtime::init(lock_runtime::LockClient::connect("redis://127.0.0.1:6379").await?)?;
/// # Ok(()) }
/// ```
pub fn init(client: LockClient) -> Result<(), LockError> {
    GLOBAL
        .set(client)
        .map_err(|_| LockError::AlreadyInitialized)
}

/// The client installed by [`init`], or `Err(NotInitialized)`.
pub fn client() -> Result<LockClient, LockError> {
    GLOBAL.get().cloned().ok_or(LockError::NotInitialized)
}
