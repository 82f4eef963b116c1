//! Declarative distributed locks on Redis.
//!
//! Put `#[distributed_lock]` on an async fn and its body runs under a
//! reentrant lock that a watchdog keeps alive and that is released on every
//! exit — return, `?`, panic or cancellation:
//!
//! ```
//! use lock_runtime::{distributed_lock, LockClient, LockError};
//!
//! #[derive(Debug)]
//! enum AppError { Lock(LockError) }
//! impl From<LockError> for AppError {
//!     fn from(e: LockError) -> Self { AppError::Lock(e) }
//! }
//!
//! #[distributed_lock(key = "order:{id}", lease = "30s", wait = "5s")]
//! async fn pay(id: u64) -> Result<(), AppError> {
//!     // Only one instance of the service runs this for a given order.
//!     let _fence = lock_runtime::current_fence();
//!     Ok(())
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), AppError> {
//! // At start-up: `LockClient::connect("redis://127.0.0.1:6379").await?` (or
//! // `LockClient::from_env()`); in-process here, with the same semantics.
//! lock_runtime::init(LockClient::memory())?;
//! pay(42).await?;
//! # Ok(()) }
//! ```
//!
//! # Deployments
//! [`LockClient::connect`] (one Redis), [`LockClient::sentinel`] (a primary
//! found through Sentinel, followed across failovers),
//! [`LockClient::cluster`] (Redis Cluster), [`LockClient::redlock`] (a
//! majority of independent servers) and [`LockClient::memory`] (this process)
//! all give the same locks; they differ in what a crash or failover can do to
//! a held one. `docs/DEPLOYMENTS.md` compares them.
//!
//! # What Redis holds
//! A held lock is the string `lock:{key}` holding the owner id of the one
//! acquisition that holds it and its fencing token, with the lease as its
//! expiry. Tokens come from one counter per server (`lock:fence`; one per
//! hash slot on a Redis Cluster), which expires after
//! [`fence_ttl`](LockClientBuilder::fence_ttl) unused. Waiters queue in
//! `lock:{key}:queue` (with
//! their leases in `lock:{key}:waiters`), and a release hands the lock to
//! the first of them, telling its client on `lock:{key}:granted:<client
//! id>`: a contended acquisition is one failed attempt and one pub/sub
//! message (`docs/HANDOFF.md`). After a release with nobody waiting
//! nothing of the lock remains: no key is kept per lock name.
//!
//! # Start-up and shutdown
//! [`LockClient::connect_lazy`] builds a client without I/O, so a service
//! starts while Redis is not up yet; [`LockClient::close`] (or
//! [`close_global`]) at shutdown releases what the client still holds
//! after a grace period, so waiters elsewhere are served at once rather
//! than after a lease. `#[distributed_lock(client = app.locks)]` takes the
//! client from the fn's scope (an axum handler's state) instead of the
//! global one. `docs/PRODUCTION.md` covers leases, outages, versions and
//! ACLs.
//!
//! # Looking at locks and clearing them
//! [`LockClient::inspect`] says who holds a key, for how long, and how many
//! wait; [`LockClient::force_release`] clears a stuck holder and serves the
//! next waiter at once; [`LockClient::locks`] lists the held keys. The
//! `lockctl` CLI runs them from a shell.
//!
//! # Lost replies and dropped connections
//! Owner ids are unique per acquisition and every lock script is idempotent,
//! so a command whose connection broke is simply sent again: a repeated
//! acquire is answered with the grant it already made, a repeated release
//! finds the lock gone. A lock call with `wait` left rides out reconnects;
//! an attempt whose answer never came is taken back.
//!
//! # Fencing
//! A lease can run out under a holder that is paused (GC, swap, a stopped
//! VM) without the holder noticing in time. Locks alone cannot prevent the
//! overlap; fencing tokens can. Each fresh acquisition gets a token from a
//! counter that only grows and never falls below the server clock in
//! microseconds, so tokens keep increasing also when Redis loses the counter
//! (a failover to a lagging replica, a restart without persistence). Send
//! [`current_fence`] (or
//! [`LockGuard::fence`]) along with every write, and let the store reject a
//! write whose token is lower than the highest it has accepted.
//!
//! # Reentrancy
//! Reentrancy belongs to the annotated call chain: the outermost annotated
//! call opens a task-local scope, and annotated calls (or `client.lock`)
//! awaited inside it on a key it holds re-enter. A spawned task is another
//! holder. Futures joined concurrently inside one body share the holder.
//! Reentry is counted in the process: it costs no round trip and hands back
//! exactly the outer token.
//!
//! # Testing
//! [`LockClient::memory`] keeps time with tokio: under
//! `#[tokio::test(start_paused = true)]` a 20 s wait or a 10 min hold passes
//! in no real time, and `tokio::time::advance` drives leases, waits and
//! renewals. [`with_client`] gives each test (or job) its own client with no
//! [`init`]; [`LockClient::memory_with_control`] adds
//! [`MemoryControl::expire`] (a lease ends now: test your `on_lost` path) and
//! [`MemoryControl::fail_next`] (calls fail as on a cut connection: test your
//! retries).
//!
//! ```
//! use lock_runtime::{distributed_lock, with_client, LockClient, LockError};
//!
//! #[distributed_lock(key = "order:{id}", wait = "20s")]
//! async fn pay(id: u64) -> Result<u64, LockError> {
//!     Ok(lock_runtime::current_fence().expect("held"))
//! }
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), LockError> {
//! // In a `#[tokio::test(start_paused = true)]`:
//! let client = LockClient::memory();
//! let held = client.lock("order:1").await?;
//! let holder = tokio::spawn(async move {
//!     tokio::time::sleep(std::time::Duration::from_secs(15)).await;
//!     held.release().await
//! });
//! // Waits 15 s of tokio time for the holder, then runs.
//! assert!(with_client(client, pay(1)).await? > 0);
//! holder.await.unwrap()?;
//! # Ok(()) }
//! ```
//!
//! # Cargo features
#![doc = document_features::document_features!()]
//!
//! Without `tls` a `rediss://` URL is a [`LockError::Config`] that says to
//! enable it. ACL users work with or without it:
//! `redis://user:password@host:port`.
//!
//! # Metrics
//! With the `metrics` feature, through the
//! [`metrics`](https://docs.rs/metrics) facade, each with the label `lock`
//! (the attribute's key template as written, or [`LockRequest::name`],
//! default `"manual"`; never the formatted key) and the label `mode`
//! (`"write"`, `"read"` or `"semaphore"`):
//! `distributed_lock_acquired_total` (fresh acquisitions, not reentries),
//! `distributed_lock_busy_total` (gave up busy: `Timeout`, skipped),
//! `distributed_lock_lost_total` (holds lost while held),
//! `distributed_lock_acquire_seconds` (request to guard, waiting
//! included), `distributed_lock_held_seconds` (acquisition to release) and
//! the gauge `distributed_lock_held_locks` (locks this process holds now).
//! Each is described (help text and unit) to the recorder installed when a
//! client is built: install the recorder first.
//!
//! # axum
//! With the `axum` feature, `LockError` implements
//! `axum::response::IntoResponse`: `Timeout` is 503 with `Retry-After` (at
//! least 1 s, about as long as the call waited); `Lost` is 503 too (the
//! work lost its exclusivity midway and was stopped: nothing is wrong with
//! the request, so not a 409, and an idempotent handler may be retried);
//! `Closed` is 503 (this instance is shutting down: another can serve the
//! request); `MaxHoldReached` and anything else are 500. The body is
//! `{"error": "lock_busy" | "lock_lost" | "lock_closed" | "lock_max_hold" |
//! "lock_unavailable", "key", "message"}`.
//!
//! ```ignore
//! // features = ["axum"]
//! #[derive(Clone)]
//! struct App { locks: LockClient }
//!
//! #[distributed_lock(key = "order:{id}", wait = "2s", client = app.locks)]
//! async fn pay(State(app): State<App>, Path(id): Path<u64>) -> Result<String, LockError> {
//!     // … charge once, with lock_runtime::current_fence() …
//!     Ok("paid".into())
//! }
//! let app = Router::new().route("/pay/{id}", post(pay)).with_state(App { locks });
//! ```
//!
//! `examples/src/bin/axum-service.rs` runs it, with a lazy connect and
//! `close` after the graceful shutdown.
//!
//! # Tracing
//! Every request runs in a `lock.acquire` span (`key`, `lock` the template,
//! `mode` (`write`, `read` or `semaphore`), `wait_ms` the wait it has (its
//! own, else the client's), then `outcome` and `fence`), and a body under [`LockRequest::run`] (the
//! attribute) in a `lock.hold` span: a slow request's trace shows the time
//! it waited for its lock and the time it held it. Both are DEBUG while
//! nothing notable happens; once a request starts to wait, or a hold is
//! lost, an INFO span of the same name and fields (following from the
//! first) takes over for the rest, so at INFO a trace shows exactly the
//! waits and the losses.
#![deny(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod backend;
mod builder;
mod claims;
mod client;
mod close;
mod error;
mod glob;
mod global;
mod guard;
mod hold;
mod info;
mod io;
mod key;
mod metrics;
mod on_lost;
mod operations;
mod own_keys;
mod protocol;
mod request;
#[cfg(feature = "axum")]
mod response;
mod run;
mod scope;
mod scripts;
mod shutdown;
mod slots;
mod spans;
mod wakeups;
mod watchdog;

#[doc(hidden)]
#[allow(missing_docs)]
#[path = "private.rs"]
pub mod __private;

/// The client's decisions without I/O, for the protocol model
/// (`lock-model`). Not public API: names here may change in any release.
#[doc(hidden)]
pub mod __protocol {
    pub use crate::protocol::*;
}

pub use backend::memory::MemoryControl;
pub use builder::LockClientBuilder;
pub use client::LockClient;
pub use error::{BackendError, LockError};
pub use global::{client, close_global, init, with_client};
pub use guard::LockGuard;
pub use info::{LockInfo, LockMode};
/// ```
/// use lock_runtime::{distributed_lock, LockClient, LockError};
///
/// #[distributed_lock(key = "order:{id}", lease = "30s", wait = "5s")]
/// async fn pay(id: u64) -> Result<u64, LockError> {
///     // Runs only under the lock; its token is this body's.
///     Ok(lock_runtime::current_fence().expect("held"))
/// }
///
/// #[distributed_lock(key = "job:report", wait = "0s", on_busy = "skip")]
/// async fn report() -> Result<u32, LockError> {
///     Ok(1)
/// }
///
/// // A semaphore: at most 2 bodies at once for the key.
/// #[distributed_lock(key = "render:{tenant}", permits = 2, wait = "0s")]
/// async fn render(tenant: u64) -> Result<usize, LockError> {
///     let info = lock_runtime::client()?.inspect(format!("render:{tenant}")).await?;
///     Ok(info.map_or(0, |i| i.holders.len()))
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), LockError> {
/// lock_runtime::init(LockClient::memory())?;
/// assert!(pay(42).await? > 0);
/// let other = lock_runtime::client()?.lock("job:report").await?;
/// assert_eq!(report().await?, 0); // busy: skipped, u32::default()
/// other.release().await?;
/// assert_eq!(report().await?, 1);
///
/// let first = lock_runtime::client()?.semaphore("render:7", 2).await?;
/// assert_eq!(render(7).await?, 2); // beside `first`
/// let second = lock_runtime::client()?.semaphore("render:7", 2).await?;
/// assert!(matches!(render(7).await, Err(LockError::Timeout { .. }))); // both permits taken
/// # drop((first, second));
/// # Ok(()) }
/// ```
pub use lock_macros::distributed_lock;
pub use on_lost::OnLost;
pub use request::LockRequest;
#[doc(hidden)]
pub use run::{LockResult, SkipResult};
pub use scope::{current_fence, current_fences};

/// The README's Rust blocks, compiled (and, where they need no Redis, run)
/// as doctests, so that what a new user copies cannot drift from the API.
/// (`lock-runtime/README.md` links to the workspace's; the package holds
/// the file there, so the path is the same in both.)
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
mod readme_doctests {}

#[cfg(test)]
mod readme {
    /// The README's feature list is the one generated from Cargo.toml (the
    /// crate docs include it directly), so neither can drift.
    #[test]
    fn the_readme_lists_the_features_of_cargo_toml() {
        let generated = document_features::document_features!();
        let readme = include_str!("../README.md");
        assert!(
            readme.contains(generated),
            "README.md's feature list differs from Cargo.toml's; paste this under \"Cargo features\":\n{generated}"
        );
    }
}
