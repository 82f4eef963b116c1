//! One Redis server: the lock protocol over one connection, and grants and
//! wake-ups over one subscription connection.

use std::sync::Arc;
use std::time::Duration;

use tokio::runtime::Handle;

use super::node::{NodeSettings, RedisNode, Wake};
use super::pubsub::Subscriber;
use super::{Acquired, BoxFuture, Queue, Released, Renewal, Renewed};
use crate::key::LockName;
use crate::wakeups::Waiter;
use crate::LockError;

/// A single Redis server.
pub(crate) struct RedisBackend<S = Subscriber> {
    pub(crate) node: RedisNode,
    pub(crate) subscriber: S,
}

/// Where a node backend hears of releases: one server's channel, or any
/// node of a cluster.
pub(crate) trait Releases: Send + Sync + 'static {
    fn subscribe(
        &self,
        name: &LockName,
        owner: Option<&Arc<str>>,
    ) -> BoxFuture<Result<(Waiter, bool), LockError>>;
    fn waiting(&self, name: &LockName) -> usize;
}

impl Releases for Subscriber {
    fn subscribe(
        &self,
        name: &LockName,
        owner: Option<&Arc<str>>,
    ) -> BoxFuture<Result<(Waiter, bool), LockError>> {
        Subscriber::subscribe(self, name, owner)
    }

    fn waiting(&self, name: &LockName) -> usize {
        Subscriber::waiting(self, name)
    }
}

impl RedisBackend {
    pub(crate) async fn connect(
        url: &str,
        settings: NodeSettings,
        io: Handle,
    ) -> Result<Self, LockError> {
        let subscriber = Subscriber::new(url, settings.clone(), io)?;
        let node = RedisNode::connect(url, settings).await?;
        Ok(RedisBackend { node, subscriber })
    }
}

impl<S: Releases> RedisBackend<S> {
    pub(crate) fn acquire(
        &self,
        name: &LockName,
        owner: &Arc<str>,
        lease: Duration,
        queue: Queue,
    ) -> BoxFuture<Result<Acquired, LockError>> {
        let (node, name, owner) = (self.node.clone(), name.clone(), owner.clone());
        Box::pin(async move { node.acquire(&name, &owner, lease, None, queue).await })
    }

    pub(crate) fn release(
        &self,
        name: &LockName,
        owner: &Arc<str>,
    ) -> BoxFuture<Result<Released, LockError>> {
        let (node, name, owner) = (self.node.clone(), name.clone(), owner.clone());
        Box::pin(async move { node.release(&name, &owner, Wake::IfReleased).await })
    }

    pub(crate) fn renew(&self, batch: Vec<Renewal>) -> BoxFuture<Vec<Renewed>> {
        let node = self.node.clone();
        Box::pin(async move { node.renew(&batch).await })
    }

    pub(crate) fn subscribe(
        &self,
        name: &LockName,
        owner: &Arc<str>,
    ) -> BoxFuture<Result<(Waiter, bool), LockError>> {
        self.subscriber.subscribe(name, Some(owner))
    }

    pub(crate) fn still_queued(
        &self,
        name: &LockName,
        owner: &Arc<str>,
    ) -> BoxFuture<Result<bool, LockError>> {
        let (node, name, owner) = (self.node.clone(), name.clone(), owner.clone());
        Box::pin(async move { node.still_queued(&name, &owner).await })
    }

    pub(crate) fn waiting(&self, name: &LockName) -> usize {
        self.subscriber.waiting(name)
    }
}
