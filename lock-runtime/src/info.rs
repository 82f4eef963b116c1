//! What an operator sees of one lock: [`LockInfo`], from
//! [`LockClient::inspect`](crate::LockClient::inspect).

use std::fmt;
use std::time::Duration;

/// How a key is held: by one writer, shared by readers, or as a semaphore
/// by up to `permits` holders.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LockMode {
    /// Shared by one or more readers ([`LockClient::read_lock`](crate::LockClient::read_lock)).
    Read,
    /// Held by one writer ([`LockClient::lock`](crate::LockClient::lock)),
    /// or by nobody while waiters queue.
    Write,
    /// Held by up to `permits` holders at once, each with its own permit
    /// ([`LockClient::semaphore`](crate::LockClient::semaphore)). `permits`
    /// is the largest that a holder's request gave (two versions of a
    /// service may disagree on it, and each keeps its own limit).
    Semaphore {
        /// How many holders the semaphore admits.
        permits: u32,
    },
}

impl fmt::Display for LockMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LockMode::Read => f.write_str("read"),
            LockMode::Write => f.write_str("write"),
            LockMode::Semaphore { permits } => write!(f, "semaphore({permits})"),
        }
    }
}

/// One lock as the deployment holds it at the moment it was read: who holds
/// it, for how much longer, and how many wait behind them.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), lock_runtime::LockError> {
/// use lock_runtime::{LockClient, LockMode};
///
/// let client = LockClient::memory();
/// let guard = client.lock("order:42").await?;
/// let info = client.inspect("order:42").await?.expect("held");
/// assert_eq!(info.mode, LockMode::Write);
/// assert_eq!(info.holders, [guard.holder()]);
/// assert_eq!(info.fence, Some(guard.fence()));
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockInfo {
    /// The key as the user gave it (without the client's prefix).
    pub key: String,
    /// Read-held or written; [`Write`](LockMode::Write) when nobody holds
    /// it and only waiters are left.
    pub mode: LockMode,
    /// Holder ids ([`LockGuard::holder`](crate::LockGuard::holder)): one
    /// writer, or every reader whose own lease has not ended. Empty when
    /// only waiters are left (the holder's lease ran out, and they have not
    /// asked again yet). A holder id starts with its client's
    /// [`id`](crate::LockClient::id).
    pub holders: Vec<String>,
    /// The lease left (for readers: the longest of theirs); `None` when
    /// nobody holds it.
    pub ttl: Option<Duration>,
    /// Waiters queued behind the holders, of every client, still within
    /// their wait. Redlock waiters do not queue in Redis: always 0 there.
    pub waiters: usize,
    /// The fencing token of the current hold: the last one handed out for
    /// this key (readers share theirs). `None` when nobody holds it, or the
    /// hold has no token (`fence = false`): tokens come from a counter
    /// shared by every key of the hash slot, and nothing of a free key is
    /// kept.
    pub fence: Option<u64>,
}
