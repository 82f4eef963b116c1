//! Hearing of grants and releases: one subscription per lock channel
//! however many tasks of the client wait there, and the messages routed to
//! those tasks.
//!
//! Subscriptions go over RESP3 connections that, like commands, run where
//! the waiters are (`runtimes.rs`): a channel is subscribed over the
//! connection of the runtime whose waiter first needed it, driven by that
//! runtime, so its grant messages wake waiters there without a hop to
//! another thread. Waiters off any runtime's worker threads use the I/O
//! thread's. A runtime's connection goes with the runtime; the channels
//! heard there then wake their other waiters, who subscribe again on
//! theirs. So per server a client holds one subscription connection per
//! live runtime whose tasks waited, plus the I/O thread's once used.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{ConnectionInfo, ProtocolVersion, PushInfo, PushKind, Value};
use tokio::runtime::{Handle, Id};
use tokio::sync::oneshot;

use super::endpoint;
use super::fault::Fault;
use super::node::NodeSettings;
use crate::claims::{Grant, Stamp};
use crate::io::{self, Route};
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
    /// The I/O thread's connection.
    home: Arc<Line>,
    /// The connections of runtimes whose tasks wait, by runtime.
    runtimes: Mutex<HashMap<Id, Arc<Line>>>,
    /// Numbers the connections (the I/O thread's is 0).
    lines: AtomicU64,
    io: Handle,
}

/// One subscription connection, and the runtime that drives it.
struct Line {
    id: u64,
    handle: Handle,
    conn: tokio::sync::OnceCell<ConnectionManager>,
    /// Orders SUBSCRIBE/UNSUBSCRIBE so a late UNSUBSCRIBE never undoes a
    /// newer SUBSCRIBE of the same channel.
    gate: tokio::sync::Mutex<()>,
    /// Its runtime shut down.
    gone: AtomicBool,
    /// Dropped with this: ends the task that watches the runtime.
    _watching: Option<oneshot::Sender<()>>,
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
                home: Arc::new(Line {
                    id: 0,
                    handle: io.clone(),
                    conn: tokio::sync::OnceCell::new(),
                    gate: tokio::sync::Mutex::new(()),
                    gone: AtomicBool::new(false),
                    _watching: None,
                }),
                runtimes: Mutex::new(HashMap::new()),
                lines: AtomicU64::new(1),
                io,
            }
        });
        Ok(Subscriber { inner })
    }

    pub(crate) fn waiting(&self, name: &LockName) -> usize {
        let w = &self.inner.wakeups;
        w.waiters(&name.channel()) + w.waiters_under(&name.grants())
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
            let line = self.inner.line();
            let inner = &self.inner;
            io::in_runtime(&line.handle, line.subscribe(inner, &channel)).await?;
        }
        Ok((waiter, needs))
    }
}

impl SubInner {
    /// The connection for a waiter here: its runtime's (see [`Route`]), or
    /// the I/O thread's.
    fn line(self: &Arc<Self>) -> Arc<Line> {
        let caller = io::route(|r| match r? {
            Route::Caller(h) => Some(h.clone()),
            Route::Behind(_) => None,
        });
        let Some(caller) = caller else {
            return self.home.clone();
        };
        let mut runtimes = self.runtimes.lock().unwrap();
        if let Some(line) = runtimes.get(&caller.id()) {
            return line.clone();
        }
        let (watching, ended) = oneshot::channel();
        let line = Arc::new(Line {
            id: self.lines.fetch_add(1, Ordering::Relaxed),
            handle: caller.clone(),
            conn: tokio::sync::OnceCell::new(),
            gate: tokio::sync::Mutex::new(()),
            gone: AtomicBool::new(false),
            _watching: Some(watching),
        });
        runtimes.insert(caller.id(), line.clone());
        drop(runtimes);
        // Dropped when the runtime shuts down (at once if it already is),
        // or ends when the line is dropped.
        let watch = Watch {
            inner: Arc::downgrade(self),
            line: Arc::downgrade(&line),
            runtime: caller.id(),
        };
        caller.spawn(async move {
            let _watch = watch;
            let _ = ended.await;
        });
        if line.gone.load(Ordering::Acquire) {
            return self.home.clone();
        }
        line
    }

    /// The line with this number, unless it went with its runtime.
    fn line_numbered(&self, id: u64) -> Option<Arc<Line>> {
        if id == 0 {
            return Some(self.home.clone());
        }
        self.runtimes
            .lock()
            .unwrap()
            .values()
            .find(|l| l.id == id)
            .cloned()
    }

