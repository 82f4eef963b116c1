use std::time::Duration;

/// Why a lock could not be taken, kept, or released.
///
/// Annotated functions turn it into their own error type with `From`, so an
/// `impl From<LockError> for AppError` is all a service needs.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LockError {
    /// An annotated fn ran before [`init`](crate::init).
    #[error("no lock client: call lock_runtime::init(LockClient::connect(..).await?) at start-up")]
    NotInitialized,

    /// [`init`](crate::init) was called twice.
    #[error("lock_runtime::init was already called; the global client can be set only once")]
    AlreadyInitialized,

    /// Someone else held the lock for the whole `wait`.
    #[error("lock `{key}` is held by another holder; gave up after waiting {waited:?} (raise `wait` to queue longer)")]
    Timeout {
        /// The user's key.
        key: String,
        /// How long this call waited.
        waited: Duration,
    },

    /// The lock expired or was taken away while held; the protected work may
    /// have overlapped with another holder.
    #[error("lock `{key}` was lost while held (lease expired or the lock was deleted); its work is no longer exclusive")]
    Lost {
        /// The user's key.
        key: String,
    },

    /// The hold reached its `max_hold`: renewals stopped on purpose, and
    /// the body (under `on_lost = "abort"`) was stopped. Nothing failed in
    /// Redis; the body ran longer than it was allowed to.
    #[error("lock `{key}` was held for its max_hold of {max_hold:?}: renewals stopped and the hold ended (the body ran longer than allowed; raise `max_hold` or find what keeps it busy)")]
    MaxHoldReached {
        /// The user's key.
        key: String,
        /// The `max_hold` that was reached.
        max_hold: Duration,
    },

    /// A task holding the read lock on `key` asked for its write lock.
    /// Refused at once: waiting for the other readers to leave would
    /// deadlock with any of them doing the same. Take the write lock from
    /// the start, or release the read lock first.
    #[error("lock `{key}` is read-held in this scope: a read lock cannot be upgraded to a write lock (take the write lock from the start)")]
    UpgradeRefused {
        /// The user's key.
        key: String,
    },

    /// The key cannot name a lock.
    #[error("invalid lock key `{key}`: {reason}")]
    InvalidKey {
        /// The key as given.
        key: String,
        /// What is wrong with it.
        reason: String,
    },

    /// The client was closed ([`LockClient::close`](crate::LockClient::close)):
    /// it takes no new locks. The process is shutting down; another
    /// instance can take the work.
    #[error("the lock client was closed (LockClient::close): it takes no new locks while this process shuts down")]
    Closed,

    /// A constructor or builder got settings it cannot use.
    #[error("invalid lock client configuration: {0}")]
    Config(String),

    /// Redis could not be reached or answered with an error.
    #[error("lock backend failed: {0}")]
    Backend(#[source] BackendError),
}

/// The failure underneath [`LockError::Backend`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BackendError {
    /// The Redis client reported an error.
    #[error("{context}: {source}")]
    Redis {
        /// What was being done.
        context: String,
        /// The client's error.
        #[source]
        source: redis::RedisError,
    },
    /// No answer within the operation timeout.
    #[error("{context}: no answer within {after:?} (is Redis reachable?)")]
    Timeout {
        /// What was being done.
        context: String,
        /// The timeout that fired.
        after: Duration,
    },
    /// Anything else, described.
    #[error("{0}")]
    Other(String),
    /// The client's I/O thread has stopped.
    #[error("the lock client was shut down")]
    Shutdown,
}

impl LockError {
    pub(crate) fn other(message: impl Into<String>) -> Self {
        LockError::Backend(BackendError::Other(message.into()))
    }

    pub(crate) fn shutdown() -> Self {
        LockError::Backend(BackendError::Shutdown)
    }
}
