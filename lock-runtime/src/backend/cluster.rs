//! Redis Cluster: the lock scripts routed by key over a cluster connection.
//!
//! A lock's key, fence counter, queue and channels share the hash tag
//! `{key}`, so every script touches one slot on one primary. The cluster
//! connection follows MOVED/ASK and, after a failover, the promoted
//! replica. Grants travel on sharded pub/sub (`SPUBLISH` inside the release
//! script, `SSUBSCRIBE` here): the message stays in the lock's shard, and
//! the publish count tells the release whether the waiter's client listens.
//!
//! Replication is asynchronous: a lock granted by a primary that dies before
//! its replica copied it is gone once the replica takes over. Another client
//! can then take the lock while the first still believes it holds it, until
//! the first one's next renewal (at most a third of the lease later, plus the
//! failover time) finds the lock missing and reports it lost.

use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{ProtocolVersion, PushInfo, PushKind, Value};
use tokio::runtime::Handle;
use tokio::time::Instant;

use super::endpoint;
use super::fault::Fault;
use super::node::{NodeSettings, RedisNode, Wake};
use super::pubsub::{heard, subscribe_gated, unsubscribe_if_idle};
use super::redis::{RedisBackend, Releases};
use super::Released;
use crate::key::{client_of, LockName};
use crate::wakeups::{Waiter, Wakeups};

/// A cluster is driven like one server: the cluster connection routes each
/// script by its key.
pub(crate) type ClusterBackend = RedisBackend<ShardSubscriber>;

/// The ends of a hold, which wait out a slot on the move (`TRYAGAIN` for as
/// long as the slot's keys are split between two nodes) until the lock
/// would expire by itself at `until`, instead of failing after one
/// operation timeout and leaving the lock to its lease. Without an `until`
/// (an undo of an attempt, a grant nobody claims), until the lock's own
/// expiry, read from the server once a move is met.
impl ClusterBackend {
    pub(crate) async fn release_until(
        &self,
        name: &LockName,
        owner: &str,
        until: Option<Instant>,
    ) -> Result<Released, Fault> {
        let until = match until {
            Some(until) => until,
            None => match self.node.release(name, owner, Wake::IfReleased).await {
                Err(e) if e.is_slot_moving() => self.expiry(name).await.ok_or(e)?,
                other => return other,
            },
        };
        let node = self.node.riding_out_moves(until);
        node.release(name, owner, Wake::IfReleased).await
    }

    pub(crate) async fn release_writer_until(
        &self,
        name: &LockName,
        owner: &str,
        fence: u64,
        until: Option<Instant>,
    ) -> Result<Released, Fault> {
        let until = match until {
            Some(until) => until,
            None => match self.node.release_writer(name, owner, fence).await {
                Err(e) if e.is_slot_moving() => self.expiry(name).await.ok_or(e)?,
                other => return other,
            },
        };
        let node = self.node.riding_out_moves(until);
        node.release_writer(name, owner, fence).await
    }

    /// When the lock `name` expires by itself, as its node says (a single
    /// key: answered mid-move too); `None` if it has no expiry or cannot be
    /// read.
    async fn expiry(&self, name: &LockName) -> Option<Instant> {
        let mut pttl = redis::cmd("PTTL");
        pttl.arg(&*name.hash);
        let asked = Instant::now();
        let left: i64 = self
            .node
            .command(pttl, "reading a lock's expiry")
            .await
            .ok()?;
        (left > 0).then(|| asked + Duration::from_millis(left as u64))
    }

    pub(crate) async fn keep_until(
        &self,
        name: &LockName,
        owner: &str,
        left: Duration,
        until: Instant,
    ) -> Result<Released, Fault> {
        self.node
            .riding_out_moves(until)
            .keep(name, owner, left)
            .await
    }
}

pub(crate) async fn connect(
    urls: Vec<String>,
    settings: NodeSettings,
    io: Handle,
) -> Result<ClusterBackend, Fault> {
    let subscriber = ShardSubscriber::new(&urls, settings.clone(), io)?;
    let node = connect_node(&urls, settings).await?;
    Ok(RedisBackend { node, subscriber })
}

/// Connect to a Redis Cluster through any of its nodes, for the lock
/// scripts. Scripts are not preloaded: a node that lacks one gets it by EVAL
/// on first use.
///
/// The connection sends each command once (`retries(0)`): it still
/// reconnects and refreshes its slot map on its own, but a command whose
/// connection broke, or that met `MOVED`, `TRYAGAIN` or `CLUSTERDOWN`,
/// comes back to `node.rs`, which sends it again knowing it may have run
/// (and follows an `ASK` itself). So a release that finds its lock absent
/// on its only send was not preceded by one of its own: the lock vanished.
async fn connect_node(urls: &[String], settings: NodeSettings) -> Result<RedisNode, Fault> {
    let seeds = endpoint::shown(urls);
    let client = endpoint::cluster(urls, &settings.access)?
        .connection_timeout(settings.connect_timeout)
        .response_timeout(settings.op_timeout)
        .retries(0)
        .min_retry_wait(50)
        .max_retry_wait(500)
        .build()
        .map_err(|e| Fault::Config(format!("bad Redis Cluster nodes `{seeds}`: {e}")))?;
    // Connecting (slot map included) and a first PING share one budget.
    let budget = settings.connect_timeout + settings.op_timeout;
    let what = format!("connecting to Redis Cluster via {seeds}");
    let connect = async {
        let mut conn = client
            .get_async_connection()
            .await
            .map_err(|e| Fault::redis(what.clone(), e))?;
        redis::cmd("PING")
            .query_async::<String>(&mut conn)
            .await
            .map_err(|e| Fault::redis(what.clone(), e))?;
        Ok::<_, Fault>(conn)
    };
    let conn = tokio::time::timeout(budget, connect)
        .await
        .map_err(|_| Fault::timed_out(what.clone(), budget))??;
    let node = RedisNode::on_cluster(conn, format!("cluster({seeds})").into(), settings);
    let native = node.find_native_delete().await;
    Ok(node.with_native_delete(native))
}

