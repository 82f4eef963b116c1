//! One Redis server (or one Redis Cluster): the lock scripts over a
//! self-healing connection, and the release wake-ups over a RESP3
//! subscription. Every Redis-speaking backend is built from these two parts.

use std::sync::{Arc, Weak};
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, FromRedisValue, Pipeline, ProtocolVersion, PushInfo, PushKind, Value};
use tokio::runtime::Handle;

use super::{Acquired, Backend, BoxFuture, Queue, Queued, Released, Renewal, Renewed};
use crate::error::BackendError;
use crate::key::LockName;
use crate::scripts::{self, Script};
use crate::wakeups::{Grant, Stamp, Waiter, Wakeups};
use crate::LockError;

/// Renewals per EVALSHA: keeps one script call short enough not to stall
/// Redis while still sending a whole tick in one pipelined round trip.
const RENEW_CHUNK: usize = 500;

/// First pause before a command is sent again after its connection broke
/// (the connection manager is reconnecting) or a cluster slot was busy;
/// doubled up to `MAX_RETRY_PAUSE`.
const RETRY_PAUSE: Duration = Duration::from_millis(10);
const MAX_RETRY_PAUSE: Duration = Duration::from_millis(200);

/// Errors after which the same command is sent again at once: the
/// connection broke (it is being re-established), or the cluster is moving
/// a slot or failing over. Timeouts are not: they used the time up.
fn retry_at_once(e: &redis::RedisError) -> bool {
    use redis::{ErrorKind, ServerErrorKind};
    crate::error::connection_broke(e)
        || matches!(
            e.kind(),
            ErrorKind::Server(ServerErrorKind::TryAgain | ServerErrorKind::ClusterDown)
        )
        || matches!(e.code(), Some("TRYAGAIN" | "CLUSTERDOWN" | "LOADING"))
}

/// How a client talks to each Redis server.
#[derive(Debug, Clone)]
pub(crate) struct NodeSettings {
    pub(crate) op_timeout: Duration,
    pub(crate) connect_timeout: Duration,
}

/// A connection that runs the lock scripts: to one Redis server, or to a
/// Redis Cluster (commands routed by key, following MOVED/ASK and failovers).
#[derive(Clone)]
pub(crate) struct RedisNode {
    conn: Conn,
    pub(crate) addr: Arc<str>,
    settings: NodeSettings,
}

#[derive(Clone)]
enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

fn open(url: &str) -> Result<redis::Client, LockError> {
    redis::Client::open(url).map_err(|e| LockError::Config(format!("bad Redis URL `{url}`: {e}")))
}

async fn send<T: FromRedisValue>(
    q: &Query,
    conn: &mut impl ConnectionLike,
) -> redis::RedisResult<T> {
    match q {
        Query::Cmd(c) => c.query_async::<T>(conn).await,
        Query::Pipe(p) => p.query_async::<T>(conn).await,
    }
}

