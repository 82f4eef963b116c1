//! One Redis server: the lock protocol over one connection, and grants and
//! wake-ups over one subscription connection.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::runtime::Handle;

use super::fault::Fault;
use super::node::{NodeSettings, RedisNode, Wake};
use super::pubsub::Subscriber;
use super::{Acquired, Queue, Released, Renewal, Renewed, Seen};
use crate::key::LockName;
use crate::wakeups::Waiter;

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
    ) -> impl Future<Output = Result<(Waiter, bool), Fault>> + Send;
    fn waiting(&self, name: &LockName) -> usize;
}

impl Releases for Subscriber {
    async fn subscribe(
        &self,
        name: &LockName,
        owner: Option<&Arc<str>>,
    ) -> Result<(Waiter, bool), Fault> {
        Subscriber::subscribe(self, name, owner).await
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
    ) -> Result<Self, Fault> {
        let subscriber = Subscriber::new(url, settings.clone(), io)?;
        let node = RedisNode::connect(url, settings).await?;
        Ok(RedisBackend { node, subscriber })
    }

    /// [`connect`](Self::connect) without I/O: the connections open on
    /// first use. Inside the client's I/O runtime.
    pub(crate) fn connect_lazy(
        url: &str,
        settings: NodeSettings,
        io: Handle,
    ) -> Result<Self, Fault> {
        let subscriber = Subscriber::new(url, settings.clone(), io)?;
        let node = RedisNode::connect_lazy(url, settings)?;
        Ok(RedisBackend { node, subscriber })
    }
}

impl<S: Releases> RedisBackend<S> {
    pub(crate) async fn acquire(
        &self,
        name: &LockName,
        owner: &Arc<str>,
        lease: Duration,
        queue: Queue,
    ) -> Result<Acquired, Fault> {
        self.node.acquire(name, owner, lease, None, queue).await
    }

    pub(crate) async fn release(
        &self,
        name: &LockName,
        owner: &Arc<str>,
    ) -> Result<Released, Fault> {
        self.node.release(name, owner, Wake::IfReleased).await
    }

    pub(crate) async fn renew(&self, batch: Vec<Renewal>) -> Vec<Renewed> {
        self.node.renew(&batch).await
    }

    pub(crate) async fn keep(
        &self,
        name: &LockName,
        owner: &Arc<str>,
        left: Duration,
    ) -> Result<Released, Fault> {
        self.node.keep(name, owner, left).await
    }

    pub(crate) async fn subscribe(
        &self,
        name: &LockName,
        owner: &Arc<str>,
    ) -> Result<(Waiter, bool), Fault> {
        self.subscriber.subscribe(name, Some(owner)).await
    }

    pub(crate) async fn still_queued(
        &self,
        name: &LockName,
        owner: &Arc<str>,
    ) -> Result<bool, Fault> {
        self.node.still_queued(name, owner).await
    }

    pub(crate) fn waiting(&self, name: &LockName) -> usize {
        self.subscriber.waiting(name)
    }

    pub(crate) async fn inspect(&self, name: &LockName) -> Result<Seen, Fault> {
        self.node.inspect(name).await
    }

    pub(crate) async fn force_release(&self, name: &LockName) -> Result<Vec<String>, Fault> {
        self.node.force_release(name, Wake::IfReleased).await
    }

    pub(crate) async fn force_release_if(
        &self,
        name: &LockName,
        holder: &str,
    ) -> Result<bool, Fault> {
        self.node
            .force_release_if(name, holder, Wake::IfReleased)
            .await
    }

    pub(crate) async fn scan(&self, pattern: &str) -> Result<Vec<String>, Fault> {
        self.node.scan(pattern).await
    }
}
