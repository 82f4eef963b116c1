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
use std::time::Duration;

use tokio::runtime::Handle;

use super::redis::{NodeSettings, RedisNode};
use super::subscribers::AnySubscriber;
use super::{Acquired, Backend, BoxFuture, Released, Renewal, Renewed};
use crate::key::LockName;
use crate::wakeups::Waiter;
use crate::LockError;

pub(crate) struct ClusterBackend {
    node: RedisNode,
    subscriber: AnySubscriber,
}

impl ClusterBackend {
    pub(crate) async fn connect(
        urls: Vec<String>,
        settings: NodeSettings,
        io: Handle,
    ) -> Result<Self, LockError> {
        let subscriber = AnySubscriber::new(&urls, settings.clone(), io, settings.op_timeout)?;
        let node = RedisNode::cluster(&urls, settings).await?;
        Ok(ClusterBackend { node, subscriber })
    }
}

impl Backend for ClusterBackend {
    fn acquire(
        &self,
        name: &LockName,
        owner: &Arc<str>,
        lease: Duration,
    ) -> BoxFuture<Result<Acquired, LockError>> {
        let (node, name, owner) = (self.node.clone(), name.clone(), owner.clone());
        Box::pin(async move { node.acquire(&name, &owner, lease).await })
    }

    fn release(&self, name: &LockName, owner: &Arc<str>) -> BoxFuture<Result<Released, LockError>> {
        let (node, name, owner) = (self.node.clone(), name.clone(), owner.clone());
        Box::pin(async move { node.release(&name, &owner).await })
    }

    fn renew(&self, batch: Vec<Renewal>) -> BoxFuture<Vec<Renewed>> {
        let node = self.node.clone();
        Box::pin(async move { node.renew(&batch).await })
    }

    fn subscribe(&self, name: &LockName) -> BoxFuture<Result<Waiter, LockError>> {
        self.subscriber.subscribe(&name.channel)
    }

    fn waiting(&self, name: &LockName) -> usize {
        self.subscriber.waiting(&name.channel)
    }
}