impl RedisNode {
    /// Connect, check the server answers, and load the scripts. Must run on
    /// the client's I/O runtime: reconnects are spawned where it was made.
    pub(crate) async fn connect(url: &str, settings: NodeSettings) -> Result<Self, LockError> {
        let client = open(url)?;
        let addr: Arc<str> = client.get_connection_info().addr().to_string().into();
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(settings.connect_timeout))
            .set_response_timeout(Some(settings.op_timeout))
            .set_number_of_retries(2)
            .set_min_delay(Duration::from_millis(50))
            .set_max_delay(Duration::from_millis(500));
        let budget = settings.connect_timeout + settings.op_timeout;
        let conn = tokio::time::timeout(
            budget,
            ConnectionManager::new_with_config(client.clone(), config),
        )
        .await
        .map_err(|_| LockError::timed_out(format!("connecting to Redis at {addr}"), budget))?
        .map_err(|e| LockError::redis(format!("connecting to Redis at {addr}"), e))?;
        let node = RedisNode {
            conn: Conn::Single(conn),
            addr,
            settings,
        };
        node.load_scripts().await?;
        node.warn_if_evicting().await;
        Ok(node)
    }

    /// Eviction is the one way Redis deletes a lock or a fence counter
    /// without being asked: say so at start-up. Best effort (managed Redis
    /// often refuses `CONFIG`).
    async fn warn_if_evicting(&self) {
        let mut cmd = redis::cmd("CONFIG");
        cmd.arg("GET").arg("maxmemory-policy");
        let Ok(reply) = self
            .command::<Vec<String>>(cmd, "reading maxmemory-policy")
            .await
        else {
            return;
        };
        let Some(policy) = reply.get(1) else {
            return;
        };
        if policy.starts_with("allkeys") || policy.starts_with("volatile") {
            tracing::warn!(
                redis = %self.addr,
                policy = %policy,
                "Redis may evict keys under memory pressure: a held lock can vanish (its holder \
                 learns at the next renewal){} Use `maxmemory-policy noeviction` for lock data.",
                if policy.starts_with("allkeys") {
                    ", and a fence counter can be evicted (tokens then restart at the server clock, \
                     still above earlier ones unless the clock stepped back)."
                } else {
                    "."
                }
            );
        }
    }

    /// Connect to a Redis Cluster through any of its nodes. Scripts are not
    /// preloaded: a node that lacks one gets it by EVAL on first use.
    pub(crate) async fn cluster(
        urls: &[String],
        settings: NodeSettings,
    ) -> Result<Self, LockError> {
        let seeds = urls.join(", ");
        for url in urls {
            open(url)?;
        }
        let client = ClusterClient::builder(urls.iter().map(String::as_str))
            .connection_timeout(settings.connect_timeout)
            .response_timeout(settings.op_timeout)
            .retries(3)
            .min_retry_wait(50)
            .max_retry_wait(500)
            .build()
            .map_err(|e| LockError::Config(format!("bad Redis Cluster nodes `{seeds}`: {e}")))?;
        // Connecting (slot map included) and a first PING share one budget.
        let budget = settings.connect_timeout + settings.op_timeout;
        let what = format!("connecting to Redis Cluster via {seeds}");
        let connect = async {
            let mut conn = client
                .get_async_connection()
                .await
                .map_err(|e| LockError::redis(what.clone(), e))?;
            redis::cmd("PING")
                .query_async::<String>(&mut conn)
                .await
                .map_err(|e| LockError::redis(what.clone(), e))?;
            Ok::<_, LockError>(conn)
        };
        let conn = tokio::time::timeout(budget, connect)
            .await
            .map_err(|_| LockError::timed_out(what.clone(), budget))??;
        Ok(RedisNode {
            conn: Conn::Cluster(conn),
            addr: format!("cluster({seeds})").into(),
            settings,
        })
    }

    /// Run a plain command (WAIT, ROLE, ...).
    pub(crate) async fn command<T: FromRedisValue>(
        &self,
        cmd: Cmd,
        what: &str,
    ) -> Result<T, LockError> {
        self.query(Query::Cmd(cmd), what).await
    }

    async fn load_scripts(&self) -> Result<(), LockError> {
        let mut pipe = Pipeline::new();
        for s in scripts::ALL {
            pipe.add_command(s.load());
        }
        self.query::<Vec<String>>(pipe_cmd(pipe), "loading lock scripts")
            .await?;
        Ok(())
    }

    async fn query<T: FromRedisValue>(&self, q: Query, what: &str) -> Result<T, LockError> {
        let mut conn = self.conn.clone();
        let fut = async {
            match &mut conn {
                Conn::Single(c) => send(&q, c).await,
                Conn::Cluster(c) => send(&q, c).await,
            }
        };
        match tokio::time::timeout(self.settings.op_timeout, fut).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(LockError::redis(
                format!("{what} on Redis at {}", self.addr),
                e,
            )),
            Err(_) => Err(LockError::timed_out(
                format!("{what} on Redis at {}", self.addr),
                self.settings.op_timeout,
            )),
        }
    }

    /// EVALSHA; if Redis lost the script (restart, failover to a replica
    /// that never saw it), EVAL sends it along and caches it there.
    ///
    /// Sent again, within the operation timeout, when the connection broke
    /// under it or a cluster slot is moving (`TRYAGAIN`) or failing over
    /// (`CLUSTERDOWN`): every lock script is idempotent (owner ids are
    /// unique per acquisition, so a repeated acquire is recognised and a
    /// repeated release or renewal finds the state the first one left).
    async fn eval<T: FromRedisValue>(
        &self,
        script: &Script,
        keys: &[&str],
        args: &[&str],
    ) -> Result<T, LockError> {
        Ok(self.eval_noting_repeats(script, keys, args).await?.0)
    }

    /// [`eval`](Self::eval), and whether an earlier send may have run (its
    /// connection broke after it was sent, or no answer came).
    async fn eval_noting_repeats<T: FromRedisValue>(
        &self,
        script: &Script,
        keys: &[&str],
        args: &[&str],
    ) -> Result<(T, bool), LockError> {
        let ran_before = std::sync::atomic::AtomicBool::new(false);
        self.retrying(|| async {
            let out = self.eval_once(script, keys, args).await;
            if let Err(e) = &out {
                if crate::error::may_have_run(e) {
                    ran_before.store(true, std::sync::atomic::Ordering::Relaxed);
                }
            }
            out.map(|v| (v, ran_before.load(std::sync::atomic::Ordering::Relaxed)))
        })
        .await
    }

    /// Run `op` until it succeeds, fails for good, or the operation
    /// timeout has no room for another try.
    async fn retrying<T, F, Fut>(&self, mut op: F) -> Result<T, LockError>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, LockError>>,
    {
        let deadline = tokio::time::Instant::now() + self.settings.op_timeout;
        let mut pause = RETRY_PAUSE;
        loop {
            match op().await {
                Err(LockError::Backend(BackendError::Redis { source, .. }))
                    if retry_at_once(&source) && tokio::time::Instant::now() + pause < deadline =>
                {
                    tracing::debug!(error = %source, "Redis command failed; sending it again");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(MAX_RETRY_PAUSE);
                }
                other => return other,
            }
        }
    }

    async fn eval_once<T: FromRedisValue>(
        &self,
        script: &Script,
        keys: &[&str],
        args: &[&str],
    ) -> Result<T, LockError> {
        let what = script.name;
        match self
            .query(Query::Cmd(script.evalsha(keys, args)), what)
            .await
        {
            Err(LockError::Backend(BackendError::Redis { source, .. }))
                if scripts::is_noscript(&source) =>
            {
                self.query(Query::Cmd(script.eval(keys, args)), what).await
            }
            other => other,
        }
    }

    /// Take the lock for `owner`. `floor`: the lowest token to hand out
    /// (default: the server's clock in microseconds). `queue`: what a busy
    /// attempt does (Redlock nodes never queue; they mark the lock so that
    /// its release wakes waiters).
    pub(crate) async fn acquire(
        &self,
        name: &LockName,
        owner: &str,
        lease: Duration,
        floor: Option<u64>,
        queue: Queue,
    ) -> Result<Acquired, LockError> {
        let lease_ms = millis(lease).to_string();
        let floor = floor.map(|f| f.to_string()).unwrap_or_default();
        let stay = match (queue.stay, floor.is_empty()) {
            (None, _) => String::new(),
            (Some(_), false) => "w".to_owned(),
            (Some(stay), true) => millis(stay).to_string(),
        };
        let keys = [&*name.hash, &name.fence(), &name.queue(), &name.waiters()];
        let sent = std::sync::atomic::AtomicBool::new(false);
        let reply: Vec<i64> = self
            .retrying(|| {
                // Sent again after a send that may have run and queued this
                // owner: if this one takes the lock, it leaves the queue.
                let again = sent.swap(true, std::sync::atomic::Ordering::Relaxed);
                let rejoin = if queue.rejoin || (again && queue.stay.is_some()) {
                    "1"
                } else {
                    ""
                };
                let args = [owner, &lease_ms, &floor, &stay, rejoin];
                let keys = &keys;
                async move { self.eval_once(&scripts::ACQUIRE, keys, &args).await }
            })
            .await?;
        let (flag, n, at) = match reply[..] {
            [flag, n] => (flag, n, 0),
            [flag, n, at] => (flag, n, at),
            _ => {
                return Err(LockError::other(format!(
                    "acquire.lua on Redis at {}: unexpected reply {reply:?}",
                    self.addr
                )))
            }
        };
        Ok(match flag {
            1 => Acquired::Fresh { fence: n as u64 },
            2 => Acquired::Repeated { fence: n as u64 },
            _ => Acquired::Busy {
                ttl: (n > 0).then(|| Duration::from_millis(n as u64)),
                queued: (at > 0).then_some(Queued::At(at as u64)),
            },
        })
    }

    /// Release `owner`'s lock: hand it to the first live waiter in its
    /// queue, or delete it; an owner that only waited leaves the queue.
    /// `wake` is for Redlock, whose waiters do not queue.
    pub(crate) async fn release(
        &self,
        name: &LockName,
        owner: &str,
        wake: Wake,
    ) -> Result<Released, LockError> {
        let flag = match wake {
            Wake::IfReleased => "r",
            Wake::Always => "a",
            Wake::Never => "n",
        };
        let publish = match self.conn {
            Conn::Cluster(_) => "spublish",
            Conn::Single(_) => "publish",
        };
        let (freed, repeated): (i64, bool) = self
            .eval_noting_repeats(
                &scripts::RELEASE,
                &[&name.hash, &name.fence(), &name.queue(), &name.waiters()],
                &[owner, &name.grants(), publish, &name.channel(), flag],
            )
            .await?;
        Ok(match freed {
            1 => Released::Freed,
            // An earlier send whose reply was lost may have released it, and
            // a waiter may have taken it since: nothing here says it was
            // lost before.
            _ if repeated => Released::Freed,
            // The cluster client re-sends a command whose connection broke
            // on its own, so there an absent lock may be that too.
            0 if matches!(self.conn, Conn::Cluster(_)) => Released::Freed,
            _ => Released::NotOwner,
        })
    }

    /// Whether `owner` still waits in the lock's queue, or was handed the
    /// lock already.
    pub(crate) async fn still_queued(
        &self,
        name: &LockName,
        owner: &str,
    ) -> Result<bool, LockError> {
        // Queued, or already handed the lock (its grant message is on the
        // way: this client listened when it was published).
        let mut pipe = Pipeline::new();
        pipe.cmd("HEXISTS").arg(name.waiters()).arg(owner);
        pipe.cmd("GET").arg(&*name.hash);
        let (queued, value): (bool, Option<String>) = self
            .retrying(|| self.query(Query::Pipe(pipe.clone()), "checking the lock queue"))
            .await?;
        let holder = value.as_deref().and_then(|v| v.split(' ').next());
        Ok(queued || holder == Some(owner))
    }

    /// Raise the fence counter to at least `fence` (Redlock).
    pub(crate) async fn raise_fence(&self, name: &LockName, fence: u64) -> Result<(), LockError> {
        let fence = fence.to_string();
        let _: i64 = self
            .eval(&scripts::RAISE_FENCE, &[&name.fence()], &[&fence])
            .await?;
        Ok(())
    }

    /// Renew a batch in one pipelined round trip (one script call per lock
    /// on a cluster, where the locks live in different slots).
    pub(crate) async fn renew(&self, batch: &[Renewal]) -> Vec<Renewed> {
        if let Conn::Cluster(_) = self.conn {
            return futures_util::future::join_all(batch.iter().map(|r| self.renew_one(r))).await;
        }
        match self.retrying(|| self.renew_once(batch)).await {
            Err(LockError::Backend(BackendError::Redis { source, .. }))
                if scripts::is_noscript(&source) =>
            {
                match self
                    .query::<String>(Query::Cmd(scripts::RENEW.load()), "loading lock script")
                    .await
                {
                    Ok(_) => self.renew_once(batch).await,
                    Err(e) => Err(e),
                }
            }
            other => other,
        }
        .unwrap_or_else(|e| {
            let msg = e.to_string();
            batch
                .iter()
                .map(|_| Renewed::Failed(LockError::other(msg.clone())))
                .collect()
        })
    }

    async fn renew_one(&self, r: &Renewal) -> Renewed {
        let lease = millis(r.lease).to_string();
        match self
            .eval::<Vec<u8>>(&scripts::RENEW, &[&r.name.hash], &{
                let (front, rest) = owner_parts(&r.owner);
                [&*lease, front, rest]
            })
            .await
        {
            Ok(flags) if flags.first() == Some(&b'1') => Renewed::Yes,
            Ok(_) => Renewed::NotOwner,
            Err(e) => Renewed::Failed(e),
        }
    }

    async fn renew_once(&self, batch: &[Renewal]) -> Result<Vec<Renewed>, LockError> {
        // One EVALSHA per lease and chunk: a client's locks mostly share a
        // lease, and all share the front of their owner ids, which then
        // travel once per call instead of once per lock.
        let group_of = |i: usize| (batch[i].lease, owner_parts(&batch[i].owner).0);
        let mut order: Vec<usize> = (0..batch.len()).collect();
        if (1..batch.len()).any(|i| group_of(i) != group_of(0)) {
            order.sort_by(|&a, &b| group_of(a).cmp(&group_of(b)));
        }
        let mut pipe = Pipeline::new();
        let mut calls = 0;
        for group in order.chunk_by(|&a, &b| group_of(a) == group_of(b)) {
            let (lease, front) = group_of(group[0]);
            let lease = millis(lease).to_string();
            for chunk in group.chunks(RENEW_CHUNK) {
                let keys: Vec<&str> = chunk.iter().map(|&i| &*batch[i].name.hash).collect();
                let mut args: Vec<&str> = Vec::with_capacity(chunk.len() + 2);
                args.push(&lease);
                args.push(front);
                args.extend(chunk.iter().map(|&i| owner_parts(&batch[i].owner).1));
                pipe.add_command(scripts::RENEW.evalsha(&keys, &args));
                calls += 1;
            }
        }
        let flags: Vec<Vec<u8>> = self.query(pipe_cmd(pipe), "renewing locks").await?;
        if flags.len() != calls {
            return Err(LockError::other(format!(
                "renewing locks: {} replies to {calls} calls",
                flags.len()
            )));
        }
        let mut out: Vec<Renewed> = Vec::with_capacity(batch.len());
        out.resize_with(batch.len(), || Renewed::NotOwner);
        let mut seen = 0;
        for (&i, f) in order.iter().zip(flags.iter().flatten()) {
            if *f == b'1' {
                out[i] = Renewed::Yes;
            }
            seen += 1;
        }
        if seen != batch.len() {
            return Err(LockError::other(format!(
                "renewing locks: {seen} verdicts for {} locks",
                batch.len()
            )));
        }
        Ok(out)
    }
}

