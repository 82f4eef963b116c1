//! What goes wrong below the backend seam.
//!
//! Backends say more than the public error does: whether a command may have
//! run (so a retry must reuse its owner id) and whether trying again can
//! help. The acquire loop and the release paths decide with that, and turn
//! a fault into [`LockError`] once, where the answer leaves for the caller.

use std::fmt;
use std::time::Duration;

use crate::error::BackendError;
use crate::LockError;

#[derive(Debug)]
pub(crate) enum Fault {
    /// The Redis client reported an error.
    Redis {
        context: String,
        source: redis::RedisError,
    },
    /// No answer within the operation timeout: the command may have run.
    Timeout { context: String, after: Duration },
    /// Anything else, described: an unexpected reply, no quorum.
    Other(String),
    /// The deployment answered but cannot serve the command now: too few
    /// replicas confirmed it, or its primary is down while the sentinels
    /// still answer (a failover under way). Whatever it took was taken
    /// back; trying again may succeed while the call has wait left.
    Unavailable(String),
    /// The lock was taken under the attempt's owner id, but too few
    /// replicas acknowledged it (Sentinel with `replica_acks`), so it was
    /// given back under that id (`released`: that release was answered).
    /// The backend remembers the id as released and sends the release
    /// again after a failover, so the id is spent: the request goes on
    /// under a new one. Trying again may succeed.
    GivenBack { message: String, released: bool },
    /// Settings the backend cannot use (a bad URL, too few nodes).
    Config(String),
    /// A database engine's error (PostgreSQL), already described: whether
    /// the statement may have run, and whether trying again may help.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    Sql {
        context: String,
        message: String,
        may_have_run: bool,
        transient: bool,
    },
}

impl Fault {
    pub(crate) fn redis(context: impl Into<String>, source: redis::RedisError) -> Self {
        Fault::Redis {
            context: context.into(),
            source,
        }
    }

    pub(crate) fn timed_out(context: impl Into<String>, after: Duration) -> Self {
        Fault::Timeout {
            context: context.into(),
            after,
        }
    }

    pub(crate) fn other(message: impl Into<String>) -> Self {
        Fault::Other(message.into())
    }

    pub(crate) fn unavailable(message: impl Into<String>) -> Self {
        Fault::Unavailable(message.into())
    }

    /// Whether trying again may succeed: no answer, a broken connection, or
    /// a failover or slot move in progress. A script error or a bad setting
    /// is the same on every try.
    pub(crate) fn is_transient(&self) -> bool {
        match self {
            Fault::Redis { source, .. } => transient(source),
            Fault::Timeout { .. }
            | Fault::Other(_)
            | Fault::Unavailable(_)
            | Fault::GivenBack { .. } => true,
            Fault::Config(_) => false,
            Fault::Sql { transient, .. } => *transient,
        }
    }

    /// Whether the deployment was reached: the command may have run, or a
    /// server (or the sentinels) answered, if only to say "not now"
    /// (`READONLY`, `LOADING`, a slot on the move, too few replicas). A
    /// call then tries again for as long as its wait lasts; one that
    /// reached nothing ends sooner (see `protocol/acquiring.rs`).
    pub(crate) fn reached(&self) -> bool {
        match self {
            Fault::Redis { source, .. } => self.may_have_run() || source.code().is_some(),
            Fault::Timeout { .. } | Fault::Unavailable(_) | Fault::GivenBack { .. } => true,
            Fault::Other(_) | Fault::Config(_) => false,
            // A server's error reply (not a broken or refused connection).
            Fault::Sql {
                may_have_run,
                transient,
                ..
            } => *may_have_run || !*transient,
        }
    }

    /// Whether a Redis Cluster answered that the command's slot is on the
    /// move (see [`slot_moving`]): the node was reached, and the command
    /// did not run.
    pub(crate) fn is_slot_moving(&self) -> bool {
        matches!(self, Fault::Redis { source, .. } if slot_moving(source))
    }

    /// Whether the command behind this fault may have run on Redis: its
    /// connection broke after it was (maybe) sent, or no answer came in
    /// time. A refused connection or a cluster with no connection to the
    /// node never sent it.
    pub(crate) fn may_have_run(&self) -> bool {
        match self {
            Fault::Redis { source, .. } => {
                (source.is_io_error() || source.is_connection_dropped() || source.is_timeout())
                    && !source.is_connection_refusal()
            }
            Fault::Timeout { .. } => true,
            // (The acquire ran; what it took stays until its release lands.)
            Fault::GivenBack { released, .. } => !released,
            Fault::Other(_) | Fault::Unavailable(_) | Fault::Config(_) => false,
            Fault::Sql { may_have_run, .. } => *may_have_run,
        }
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Fault::Redis { context, source } => write!(f, "{context}: {source}"),
            Fault::Timeout { context, after } => {
                write!(
                    f,
                    "{context}: no answer within {after:?} (is Redis reachable?)"
                )
            }
            Fault::Other(m) | Fault::Unavailable(m) | Fault::GivenBack { message: m, .. } => {
                f.write_str(m)
            }
            Fault::Config(m) => write!(f, "invalid lock client configuration: {m}"),
            Fault::Sql {
                context, message, ..
            } => write!(f, "{context}: {message}"),
        }
    }
}

