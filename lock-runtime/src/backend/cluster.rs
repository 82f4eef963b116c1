//! Redis Cluster: the lock scripts routed by key over a cluster connection.
//!
//! A lock's hash, fence counter and channel share the hash tag `{key}`, so
//! every script touches one slot on one primary. The cluster connection
//! follows MOVED/ASK and, after a failover, the promoted replica. Wake-ups
//! come from a plain subscription on any node: a cluster broadcasts PUBLISH
//! to all of them.
//!
//! Replication is asynchronous: a lock granted by a primary that dies before
//! its replica copied it is gone once the replica takes over. Another client
//! can then take the lock while the first still believes it holds it, until
//! the first one's next renewal (at most a third of the lease later, plus the
//! failover time) finds the lock missing and reports it lost.

use std::sync::Arc;

use tokio::runtime::Handle;

use super::redis::{NodeSettings, RedisBackend, RedisNode, Releases};
use super::subscribers::AnySubscriber;
use super::BoxFuture;
use crate::wakeups::Waiter;
use crate::LockError;

/// A cluster is driven like one server: the cluster connection routes each
/// script by its key.
pub(crate) type ClusterBackend = RedisBackend<AnySubscriber>;

pub(crate) async fn connect(
    urls: Vec<String>,
    settings: NodeSettings,
    io: Handle,
) -> Result<ClusterBackend, LockError> {
    let subscriber = AnySubscriber::new(&urls, settings.clone(), io, settings.op_timeout)?;
    let node = RedisNode::cluster(&urls, settings).await?;
    Ok(RedisBackend { node, subscriber })
}

impl Releases for AnySubscriber {
    fn subscribe(&self, channel: &Arc<str>) -> BoxFuture<Result<Waiter, LockError>> {
        AnySubscriber::subscribe(self, channel)
    }

    fn waiting(&self, channel: &str) -> usize {
        AnySubscriber::waiting(self, channel)
    }
}