/// When a release publishes on the lock's channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wake {
    /// When it deleted the lock.
    IfReleased,
    /// Also where the lock is absent: a Redlock waiter listens on one node,
    /// which may never have had this owner's lock.
    Always,
    /// Never: taking back a partial Redlock grant frees nothing, and a
    /// wake-up would only send the waiters (this one too) round again.
    Never,
}

enum Query {
    Cmd(Cmd),
    Pipe(Pipeline),
}

fn pipe_cmd(p: Pipeline) -> Query {
    Query::Pipe(p)
}

pub(crate) fn millis(d: Duration) -> u64 {
    (d.as_millis() as u64).max(1)
}

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
    pub(crate) fn new(url: &str, settings: NodeSettings, io: Handle) -> Result<Self, LockError> {
        let client = open(url)?;
        let info = client.get_connection_info().clone();
        let resp3 = info
            .redis_settings()
            .clone()
            .set_protocol(ProtocolVersion::RESP3);
        let client = redis::Client::open(info.set_redis_settings(resp3))
            .map_err(|e| LockError::Config(format!("bad Redis URL `{url}`: {e}")))?;
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
    pub(crate) fn subscribe(
        &self,
        name: &LockName,
        owner: Option<&Arc<str>>,
    ) -> BoxFuture<Result<(Waiter, bool), LockError>> {
        let inner = self.inner.clone();
        let channel = match owner {
            Some(o) => name.grant_channel(client_of(o)),
            None => name.channel(),
        };
        let (waiter, needs) = inner.wakeups.join(&channel, owner);
        Box::pin(async move {
            if needs {
                inner.subscribe(&channel).await?;
            }
            Ok((waiter, needs))
        })
    }
}

