//! Which client annotated fns use: the innermost [`with_client`] scope of
//! the task, else the one installed by [`init`].

use std::future::Future;
use std::sync::OnceLock;
use std::time::Duration;

use crate::{LockClient, LockError};

static GLOBAL: OnceLock<LockClient> = OnceLock::new();

tokio::task_local! {
    static SCOPED: LockClient;
}

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

/// [`LockClient::close`] the client installed by [`init`], as a service
/// shuts down; nothing if none was installed. Annotated fns called after
/// it get `Err(LockError::Closed)`.
///
/// ```no_run
/// # async fn demo() {
/// // After the server's graceful shutdown, before the process exits:
/// lock_runtime::close_global(std::time::Duration::from_secs(10)).await;
/// # }
/// ```
pub async fn close_global(grace: Duration) {
    if let Some(client) = GLOBAL.get() {
        client.close(grace).await;
    }
}

/// The client annotated fns use here: the innermost [`with_client`] scope
/// this code runs in, else the one installed by [`init`], else
/// `Err(NotInitialized)`.
pub fn client() -> Result<LockClient, LockError> {
    if let Ok(client) = SCOPED.try_with(LockClient::clone) {
        return Ok(client);
    }
    GLOBAL.get().cloned().ok_or(LockError::NotInitialized)
}

/// Run `fut` with `client` as the client of everything awaited inside it:
/// annotated fns and [`client()`] there use it instead of the global one.
/// Scopes nest (the innermost wins); outside any scope the global client
/// serves. No [`init`] is needed, so each test, a scheduled job or a
/// second Redis can have a client of its own.
///
/// The scope belongs to the task: a `tokio::spawn`ed task starts outside
/// it (wrap its future in `with_client` too).
///
/// ```
/// use lock_runtime::{distributed_lock, LockClient, LockError};
///
/// #[distributed_lock(key = "order:{id}")]
/// async fn pay(id: u64) -> Result<u64, LockError> {
///     Ok(lock_runtime::current_fence().expect("held"))
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), LockError> {
/// // No `init`: this test's own client.
/// let client = LockClient::memory();
/// let fence = lock_runtime::with_client(client.clone(), pay(42)).await?;
/// assert!(fence > 0);
/// # Ok(()) }
/// ```
pub fn with_client<F: Future>(client: LockClient, fut: F) -> impl Future<Output = F::Output> {
    SCOPED.scope(client, fut)
}
