//! Hearing of grants and releases: one RESP3 subscription connection per
//! server, one subscription per lock channel however many tasks of the
//! client wait there, and the messages routed to those tasks.

use std::sync::{Arc, Weak};
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{ConnectionInfo, ProtocolVersion, PushInfo, PushKind, Value};
use tokio::runtime::Handle;

use super::endpoint;
use super::fault::Fault;
use super::node::NodeSettings;
use crate::claims::{Grant, Stamp};
use crate::key::{client_of, LockName};
use crate::wakeups::{Waiter, Wakeups};

/// Release wake-ups from one Redis server, one subscription per waited-on
/// lock, shared by all waiters of the client.
pub(crate) struct Subscriber {
    inner: Arc<SubInner>,
}

struct SubInner {
    client: redis::Client,
    settings: NodeSettings,
    wakeups: Arc<Wakeups>,
    conn: tokio::sync::OnceCell<ConnectionManager>,
    /// Orders SUBSCRIBE/UNSUBSCRIBE so a late UNSUBSCRIBE never undoes a
    /// newer SUBSCRIBE of the same channel.
    gate: tokio::sync::Mutex<()>,
    io: Handle,
}

impl Subscriber {
    pub(crate) fn new(url: &str, settings: NodeSettings, io: Handle) -> Result<Self, Fault> {
        Self::new_to(endpoint::info(url)?, settings, io)
    }