impl SubInner {
    async fn conn(&self) -> Result<ConnectionManager, LockError> {
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
                .map_err(|_| {
                    LockError::timed_out(format!("subscribing on Redis at {addr}"), budget)
                })?
                .map_err(|e| LockError::redis(format!("subscribing on Redis at {addr}"), e))
            })
            .await
            .cloned()
    }

    async fn subscribe(&self, channel: &Arc<str>) -> Result<(), LockError> {
        let mut conn = self.conn().await?;
        let _gate = self.gate.lock().await;
        let pending = self.wakeups.subscribing(channel);
        let fut = conn.subscribe(&**channel);
        match tokio::time::timeout(self.settings.op_timeout, fut).await {
            Ok(Ok(())) => {
                pending.confirmed();
                Ok(())
            }
            Ok(Err(e)) => Err(LockError::redis("subscribing to lock releases", e)),
            Err(_) => Err(LockError::timed_out(
                "subscribing to lock releases",
                self.settings.op_timeout,
            )),
        }
    }

    async fn unsubscribe(&self, channel: Arc<str>) {
        let Ok(mut conn) = self.conn().await else {
            return;
        };
        let _gate = self.gate.lock().await;
        if self.wakeups.remove_if_idle(&channel) {
            let _ =
                tokio::time::timeout(self.settings.op_timeout, conn.unsubscribe(&*channel)).await;
        }
    }
}