/// Grants for this client's waiters, over one RESP3 cluster connection
/// that subscribes each grant channel on its shard's primary.
pub(crate) struct ShardSubscriber {
    inner: Arc<Inner>,
}

struct Inner {
    client: ClusterClient,
    settings: NodeSettings,
    wakeups: Arc<Wakeups>,
    conn: tokio::sync::OnceCell<ClusterConnection>,
    gate: tokio::sync::Mutex<()>,
    io: Handle,
}

impl ShardSubscriber {
    fn new(urls: &[String], settings: NodeSettings, io: Handle) -> Result<Self, Fault> {
        let me: Arc<OnceLock<Weak<Inner>>> = Arc::default();
        let found = me.clone();
        let on_idle: crate::wakeups::OnIdle = Arc::new(move |channel: Arc<str>| {
            if let Some(inner) = found.get().and_then(Weak::upgrade) {
                let io = inner.io.clone();
                io.spawn(async move {
                    // Kept a moment: a client that waits on this lock
                    // often stays subscribed, and its next waiter hears
                    // grants from the first attempt on.
                    tokio::time::sleep(super::LINGER).await;
                    inner.unsubscribe(channel).await
                });
            }
        });
        let wakeups = Arc::new(Wakeups::new(Some(on_idle)));
        let pushed = wakeups.clone();
        let push = move |info: PushInfo| {
            match info.kind {
                PushKind::SMessage | PushKind::Message => heard(&pushed, &info.data),
                // Messages may have been missed: let every waiter check.
                PushKind::Disconnection => pushed.disconnected(),
                PushKind::SSubscribe => {
                    if let Some(Value::BulkString(ch)) = info.data.first() {
                        if let Ok(ch) = std::str::from_utf8(ch) {
                            pushed.resubscribed(ch);
                        }
                    }
                }
                // Ours go only for channels nobody waits on; one the server
                // ends by itself (its slot moved) has waiters to move.
                PushKind::SUnsubscribe => {
                    if let Some(Value::BulkString(ch)) = info.data.first() {
                        if let Ok(ch) = std::str::from_utf8(ch) {
                            if pushed.waiters(ch) > 0 {
                                pushed.dropped_by_server(ch);
                            }
                        }
                    }
                }
                _ => {}
            }
            Ok::<(), ()>(())
        };
        let seeds = endpoint::shown(urls);
        let client = endpoint::cluster(urls, &settings.access)?
            .connection_timeout(settings.connect_timeout)
            .response_timeout(settings.op_timeout)
            .retries(3)
            .min_retry_wait(50)
            .max_retry_wait(500)
            .use_protocol(ProtocolVersion::RESP3)
            .push_sender(push)
            .build()
            .map_err(|e| Fault::Config(format!("bad Redis Cluster nodes `{seeds}`: {e}")))?;
        let inner = Arc::new(Inner {
            client,
            settings,
            wakeups,
            conn: tokio::sync::OnceCell::new(),
            gate: tokio::sync::Mutex::new(()),
            io,
        });
        let _ = me.set(Arc::downgrade(&inner));
        Ok(ShardSubscriber { inner })
    }
}

impl Inner {
    async fn conn(&self) -> Result<ClusterConnection, Fault> {
        self.conn
            .get_or_try_init(|| async {
                let budget = self.settings.connect_timeout + self.settings.op_timeout;
                tokio::time::timeout(budget, self.client.get_async_connection())
                    .await
                    .map_err(|_| Fault::timed_out("subscribing on Redis Cluster", budget))?
                    .map_err(|e| Fault::redis("subscribing on Redis Cluster", e))
            })
            .await
            .cloned()
    }

    async fn subscribe(&self, channel: &Arc<str>) -> Result<(), Fault> {
        let mut conn = self.conn().await?;
        let what = "subscribing to lock grants";
        subscribe_gated(
            &self.wakeups,
            &self.gate,
            channel,
            self.settings.op_timeout,
            what,
            conn.ssubscribe(&**channel),
        )
        .await
    }

    async fn unsubscribe(&self, channel: Arc<str>) {
        let Ok(mut conn) = self.conn().await else {
            return;
        };
        unsubscribe_if_idle(
            &self.wakeups,
            &self.gate,
            &channel,
            self.settings.op_timeout,
            conn.sunsubscribe(&*channel),
        )
        .await;
    }
}

impl Releases for ShardSubscriber {
    async fn subscribe(
        &self,
        name: &LockName,
        owner: Option<&Arc<str>>,
    ) -> Result<(Waiter, bool), Fault> {
        let channel = match owner {
            Some(o) => name.grant_channel(client_of(o)),
            None => name.channel(),
        };
        let (waiter, needs) = self.inner.wakeups.join(&channel, owner);
        if needs {
            self.inner.subscribe(&channel).await?;
        }
        Ok((waiter, needs))
    }

    fn waiting(&self, name: &LockName) -> usize {
        self.inner.wakeups.waiting(name)
    }
}
