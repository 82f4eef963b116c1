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

    /// The key cannot name a lock.
    #[error("invalid lock key `{key}`: {reason}")]
    InvalidKey {
        /// The key as given.
        key: String,
        /// What is wrong with it.
        reason: String,
    },

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
    pub(crate) fn redis(context: impl Into<String>, source: redis::RedisError) -> Self {
        LockError::Backend(BackendError::Redis {
            context: context.into(),
            source,
        })
    }

    pub(crate) fn timed_out(context: impl Into<String>, after: Duration) -> Self {
        LockError::Backend(BackendError::Timeout {
            context: context.into(),
            after,
        })
    }

    pub(crate) fn other(message: impl Into<String>) -> Self {
        LockError::Backend(BackendError::Other(message.into()))
    }

    pub(crate) fn shutdown() -> Self {
        LockError::Backend(BackendError::Shutdown)
    }

    /// Whether trying again may succeed: no answer, a broken connection, or
    /// a failover or slot move in progress. A script error or a bad key is
    /// the same on every try.
    pub(crate) fn is_transient(&self) -> bool {
        match self {
            LockError::Backend(BackendError::Redis { source, .. }) => transient(source),
            LockError::Backend(BackendError::Timeout { .. } | BackendError::Other(_)) => true,
            _ => false,
        }
    }
}

/// The connection broke under the command (it may or may not have run),
/// or the cluster client has none to the node right now.
pub(crate) fn connection_broke(e: &redis::RedisError) -> bool {
    e.is_io_error()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.kind() == redis::ErrorKind::ClusterConnectionNotFound
}

/// Whether the command behind `e` may have run on Redis: its connection
/// broke after it was (maybe) sent, or no answer came in time. A refused
/// connection or a cluster with no connection to the node never sent it.
pub(crate) fn may_have_run(e: &LockError) -> bool {
    match e {
        LockError::Backend(BackendError::Redis { source, .. }) => {
            (source.is_io_error() || source.is_connection_dropped() || source.is_timeout())
                && !source.is_connection_refusal()
        }
        LockError::Backend(BackendError::Timeout { .. }) => true,
        _ => false,
    }
}

/// A Redis error that a later try may not see.
pub(crate) fn transient(e: &redis::RedisError) -> bool {
    use redis::{ErrorKind, ServerErrorKind};
    connection_broke(e)
        || e.is_timeout()
        || matches!(
            e.kind(),
            ErrorKind::Server(ServerErrorKind::TryAgain | ServerErrorKind::ClusterDown)
        )
        || matches!(
            e.code(),
            Some("TRYAGAIN" | "CLUSTERDOWN" | "LOADING" | "MASTERDOWN" | "READONLY" | "BUSY")
        )
}