/// An owner id (`<client id>:<n>`) split after its first `:`.
fn owner_parts(owner: &str) -> (&str, &str) {
    owner.split_at(owner.find(':').map_or(0, |i| i + 1))
}

/// The client id at the front of an owner id (`<client id>:<n>`).
pub(crate) fn client_of(owner: &str) -> &str {
    owner.split(':').next().unwrap_or(owner)
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

impl<S: Releases> Backend for RedisBackend<S> {
    fn acquire(
        &self,
        name: &LockName,
        owner: &Arc<str>,
        lease: Duration,
        queue: Queue,
    ) -> BoxFuture<Result<Acquired, LockError>> {
        let (node, name, owner) = (self.node.clone(), name.clone(), owner.clone());
        Box::pin(async move { node.acquire(&name, &owner, lease, None, queue).await })
    }

    fn release(&self, name: &LockName, owner: &Arc<str>) -> BoxFuture<Result<Released, LockError>> {
        let (node, name, owner) = (self.node.clone(), name.clone(), owner.clone());
        Box::pin(async move { node.release(&name, &owner, Wake::IfReleased).await })
    }

    fn renew(&self, batch: Vec<Renewal>) -> BoxFuture<Vec<Renewed>> {
        let node = self.node.clone();
        Box::pin(async move { node.renew(&batch).await })
    }

    fn subscribe(
        &self,
        name: &LockName,
        owner: &Arc<str>,
    ) -> BoxFuture<Result<(Waiter, bool), LockError>> {
        self.subscriber.subscribe(name, Some(owner))
    }

    fn still_queued(
        &self,
        name: &LockName,
        owner: &Arc<str>,
    ) -> BoxFuture<Result<bool, LockError>> {
        let (node, name, owner) = (self.node.clone(), name.clone(), owner.clone());
        Box::pin(async move { node.still_queued(&name, &owner).await })
    }

    fn waiting(&self, name: &LockName) -> usize {
        self.subscriber.waiting(name)
    }
}