    /// [`new`](Self::new) for a server given by its settings.
    pub(crate) fn new_to(
        info: ConnectionInfo,
        settings: NodeSettings,
        io: Handle,
    ) -> Result<Self, Fault> {
        let resp3 = info
            .redis_settings()
            .clone()
            .set_protocol(ProtocolVersion::RESP3);
        let client = endpoint::client(info.set_redis_settings(resp3), &settings.access)?;
        let inner = Arc::new_cyclic(|weak: &Weak<SubInner>| {
            let weak = weak.clone();
            let on_idle: crate::wakeups::OnIdle = Arc::new(move |channel: Arc<str>| {
                if let Some(inner) = weak.upgrade() {
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
            SubInner {
                client,
                settings,
                wakeups: Arc::new(Wakeups::new(Some(on_idle))),
                conn: tokio::sync::OnceCell::new(),
                gate: tokio::sync::Mutex::new(()),
                io,
            }
        });
        Ok(Subscriber { inner })
    }

    pub(crate) fn waiting(&self, name: &LockName) -> usize {
        self.inner.wakeups.waiting(name)
    }

    /// This server is no longer where releases are published (a Sentinel
    /// failover moved the primary): wake every waiter, and have each
    /// subscribe again elsewhere.
    pub(crate) fn retire(&self) {
        self.inner.wakeups.retire();
    }

    /// Subscribe (if this client does not yet listen) and return a waiter,
    /// with whether this subscribed afresh. With `owner`, the waiter hears
    /// that owner's grant on its client's grant channel; without, the
    /// lock's releases.
    pub(crate) async fn subscribe(
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
}

impl SubInner {
    async fn conn(&self) -> Result<ConnectionManager, Fault> {
        let wakeups = self.wakeups.clone();
        self.conn
            .get_or_try_init(|| async {
                let push = move |info: PushInfo| {
                    match info.kind {
                        PushKind::Message => heard(&wakeups, &info.data),
                        // Messages may have been missed: let every waiter retry.
                        PushKind::Disconnection => wakeups.disconnected(),
                        // Subscribed again after a reconnect: a release
                        // published in between was missed, so one waiter
                        // retries now rather than at its fallback.
                        PushKind::Subscribe => {
                            if let Some(Value::BulkString(ch)) = info.data.first() {
                                if let Ok(ch) = std::str::from_utf8(ch) {
                                    wakeups.resubscribed(ch);
                                }
                            }
                        }
                        _ => {}
                    }
                    Ok::<(), ()>(())
                };
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(self.settings.connect_timeout))
                    .set_response_timeout(Some(self.settings.op_timeout))
                    .set_number_of_retries(2)
                    .set_min_delay(Duration::from_millis(50))
                    .set_max_delay(Duration::from_millis(500))
                    .set_push_sender(push)
                    .set_automatic_resubscription();
                let addr = self.client.get_connection_info().addr().to_string();
                let budget = self.settings.connect_timeout + self.settings.op_timeout;
                tokio::time::timeout(
                    budget,
                    ConnectionManager::new_with_config(self.client.clone(), config),
                )
                .await
                .map_err(|_| Fault::timed_out(format!("subscribing on Redis at {addr}"), budget))?
                .map_err(|e| Fault::redis(format!("subscribing on Redis at {addr}"), e))
            })
            .await
            .cloned()
    }

    async fn subscribe(&self, channel: &Arc<str>) -> Result<(), Fault> {
        let mut conn = self.conn().await?;
        let what = "subscribing to lock releases";
        subscribe_gated(
            &self.wakeups,
            &self.gate,
            channel,
            self.settings.op_timeout,
            what,
            conn.subscribe(&**channel),
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
            conn.unsubscribe(&*channel),
        )
        .await;
    }
}

/// Send a (S)SUBSCRIBE for `channel` under `gate`, which orders it after
/// any UNSUBSCRIBE of the same channel, and mark the channel listened on
/// once Redis confirms within `timeout`. `send` is not polled before the
/// gate is taken.
pub(crate) async fn subscribe_gated(
    wakeups: &Wakeups,
    gate: &tokio::sync::Mutex<()>,
    channel: &str,
    timeout: Duration,
    what: &str,
    send: impl std::future::Future<Output = redis::RedisResult<()>>,
) -> Result<(), Fault> {
    let _gate = gate.lock().await;
    let pending = wakeups.subscribing(channel);
    match tokio::time::timeout(timeout, send).await {
        Ok(Ok(())) => {
            pending.confirmed();
            Ok(())
        }
        Ok(Err(e)) => Err(Fault::redis(what, e)),
        Err(_) => Err(Fault::timed_out(what, timeout)),
    }
}

/// Send a (S)UNSUBSCRIBE for `channel` under `gate`, if nobody waits there
/// any more (a waiter may have joined since the channel went idle).
pub(crate) async fn unsubscribe_if_idle(
    wakeups: &Wakeups,
    gate: &tokio::sync::Mutex<()>,
    channel: &str,
    timeout: Duration,
    send: impl std::future::Future<Output = redis::RedisResult<()>>,
) {
    let _gate = gate.lock().await;
    if wakeups.remove_if_idle(channel) {
        let _ = tokio::time::timeout(timeout, send).await;
    }
}

/// A message on a lock channel: a grant (`<owner> <token> <server ms>`) on
/// a grant channel, an empty wake-up on a release channel.
pub(crate) fn heard(wakeups: &Arc<Wakeups>, data: &[Value]) {
    let (Some(Value::BulkString(ch)), Some(Value::BulkString(msg))) = (data.first(), data.get(1))
    else {
        return;
    };
    let Ok(ch) = std::str::from_utf8(ch) else {
        return;
    };
    if msg.is_empty() {
        wakeups.notify(ch);
        return;
    }
    let Ok(msg) = std::str::from_utf8(msg) else {
        return;
    };
    let mut parts = msg.split(' ');
    let (Some(owner), Some(fence), Some(at)) = (parts.next(), parts.next(), parts.next()) else {
        return;
    };
    let (Ok(fence), Ok(at)) = (fence.parse::<u64>(), at.parse::<u64>()) else {
        return;
    };
    wakeups.granted(
        ch,
        owner,
        Grant {
            fence,
            at: Stamp::ServerMs(at, tokio::time::Instant::now()),
        },
    );
}