impl From<Fault> for LockError {
    fn from(fault: Fault) -> Self {
        match fault {
            Fault::Redis { context, source } => {
                LockError::Backend(BackendError::Redis { context, source })
            }
            Fault::Timeout { context, after } => {
                LockError::Backend(BackendError::Timeout { context, after })
            }
            Fault::Other(m) | Fault::Unavailable(m) | Fault::GivenBack { message: m, .. } => {
                LockError::Backend(BackendError::Other(m))
            }
            Fault::Config(m) => LockError::Config(m),
            Fault::Sql {
                context, message, ..
            } => LockError::Backend(BackendError::Other(format!("{context}: {message}"))),
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

/// The command's slot is on the move: `TRYAGAIN` (its keys are split
/// between the two nodes), `ASK` or `MOVED` (the scripts' cluster
/// connection sends each command once and hands these back: `node.rs`
/// follows them, see `cluster.rs`), or a script that met a key a migration
/// already moved (Redis checks every key a script touches against the
/// slot's move). The first three never ran the command; the lock scripts
/// declare every key they touch, so Redis refuses them whole before they
/// start. It passes once the migration is through, however long that takes.
pub(crate) fn slot_moving(e: &redis::RedisError) -> bool {
    use redis::{ErrorKind, ServerErrorKind};
    matches!(
        e.kind(),
        ErrorKind::Server(
            ServerErrorKind::TryAgain | ServerErrorKind::Ask | ServerErrorKind::Moved
        )
    ) || matches!(e.code(), Some("TRYAGAIN" | "ASK" | "MOVED"))
        || e.to_string().contains("non local key")
}

/// A Redis error that a later try may not see: a server loading, busy
/// with a script, out of memory (keys expire), demoted or short of
/// replicas in a failover.
fn transient(e: &redis::RedisError) -> bool {
    use redis::{ErrorKind, ServerErrorKind};
    slot_moving(e)
        || connection_broke(e)
        || e.is_timeout()
        || matches!(
            e.kind(),
            ErrorKind::Server(ServerErrorKind::TryAgain | ServerErrorKind::ClusterDown)
        )
        || matches!(
            e.code(),
            Some(
                "TRYAGAIN"
                    | "CLUSTERDOWN"
                    | "LOADING"
                    | "MASTERDOWN"
                    | "READONLY"
                    | "BUSY"
                    | "OOM"
                    | "NOREPLICAS"
            )
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server's error reply, as the client sees it.
    fn answered(reply: &str) -> Fault {
        let value = redis::parse_redis_value(format!("-{reply}\r\n").as_bytes()).unwrap();
        Fault::redis("a lock script", value.extract_error().unwrap_err())
    }

    #[test]
    fn a_slot_on_the_move_did_not_run_and_passes() {
        for reply in [
            "TRYAGAIN Multiple keys request during rehashing of slot",
            "ASK 3999 127.0.0.1:7002",
            "MOVED 3999 127.0.0.1:7002",
            "ERR Script attempted to access a non local key in a cluster node",
        ] {
            let f = answered(reply);
            assert!(f.is_slot_moving(), "{reply}");
            assert!(f.is_transient(), "{reply}");
            assert!(!f.may_have_run(), "{reply}");
            assert!(f.reached(), "{reply}");
        }
        for reply in ["CLUSTERDOWN The cluster is down", "ERR unknown command"] {
            assert!(!answered(reply).is_slot_moving(), "{reply}");
        }
    }

    /// A server that answers "not now" was reached: the call that met it
    /// keeps its whole wait. A refused connection reached nothing.
    #[test]
    fn an_answer_that_says_not_now_reached_the_deployment() {
        for reply in [
            "READONLY You can't write against a read only replica.",
            "LOADING Redis is loading the dataset in memory",
            "BUSY Redis is busy running a script.",
            "OOM command not allowed when used memory > 'maxmemory'.",
        ] {
            let f = answered(reply);
            assert!(f.reached() && !f.may_have_run(), "{reply}");
        }
        assert!(Fault::unavailable("too few replicas").reached());
        assert!(Fault::unavailable("too few replicas").is_transient());
        let refused =
            redis::RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        assert!(!Fault::redis("connecting", refused).reached());
        assert!(!Fault::other("no quorum").reached());
    }
}