    /// Unsubscribe `channel` if nobody waits there any more, on the
    /// connection it is heard on, from that connection's own runtime (a
    /// connection is only ever polled where it is driven: a runtime's
    /// timers cannot be polled from elsewhere once it is gone).
    async fn unsubscribe(self: Arc<Self>, channel: Arc<str>) {
        let Some(on) = self.wakeups.listened_on(&channel) else {
            return;
        };
        let Some(line) = self.line_numbered(on) else {
            // Gone with its runtime, and its subscriptions with it.
            self.wakeups.remove_if_idle_on(&channel, on);
            return;
        };
        if line.id == 0 {
            line.unsubscribe(&self, &channel).await;
            return;
        }
        // Dropped unrun if that runtime is shutting down: its connection
        // goes with it.
        let handle = line.handle.clone();
        handle.spawn(async move { line.unsubscribe(&self, &channel).await });
    }
}

impl Line {
    async fn conn(&self, inner: &SubInner) -> Result<ConnectionManager, Fault> {
        let wakeups = inner.wakeups.clone();
        let line = self.id;
        self.conn
            .get_or_try_init(|| async {
                let push = move |info: PushInfo| {
                    match info.kind {
                        PushKind::Message => heard(&wakeups, &info.data),
                        // Messages may have been missed: let every waiter retry.
                        PushKind::Disconnection => wakeups.disconnected_on(line, false),
                        // Subscribed again after a reconnect: a release
                        // published in between was missed, so one waiter
                        // retries now rather than at its fallback.
                        PushKind::Subscribe => {
                            if let Some(Value::BulkString(ch)) = info.data.first() {
                                if let Ok(ch) = std::str::from_utf8(ch) {
                                    wakeups.resubscribed_on(ch, line);
                                }
                            }
                        }
                        _ => {}
                    }
                    Ok::<(), ()>(())
                };
                let settings = &inner.settings;
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(settings.connect_timeout))
                    .set_response_timeout(Some(settings.op_timeout))
                    .set_number_of_retries(2)
                    .set_min_delay(Duration::from_millis(50))
                    .set_max_delay(Duration::from_millis(500))
                    .set_push_sender(push)
                    .set_automatic_resubscription();
                let addr = inner.client.get_connection_info().addr().to_string();
                let budget = settings.connect_timeout + settings.op_timeout;
                tokio::time::timeout(
                    budget,
                    ConnectionManager::new_with_config(inner.client.clone(), config),
                )
                .await
                .map_err(|_| Fault::timed_out(format!("subscribing on Redis at {addr}"), budget))?
                .map_err(|e| Fault::redis(format!("subscribing on Redis at {addr}"), e))
            })
            .await
            .cloned()
    }

    async fn subscribe(&self, inner: &SubInner, channel: &Arc<str>) -> Result<(), Fault> {
        let mut conn = self.conn(inner).await?;
        let what = "subscribing to lock releases";
        subscribe_gated(
            &inner.wakeups,
            &self.gate,
            channel,
            self.id,
            inner.settings.op_timeout,
            what,
            conn.subscribe(&**channel),
        )
        .await
    }

    async fn unsubscribe(&self, inner: &SubInner, channel: &str) {
        let Ok(mut conn) = self.conn(inner).await else {
            return;
        };
        unsubscribe_if_idle(
            &inner.wakeups,
            &self.gate,
            channel,
            self.id,
            inner.settings.op_timeout,
            conn.unsubscribe(channel),
        )
        .await
    }
}

/// Lives as a task on a runtime that has a subscription connection:
/// dropped, that runtime is shutting down.
struct Watch {
    inner: Weak<SubInner>,
    line: Weak<Line>,
    runtime: Id,
}

impl Drop for Watch {
    fn drop(&mut self) {
        let (Some(inner), Some(line)) = (self.inner.upgrade(), self.line.upgrade()) else {
            return;
        };
        line.gone.store(true, Ordering::Release);
        {
            let mut runtimes = inner.runtimes.lock().unwrap();
            if runtimes
                .get(&self.runtime)
                .is_some_and(|l| Arc::ptr_eq(l, &line))
            {
                runtimes.remove(&self.runtime);
            }
        }
        // Its waiters are gone; waiters elsewhere on its channels listen
        // again on their own.
        inner.wakeups.disconnected_on(line.id, true);
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
    line: u64,
    timeout: Duration,
    what: &str,
    send: impl std::future::Future<Output = redis::RedisResult<()>>,
) -> Result<(), Fault> {
    let _gate = gate.lock().await;
    let pending = wakeups.subscribing_on(channel, line);
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
/// any more (a waiter may have joined since the channel went idle) and it
/// was last listened on at connection `line` (else it moved, and its own
/// idle moment unsubscribes it there).
pub(crate) async fn unsubscribe_if_idle(
    wakeups: &Wakeups,
    gate: &tokio::sync::Mutex<()>,
    channel: &str,
    line: u64,
    timeout: Duration,
    send: impl std::future::Future<Output = redis::RedisResult<()>>,
) {
    let _gate = gate.lock().await;
    if wakeups.remove_if_idle_on(channel, line) {
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
