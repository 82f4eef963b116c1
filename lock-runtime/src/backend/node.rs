//! The lock protocol on one connection: the Lua scripts called by
//! EVALSHA over a self-healing connection to one Redis server or a Redis
//! Cluster, each send repeated when its connection broke (every script is
//! idempotent). Every Redis-speaking backend runs its locks through this.
//!
//! On one Redis server (also Sentinel's primary and each Redlock node), a
//! caller's commands go over a connection of the caller's own runtime
//! (`runtimes.rs`); background work, and callers outside any runtime, use
//! the connection on the client's I/O thread. A Redis Cluster keeps one
//! cluster connection, on the I/O thread.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use redis::aio::{
    ConnectionLike, ConnectionManager, ConnectionManagerConfig, MultiplexedConnection,
};
#[cfg(feature = "cluster")]
use redis::cluster_async::ClusterConnection;
use redis::{
    AsyncConnectionConfig, Cmd, ConnectionInfo, FromRedisValue, Pipeline, RedisResult, RedisWrite,
    Value,
};
use tokio::runtime::Handle;

use super::endpoint::{self, Access};
use super::fault::Fault;
use super::runtimes::{Local, Runtimes};
use super::{Acquired, Queue, Queued, Released, Renewal, Renewed};
use crate::io::{self, Route};
use crate::key::{is_reader, LockName, Mode};
use crate::scripts::{self, Arg, Script};

mod lazy;
mod operations;
mod permits;

/// Renewals per EVALSHA: keeps one script call short enough not to stall
/// Redis while still sending a whole tick in one pipelined round trip.
const RENEW_CHUNK: usize = 500;

/// First pause before a command is sent again after its connection broke
/// (the connection manager is reconnecting) or a cluster slot was busy;
/// doubled up to `MAX_RETRY_PAUSE`.
const RETRY_PAUSE: Duration = Duration::from_millis(10);
const MAX_RETRY_PAUSE: Duration = Duration::from_millis(200);

/// The least time worth giving a send.
const MIN_SEND: Duration = Duration::from_millis(20);

/// How long a send may wait for its answer: until `until`, which is `of`
/// after it was set. Made once per request; retries get what is left.
#[derive(Debug, Clone, Copy)]
struct Limit {
    until: tokio::time::Instant,
    of: Duration,
}

impl Limit {
    fn from_now(of: Duration) -> Limit {
        Limit {
            until: tokio::time::Instant::now() + of,
            of,
        }
    }
}

/// Faults after which the same command is sent again, while the operation
/// timeout lasts: the connection broke (it is being re-established), the
/// cluster is moving a slot or failing over, or a send went unanswered
/// (every lock script is idempotent, so a second send is safe).
fn resend(e: &Fault) -> bool {
    use redis::{ErrorKind, ServerErrorKind};
    match e {
        Fault::Redis { source: e, .. } => {
            super::fault::connection_broke(e)
                || super::fault::slot_moving(e)
                || e.is_timeout()
                || matches!(
                    e.kind(),
                    ErrorKind::Server(ServerErrorKind::TryAgain | ServerErrorKind::ClusterDown)
                )
                || matches!(e.code(), Some("TRYAGAIN" | "CLUSTERDOWN" | "LOADING"))
        }
        Fault::Timeout { .. } => true,
        Fault::Other(_)
        | Fault::Unavailable(_)
        | Fault::GivenBack { .. }
        | Fault::Config(_)
        | Fault::Sql { .. } => false,
    }
}

/// How a client talks to each Redis server.
#[derive(Debug, Clone)]
pub(crate) struct NodeSettings {
    pub(crate) op_timeout: Duration,
    pub(crate) connect_timeout: Duration,
    pub(crate) access: Access,
    /// How long a token counter outlives its last use.
    pub(crate) fence_ttl: Duration,
}

/// A server's own compare-and-delete, where it has one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NativeDelete {
    /// `DELIFEQ key value` (Valkey 9).
    DelIfEq,
    /// `DELEX key IFEQ value` (Redis 8.4).
    DelEx,
}

impl NativeDelete {
    fn command(self) -> &'static str {
        match self {
            NativeDelete::DelIfEq => "DELIFEQ",
            NativeDelete::DelEx => "DELEX",
        }
    }
}

/// A connection that runs the lock scripts: to one Redis server, or to a
/// Redis Cluster (commands routed by key, following MOVED/ASK and failovers).
#[derive(Clone)]
pub(crate) struct RedisNode {
    /// The I/O thread's connection.
    conn: Conn,
    /// One Redis server: the connections of the runtimes that send from
    /// their own tasks, at most one per live runtime.
    runtimes: Option<Arc<Runtimes>>,
    pub(crate) addr: Arc<str>,
    settings: NodeSettings,
    /// Found at connect: releases without a script where possible.
    native_delete: Option<NativeDelete>,
    /// `<prefix>fence`, the token counter of one server, made once for the
    /// prefix it was last asked for.
    counter: Arc<std::sync::OnceLock<(Arc<str>, Arc<str>)>>,
    /// The server refused the native delete once (a downgrade, an ACL
    /// that allows scripts only, a cluster half upgraded): scripts only.
    native_refused: Arc<std::sync::atomic::AtomicBool>,
    /// A command whose cluster slot is on the move is sent again until
    /// then, past the operation timeout (see
    /// [`riding_out_moves`](Self::riding_out_moves)).
    moves_until: Option<tokio::time::Instant>,
    /// Grants confirmed by this many replicas within this long (see
    /// [`with_acks`](Self::with_acks)).
    acks: Option<(usize, Duration)>,
}

#[derive(Clone)]
enum Conn {
    Single(ConnectionManager),
    /// One server, connected on first use (`connect_lazy`).
    Lazy(Arc<lazy::LazyManager>),
    #[cfg(feature = "cluster")]
    Cluster(ClusterConnection),
}

/// A connection a command can be sent on without boxing its future.
trait Link: ConnectionLike + Send {
    fn packed<'a>(
        &'a mut self,
        cmd: &'a Cmd,
    ) -> impl Future<Output = RedisResult<Value>> + Send + 'a;
}

impl Link for MultiplexedConnection {
    fn packed<'a>(
        &'a mut self,
        cmd: &'a Cmd,
    ) -> impl Future<Output = RedisResult<Value>> + Send + 'a {
        self.send_packed_command(cmd)
    }
}

/// Boxed (inside `redis`): the manager's own future is large, and every
/// lock operation's future would carry it inline.
impl Link for ConnectionManager {
    fn packed<'a>(
        &'a mut self,
        cmd: &'a Cmd,
    ) -> impl Future<Output = RedisResult<Value>> + Send + 'a {
        self.req_packed_command(cmd)
    }
}

#[cfg(feature = "cluster")]
impl Link for ClusterConnection {
    fn packed<'a>(
        &'a mut self,
        cmd: &'a Cmd,
    ) -> impl Future<Output = RedisResult<Value>> + Send + 'a {
        self.req_packed_command(cmd)
    }
}

async fn send<T: FromRedisValue>(q: &Query, conn: &mut impl Link) -> RedisResult<T> {
    match q {
        Query::Cmd(c) => Ok(redis::from_redis_value(
            conn.packed(c).await?.extract_error()?,
        )?),
        Query::Pipe(p) => p.query_async::<T>(conn).await,
    }
}

/// Follow a cluster's `ASK`: `q` once more, behind `ASKING`, to the node
/// it names. The cluster connection sends nothing twice by itself (see
/// `cluster.rs`), so this is its one redirect; another `ASK` or a
/// `TRYAGAIN` there goes back to the caller's loop.
#[cfg(feature = "cluster")]
async fn send_asking<T: FromRedisValue>(
    q: &Query,
    conn: &mut ClusterConnection,
    ask: &redis::RedisError,
) -> RedisResult<T> {
    use redis::cluster_routing::SingleNodeRoutingInfo;
    let Some((host, port)) = ask
        .redirect_node()
        .and_then(|(addr, _)| addr.rsplit_once(':'))
        .and_then(|(h, p)| Some((h.to_owned(), p.parse::<u16>().ok()?)))
    else {
        return Err(ask.clone());
    };
    let mut pipe = Pipeline::new();
    pipe.cmd("ASKING");
    let count = match q {
        Query::Cmd(c) => {
            pipe.add_command(c.clone());
            1
        }
        Query::Pipe(p) => {
            for c in p.cmd_iter() {
                pipe.add_command(c.clone());
            }
            p.len()
        }
    };
    let route = SingleNodeRoutingInfo::ByAddress { host, port };
    let values = conn.route_pipeline(pipe, 1, count, route).await?;
    let values = values
        .into_iter()
        .map(Value::extract_error)
        .collect::<RedisResult<Vec<Value>>>()?;
    match q {
        Query::Cmd(_) => match values.into_iter().next() {
            Some(v) => Ok(redis::from_redis_value(v)?),
            None => Err(ask.clone()),
        },
        Query::Pipe(_) => Ok(redis::from_redis_value(Value::Array(values))?),
    }
}

/// The connection is gone: the next command needs another.
fn broke(e: &redis::RedisError) -> bool {
    super::fault::connection_broke(e) || e.is_unrecoverable_error()
}

/// The I/O thread's connection: no response timeout of its own (each
/// command has its caller's), reconnecting by itself.
fn manager_config(settings: &NodeSettings) -> ConnectionManagerConfig {
    ConnectionManagerConfig::new()
        .set_connection_timeout(Some(settings.connect_timeout))
        .set_response_timeout(None)
        .set_number_of_retries(2)
        .set_min_delay(Duration::from_millis(50))
        .set_max_delay(Duration::from_millis(500))
}

/// Where an operation's commands go (see [`Route`]).
enum Via {
    Caller(Handle),
    Behind(tokio::runtime::Id),
}

impl RedisNode {
    /// Connect, check the server answers, and load the scripts. Must run on
    /// the client's I/O runtime: reconnects are spawned where it was made.
    pub(crate) async fn connect(url: &str, settings: NodeSettings) -> Result<Self, Fault> {
        Self::connect_to(endpoint::info(url)?, settings).await
    }

    /// [`connect`](Self::connect) to a server given by its settings.
    pub(crate) async fn connect_to(
        info: ConnectionInfo,
        settings: NodeSettings,
    ) -> Result<Self, Fault> {
        let client = endpoint::client(info, &settings.access)?;
        let addr: Arc<str> = client.get_connection_info().addr().to_string().into();
        let budget = settings.connect_timeout + settings.op_timeout;
        let conn = tokio::time::timeout(
            budget,
            ConnectionManager::new_with_config(client.clone(), manager_config(&settings)),
        )
        .await
        .map_err(|_| Fault::timed_out(format!("connecting to Redis at {addr}"), budget))?
        .map_err(|e| Fault::redis(format!("connecting to Redis at {addr}"), e))?;
        let mut node = Self::over(client, addr, Conn::Single(conn), settings);
        node.load_scripts().await?;
        node.native_delete = node.find_native_delete().await;
        node.warn_if_evicting().await;
        Ok(node)
    }

    /// A node that connects on its first command: nothing is sent until
    /// then (a bad URL is still an error here). Scripts are loaded by the
    /// first EVAL that finds them missing, and releases go by script (the
    /// server's own compare-and-delete is not looked for). Must be called
    /// inside the client's I/O runtime, where reconnects are spawned.
    pub(crate) fn connect_lazy(url: &str, settings: NodeSettings) -> Result<Self, Fault> {
        let client = endpoint::client(endpoint::info(url)?, &settings.access)?;
        let addr: Arc<str> = client.get_connection_info().addr().to_string().into();
        let conn = lazy::LazyManager::new(
            client.clone(),
            manager_config(&settings),
            Handle::current(),
            settings.connect_timeout + settings.op_timeout,
        );
        Ok(Self::over(
            client,
            addr,
            Conn::Lazy(Arc::new(conn)),
            settings,
        ))
    }

    /// A node over the I/O thread's connection `conn` to `client`'s server.
    fn over(client: redis::Client, addr: Arc<str>, conn: Conn, settings: NodeSettings) -> Self {
        let runtimes = Runtimes::new(
            client,
            AsyncConnectionConfig::new()
                .set_connection_timeout(Some(settings.connect_timeout))
                .set_response_timeout(None),
            settings.connect_timeout + settings.op_timeout,
        );
        RedisNode {
            conn,
            runtimes: Some(Arc::new(runtimes)),
            addr,
            settings,
            native_delete: None,
            counter: Arc::default(),
            native_refused: Arc::default(),
            moves_until: None,
            acks: None,
        }
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

    /// Whether this runs over a Redis Cluster connection.
    fn is_cluster(&self) -> bool {
        match self.conn {
            Conn::Single(_) | Conn::Lazy(_) => false,
            #[cfg(feature = "cluster")]
            Conn::Cluster(_) => true,
        }
    }

    #[cfg(feature = "cluster")]
    /// Run the protocol over a cluster connection (see `cluster.rs`,
    /// which makes it): commands are routed by key.
    pub(crate) fn on_cluster(
        conn: ClusterConnection,
        addr: Arc<str>,
        settings: NodeSettings,
    ) -> Self {
        RedisNode {
            conn: Conn::Cluster(conn),
            runtimes: None,
            addr,
            settings,
            native_delete: None,
            counter: Arc::default(),
            native_refused: Arc::default(),
            moves_until: None,
            acks: None,
        }
    }

    /// Find out, once, whether the server deletes a key if its value
    /// equals a given one by itself (newer Valkey and Redis do). A cluster
    /// is asked through any node: its nodes run one version.
    pub(crate) async fn find_native_delete(&self) -> Option<NativeDelete> {
        let mut cmd = redis::cmd("COMMAND");
        cmd.arg("INFO").arg("DELIFEQ").arg("DELEX");
        let info: Vec<redis::Value> = self
            .command(cmd, "asking for the server's commands")
            .await
            .ok()?;
        let known = |i: usize| !matches!(info.get(i), None | Some(redis::Value::Nil));
        if known(0) {
            Some(NativeDelete::DelIfEq)
        } else if known(1) {
            Some(NativeDelete::DelEx)
        } else {
            None
        }
    }

    /// This node for a release whose lock expires by itself at `until`:
    /// while the cluster says its slot is on the move (the command did not
    /// run), each send is followed by another until then, so that the
    /// release lands once the migration is through instead of leaving the
    /// lock to its lease. Any other fault still ends it within one
    /// operation timeout of the last such answer.
    #[cfg(feature = "cluster")]
    pub(crate) fn riding_out_moves(&self, until: tokio::time::Instant) -> RedisNode {
        RedisNode {
            moves_until: Some(until),
            ..self.clone()
        }
    }

    /// Use (or not) the server's own compare-and-delete (see
    /// [`find_native_delete`](Self::find_native_delete)).
    #[cfg(feature = "cluster")]
    pub(crate) fn with_native_delete(mut self, native: Option<NativeDelete>) -> Self {
        self.native_delete = native;
        self
    }

    /// This node with every acquire followed by `WAIT replicas timeout` in
    /// the same round trip (Sentinel's `replica_acks`): a grant the
    /// replicas did not confirm in time is [`Fault::Unavailable`], and the
    /// caller takes it back. A busy answer is not waited for.
    pub(crate) fn with_acks(mut self, acks: (usize, Duration)) -> Self {
        self.acks = Some(acks);
        self
    }

    /// Send one command, with this node's `WAIT` behind it in the same
    /// round trip if it has one: the reply and the replicas' count
    /// (`Some(-1)`: `WAIT` gave none; `None`: no `WAIT`).
    async fn query_acked(
        &self,
        q: &Query,
        what: &str,
        limit: Limit,
    ) -> Result<(Value, Option<i64>), Fault> {
        let (Some((replicas, wait)), Query::Cmd(cmd)) = (self.acks, q) else {
            return Ok((self.query(q, what, limit).await?, None));
        };
        let mut pipe = Pipeline::new();
        // Each reply on its own: a failed WAIT must not hide a grant.
        pipe.ignore_errors();
        pipe.add_command(cmd.clone());
        pipe.cmd("WAIT").arg(replicas).arg(millis(wait));
        let mut replies: Vec<Value> = self.query(&Query::Pipe(pipe), what, limit).await?;
        let acked = replies
            .pop()
            .and_then(|v| redis::from_redis_value::<i64>(v).ok())
            .unwrap_or(-1);
        let reply = replies.pop().unwrap_or(Value::Nil).extract_error();
        let reply =
            reply.map_err(|e| Fault::redis(format!("{what} on Redis at {}", self.addr), e))?;
        Ok((reply, Some(acked)))
    }

    /// [`eval_once`](Self::eval_once) through
    /// [`query_acked`](Self::query_acked).
    async fn eval_once_acked(
        &self,
        script: &Script,
        sha: &Query,
        keys: &[&str],
        args: &[Arg<'_>],
        limit: Limit,
    ) -> Result<(Value, Option<i64>), Fault> {
        let what = script.name;
        match self.query_acked(sha, what, limit).await {
            Err(Fault::Redis { source, .. }) if scripts::is_noscript(&source) => {
                self.query_acked(&Query::Cmd(script.eval(keys, args)), what, limit)
                    .await
            }
            other => other,
        }
    }

    /// When an acquire bounded by `by` must end here: with a `WAIT` in
    /// the same round trip, a whole operation timeout (the `WAIT`'s
    /// included) on top, even on the last attempt, as the `WAIT` had when
    /// it went apart: Redis ends a `WAIT` on its own timer, up to
    /// 1000/`hz` ms late.
    fn acquire_by(&self, by: Option<tokio::time::Instant>) -> Option<tokio::time::Instant> {
        if self.acks.is_none() {
            return by;
        }
        let now = tokio::time::Instant::now();
        by.map(|by| by.max(now) + self.settings.op_timeout)
    }

    /// `out`, unless it is a grant fewer replicas confirmed (`acked`) than
    /// this node asks for.
    fn confirmed(&self, out: Acquired, acked: Option<i64>) -> Result<Acquired, Fault> {
        let (Some(n), Some((replicas, wait))) = (acked, self.acks) else {
            return Ok(out);
        };
        if matches!(out, Acquired::Busy { .. }) || n >= replicas as i64 {
            return Ok(out);
        }
        Err(Fault::unavailable(if n < 0 {
            "WAIT gave no count of replicas".to_owned()
        } else {
            format!("only {n} confirmed within {wait:?}")
        }))
    }

    /// Run a plain command (WAIT, ROLE, ...).
    pub(crate) async fn command<T: FromRedisValue>(
        &self,
        cmd: Cmd,
        what: &str,
    ) -> Result<T, Fault> {
        let limit = Limit::from_now(self.settings.op_timeout);
        self.query(&Query::Cmd(cmd), what, limit).await
    }

    async fn load_scripts(&self) -> Result<(), Fault> {
        let mut pipe = Pipeline::new();
        for s in scripts::ALL {
            pipe.add_command(s.load());
        }
        self.query::<Vec<String>>(
            &Query::Pipe(pipe),
            "loading lock scripts",
            Limit::from_now(self.settings.op_timeout),
        )
        .await?;
        Ok(())
    }

    /// One send, answered within `limit`: the one timer of the send (the
    /// connections have no response timeout of their own).
    async fn query<T: FromRedisValue>(
        &self,
        q: &Query,
        what: &str,
        limit: Limit,
    ) -> Result<T, Fault> {
        match tokio::time::timeout_at(limit.until, self.send(q)).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(Fault::redis(format!("{what} on Redis at {}", self.addr), e)),
            Err(_) => Err(Fault::timed_out(
                format!("{what} on Redis at {}", self.addr),
                limit.of,
            )),
        }
    }

    /// Send `q` where the operation being polled goes (see [`Route`]): a
    /// caller's over its runtime's connection, an undo behind what it
    /// takes back, anything else over the I/O thread's connection.
    async fn send<T: FromRedisValue>(&self, q: &Query) -> RedisResult<T> {
        let Some(runtimes) = &self.runtimes else {
            return self.send_home(q).await;
        };
        let via = io::route(|r| match r? {
            Route::Caller(h) => Some(Via::Caller(h.clone())),
            Route::Behind(id) => Some(Via::Behind(*id)),
        });
        match via {
            Some(Via::Caller(caller)) => {
                // `None`: that runtime is shutting down.
                if let Some(picked) = runtimes.pick(&caller).await {
                    let picked = picked?;
                    if picked.local().has_ended() {
                        // An earlier command of this runtime (an attempt a
                        // Redlock undo now takes back) may still be on a
                        // connection that ended: killed first, it cannot
                        // run after this one.
                        self.kill_ended(picked.local()).await;
                    }
                    let mut conn = picked.conn.clone();
                    let out = send(q, &mut conn).await;
                    if matches!(&out, Err(e) if broke(e)) {
                        picked.broke();
                    }
                    return out;
                }
            }
            Some(Via::Behind(id)) => {
                if let Some(local) = runtimes.find(id) {
                    // Boxed: rare, and deep.
                    return Box::pin(self.send_behind(&local, q)).await;
                }
            }
            None => {}
        }
        self.send_home(q).await
    }

    /// Over the I/O thread's connection.
    async fn send_home<T: FromRedisValue>(&self, q: &Query) -> RedisResult<T> {
        match &self.conn {
            Conn::Single(c) => send(q, &mut c.clone()).await,
            Conn::Lazy(lazy) => send(q, &mut lazy.get().await?).await,
            #[cfg(feature = "cluster")]
            Conn::Cluster(c) => {
                let mut c = c.clone();
                match send(q, &mut c).await {
                    Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::Ask) => {
                        Box::pin(send_asking(q, &mut c, &e)).await
                    }
                    other => other,
                }
            }
        }
    }

    /// An undo of what a task of `local`'s runtime sent: behind it, over
    /// that runtime's connection while it drives one. A connection of that
    /// runtime that ended (with the runtime, or broken) may still have an
    /// attempt on its way to Redis: it is killed first, and Redis runs
    /// nothing more it sent; then the undo goes over the open connection,
    /// or the I/O thread's. Where Redis will not kill it (`CLIENT KILL` not
    /// allowed to this user) or cannot name it (before Redis 6.2), the undo
    /// is sent once more a moment later, behind what was still on the wire.
    async fn send_behind<T: FromRedisValue>(
        &self,
        local: &Arc<Local>,
        q: &Query,
    ) -> RedisResult<T> {
        let mut fenced = true;
        let mut stalled = false;
        let out = loop {
            fenced &= self.kill_ended(local).await;
            let Some(picked) = local.open_conn().filter(|_| !stalled) else {
                break self.send_home(q).await;
            };
            let mut conn = picked.conn.clone();
            // A runtime that lives but is not running (a current-thread
            // runtime between two `block_on`s) does not drive its
            // connection: the undo would wait there for as long as it
            // rests. Once it is seen resting, the connection is given up,
            // killed with what it carries, and the undo goes over the I/O
            // thread's. A slow connection of a running runtime (a partition)
            // keeps the undo behind its attempt.
            tokio::select! {
                out = send(q, &mut conn) => match out {
                    // Ended under it: killed at the top, then sent elsewhere.
                    Err(e) if broke(&e) => picked.broke(),
                    other => break other,
                },
                () = local.resting(self.settings.op_timeout / 4) => {
                    stalled = true;
                    picked.broke();
                }
            }
        };
        if !fenced {
            let (node, q) = (self.clone(), q.clone());
            tokio::spawn(async move {
                tokio::time::sleep(node.settings.op_timeout).await;
                let sent = node.send_home::<Value>(&q);
                let _ = tokio::time::timeout(node.settings.op_timeout, sent).await;
            });
        }
        out
    }

    /// Kill the connections of `local`'s runtime that ended: whether
    /// nothing they sent can run on Redis any more.
    async fn kill_ended(&self, local: &Local) -> bool {
        let mut all = true;
        for who in local.ended() {
            let Some(who) = who else {
                all = false;
                continue;
            };
            let mut kill = redis::cmd("CLIENT");
            kill.arg("KILL")
                .arg("ID")
                .arg(who.id)
                .arg("ADDR")
                .arg(&who.addr)
                .arg("SKIPME")
                .arg("yes");
            match self.send_home::<i64>(&Query::Cmd(kill)).await {
                Ok(_) => local.killed(&who),
                Err(e) => {
                    tracing::debug!(redis = %self.addr, error = %e, "cannot close a connection that may still carry a lock attempt; its undo is sent twice");
                    // Refused by the server (an ACL without `CLIENT
                    // KILL`): not asked again.
                    if e.code().is_some() {
                        local.unkillable(&who);
                    }
                    all = false;
                }
            }
        }
        all
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
        args: &[Arg<'_>],
    ) -> Result<T, Fault> {
        Ok(self.eval_noting_repeats(script, keys, args).await?.0)
    }

    /// [`eval`](Self::eval), and whether an earlier send may have run (its
    /// connection broke after it was sent, or no answer came).
    async fn eval_noting_repeats<T: FromRedisValue>(
        &self,
        script: &Script,
        keys: &[&str],
        args: &[Arg<'_>],
    ) -> Result<(T, bool), Fault> {
        // Made once, sent as often as it takes.
        let sha = Query::Cmd(script.evalsha(keys, args));
        let ran_before = std::sync::atomic::AtomicBool::new(false);
        let (ran_before, sha) = (&ran_before, &sha);
        self.retrying(|limit| async move {
            let out = self.eval_once(script, sha, keys, args, limit).await;
            if let Err(e) = &out {
                if e.may_have_run() {
                    ran_before.store(true, std::sync::atomic::Ordering::Relaxed);
                }
            }
            out.map(|v| (v, ran_before.load(std::sync::atomic::Ordering::Relaxed)))
        })
        .await
    }

    /// Run `op` until it succeeds, fails for good, or the operation
    /// timeout has no room for another try. `op` gets how long its send may
    /// wait for an answer.
    ///
    /// Each send may wait for its answer until the operation timeout: a
    /// slow reply that comes within it is never thrown away. No second copy
    /// goes beside an unanswered send: on a live connection it would only
    /// queue behind the first, and could run after the caller acted on the
    /// first's answer (a busy answer given up on, then the copy taking the
    /// lock for nobody). A connection that died under a send fails it, and
    /// the command goes again on the one that replaces it.
    async fn retrying<T, F, Fut>(&self, op: F) -> Result<T, Fault>
    where
        F: FnMut(Limit) -> Fut,
        Fut: std::future::Future<Output = Result<T, Fault>>,
    {
        self.retrying_by(None, op).await
    }

    /// [`retrying`](Self::retrying), ending by `by` if that comes first
    /// (a request whose server has not answered yet ends by its deadline).
    /// One deadline for the whole: every send waits at most until it, and
    /// a send that is answered sets no other timer.
    async fn retrying_by<T, F, Fut>(
        &self,
        by: Option<tokio::time::Instant>,
        mut op: F,
    ) -> Result<T, Fault>
    where
        F: FnMut(Limit) -> Fut,
        Fut: std::future::Future<Output = Result<T, Fault>>,
    {
        let now = tokio::time::Instant::now();
        let mut deadline = now + self.settings.op_timeout;
        if let Some(by) = by {
            deadline = deadline.min(by.max(now + MIN_SEND));
        }
        let mut pause = RETRY_PAUSE;
        loop {
            let limit = Limit {
                until: deadline,
                of: deadline.saturating_duration_since(tokio::time::Instant::now()),
            };
            let out = op(limit).await;
            let Err(e) = &out else {
                return out;
            };
            if !resend(e) {
                return out;
            }
            let now = tokio::time::Instant::now();
            if let Some(moves) = self.moves_until.filter(|_| e.is_slot_moving()) {
                // Answered, not run: another operation timeout, up to the
                // bound this node was given.
                deadline = deadline.max(moves.min(now + self.settings.op_timeout));
            }
            if now + pause + MIN_SEND >= deadline {
                return out;
            }
            tracing::debug!(error = %e, "Redis command failed; sending it again");
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(MAX_RETRY_PAUSE);
        }
    }

    /// One send of a script call made as `sha` (EVALSHA), by EVAL if the
    /// server lost the script.
    async fn eval_once<T: FromRedisValue>(
        &self,
        script: &Script,
        sha: &Query,
        keys: &[&str],
        args: &[Arg<'_>],
        limit: Limit,
    ) -> Result<T, Fault> {
        let what = script.name;
        match self.query(sha, what, limit).await {
            // Within what is left of the same limit.
            Err(Fault::Redis { source, .. }) if scripts::is_noscript(&source) => {
                self.query(&Query::Cmd(script.eval(keys, args)), what, limit)
                    .await
            }
            other => other,
        }
    }

    /// The token counter of `name`'s slot on this server: on one server,
    /// one name for every lock of a prefix, made once.
    fn counter(&self, name: &LockName) -> std::borrow::Cow<'_, str> {
        if !self.is_cluster() {
            let prefix = name.prefix();
            let (p, counter) = self
                .counter
                .get_or_init(|| (prefix.into(), name.counter(false).into()));
            if **p == *prefix {
                return std::borrow::Cow::Borrowed(counter);
            }
        }
        std::borrow::Cow::Owned(name.counter(self.is_cluster()))
    }

    /// The KEYS of `acquire.lua` and `release.lua`: the lock and its slot's
    /// counter; on a Cluster also the lock's queue, waiters and readers, so
    /// that a slot on the move refuses the whole call before it runs
    /// (`TRYAGAIN`) instead of stopping it at a key that already moved.
    /// (On one server, on the stack: two names that already exist.)
    fn script_keys<'a>(&'a self, name: &'a LockName) -> ScriptKeys<'a> {
        ScriptKeys {
            lock: &name.hash,
            counter: self.counter(name),
            more: self
                .is_cluster()
                .then(|| [name.queue(), name.waiters(), name.readers()]),
        }
    }

    /// Take the lock for `owner`. `floor`: the lowest token to hand out
    /// (default: the server's clock in microseconds). `queue`: what a busy
    /// attempt does (Redlock nodes never queue; they mark the lock so that
    /// its release wakes waiters, and a writer's mark keeps new readers out
    /// for as long as it would have stayed queued).
    ///
    /// A lock without a token (`fence = false`) is first tried with a bare
    /// `SET … NX PX … GET`, as cheap as a lock can be; the script runs only
    /// if that finds it busy and the attempt is to queue, or finds it this
    /// owner's already (an earlier send ran).
    pub(crate) async fn acquire(
        &self,
        name: &LockName,
        owner: &str,
        lease: Duration,
        floor: Option<u64>,
        queue: Queue,
    ) -> Result<Acquired, Fault> {
        if let Mode::Permit(_) = Mode::of(owner) {
            return self.acquire_permit(name, owner, lease, floor, queue).await;
        }
        let lease_ms = millis(lease);
        if !queue.fence && !is_reader(owner) && floor.is_none() && !queue.rejoin {
            let mut set = Cmd::with_capacity(7, name.hash.len() + owner.len() + 40);
            set.arg("SET")
                .arg(&*name.hash)
                .arg(owner)
                .arg("NX")
                .arg("PX")
                .arg(lease_ms)
                .arg("GET");
            let set = Query::Cmd(set);
            let held = self
                .retrying_by(self.acquire_by(queue.by), |limit| {
                    self.query_acked(&set, "taking a lock", limit)
                })
                .await;
            match held {
                Ok((held, acked)) => {
                    let held: Option<String> = redis::from_redis_value(held).map_err(|e| {
                        Fault::other(format!(
                            "taking a lock on Redis at {}: unexpected reply ({e})",
                            self.addr
                        ))
                    })?;
                    let Some(held) = held else {
                        return self.confirmed(Acquired::Fresh { fence: 0 }, acked);
                    };
                    let mine = held.split(' ').next() == Some(owner);
                    if !mine && queue.stay.is_none() {
                        return Ok(Acquired::Busy {
                            ttl: None,
                            queued: None,
                        });
                    }
                    // Busy and to queue, or this owner's (the script
                    // answers `Repeated` and sets the lease again).
                }
                // A semaphore's hash under the name: busy, and the script
                // says so (and queues the owner when it is to wait).
                Err(Fault::Redis { source, .. }) if source.code() == Some("WRONGTYPE") => {}
                Err(e) => return Err(e),
            }
        }
        let stay = match (queue.stay, floor.is_none()) {
            (None, _) => Arg::Str(""),
            (Some(stay), false) => Arg::Tagged('w', millis(stay)),
            (Some(stay), true) => Arg::Num(millis(stay)),
        };
        let ttl = Arg::Num(millis(self.settings.fence_ttl));
        let default_ttl = self.settings.fence_ttl == scripts::DEFAULT_FENCE_TTL;
        let keys = self.script_keys(name);
        let (keys, n) = keys.refs();
        let keys = &keys[..n];
        let sent = std::sync::atomic::AtomicBool::new(false);
        let (reply, acked) = self
            .retrying_by(self.acquire_by(queue.by), |limit| {
                // Sent again after a send that may have run and queued this
                // owner: if this one takes the lock, it leaves the queue.
                let again = sent.swap(true, std::sync::atomic::Ordering::Relaxed);
                let flags = match (queue.fence, queue.rejoin || (again && queue.stay.is_some())) {
                    (false, false) => "",
                    (true, false) => "f",
                    (false, true) => "j",
                    (true, true) => "fj",
                };
                let mut args = [
                    Arg::Str(owner),
                    Arg::Num(lease_ms),
                    stay,
                    Arg::Str(flags),
                    ttl,
                    Arg::Num(0),
                ];
                // Trailing arguments at the script's defaults stay out:
                // the server pays for each (about 2 000 instructions).
                let n = match floor {
                    Some(f) => {
                        args[5] = Arg::Num(f);
                        6
                    }
                    None if !default_ttl => 5,
                    None if flags != "f" => 4,
                    None if !matches!(stay, Arg::Str("")) => 3,
                    None => 2,
                };
                let keys = &keys;
                async move {
                    let args = &args[..n];
                    let sha = Query::Cmd(scripts::ACQUIRE.evalsha(keys, args));
                    self.eval_once_acked(&scripts::ACQUIRE, &sha, keys, args, limit)
                        .await
                }
            })
            .await?;
        self.confirmed(acquired(&reply, "acquire.lua", &self.addr)?, acked)
    }

    /// The release script's flags: how it tells waiters, and for Redlock
    /// when it wakes them.
    fn release_flags(&self, wake: Wake, forced: bool) -> &'static str {
        const FLAGS: [&str; 12] = [
            "r", "a", "n", "rf", "af", "nf", "sr", "sa", "sn", "srf", "saf", "snf",
        ];
        let wake = match wake {
            Wake::IfReleased => 0,
            Wake::Always => 1,
            Wake::Never => 2,
        };
        FLAGS[wake + 3 * usize::from(forced) + 6 * usize::from(self.is_cluster())]
    }

    /// Run the release script as `owner`: (its answer, whether an earlier
    /// send may have run). `fence`: a writer's token (0: none), for the
    /// script's first comparison: a lock holding exactly "<owner>
    /// <fence>" is deleted at once.
    pub(crate) async fn run_release(
        &self,
        name: &LockName,
        (owner, fence): (&str, Option<u64>),
        wake: Wake,
        forced: bool,
    ) -> Result<(i64, bool), Fault> {
        if let Mode::Permit(_) = Mode::of(owner) {
            return self.run_release_permit(name, owner, wake, forced).await;
        }
        let flags = self.release_flags(wake, forced);
        let ttl = millis(self.settings.fence_ttl);
        let first = match fence {
            Some(f) if f > 0 => Arg::Held(owner, f),
            _ => Arg::Str(owner),
        };
        let args = [first, Arg::Str(flags), Arg::Num(ttl)];
        // Trailing arguments at the script's defaults stay out, and so
        // does the counter where the script can name it (it needs it only
        // to hand the lock over).
        let n = if self.settings.fence_ttl != scripts::DEFAULT_FENCE_TTL {
            3
        } else if flags != "r" {
            2
        } else {
            1
        };
        let keys = self.script_keys(name);
        let (keys, mut k) = keys.refs();
        if self.is_cluster() {
            return self.run_release_moving(&keys[..k], &args[..n]).await;
        }
        if !name.prefix().contains('{') {
            k = 1;
        }
        self.eval_noting_repeats(&scripts::RELEASE, &keys[..k], &args[..n])
            .await
    }

    /// [`run_release`](Self::run_release) on a Redis Cluster. While the
    /// lock's slot is on the move, a call declaring all five keys is
    /// refused (`TRYAGAIN`) until the move ends, and the move may outlast
    /// the lease. Each such refusal is followed by the same call declaring
    /// only the lock (flag `o`), which the cluster runs on whichever node
    /// has it: a hold nobody waits behind is released at once, mid-move;
    /// anything more (a queue to hand over to, an entry to withdraw) is
    /// left untouched (`2`) for the whole call once the slot settles.
    async fn run_release_moving(
        &self,
        keys: &[&str],
        args: &[Arg<'_>],
    ) -> Result<(i64, bool), Fault> {
        let flags = match args.get(1) {
            Some(Arg::Str(f)) => format!("{f}o"),
            _ => "sro".to_owned(),
        };
        let only_args = [args[0], Arg::Str(&flags)];
        let (only_keys, only_args) = (&keys[..1], &only_args[..]);
        let full = Query::Cmd(scripts::RELEASE.evalsha(keys, args));
        let only = Query::Cmd(scripts::RELEASE.evalsha(only_keys, only_args));
        let ran = std::sync::atomic::AtomicBool::new(false);
        let (ran, full, only) = (&ran, &full, &only);
        let noted = |out: Result<i64, Fault>| {
            if matches!(&out, Err(e) if e.may_have_run()) {
                ran.store(true, std::sync::atomic::Ordering::Relaxed);
            }
            out
        };
        self.retrying(|limit| async move {
            let out = noted(
                self.eval_once(&scripts::RELEASE, full, keys, args, limit)
                    .await,
            );
            let freed = match out {
                Err(moving) if moving.is_slot_moving() => {
                    let out = self
                        .eval_once(&scripts::RELEASE, only, only_keys, only_args, limit)
                        .await;
                    match noted(out)? {
                        2 => return Err(moving),
                        freed => freed,
                    }
                }
                other => other?,
            };
            Ok((freed, ran.load(std::sync::atomic::Ordering::Relaxed)))
        })
        .await
    }

    /// Release `owner`'s lock: hand it to the first live waiter in its
    /// queue, or delete it; an owner that only waited leaves the queue.
    /// `wake` is for Redlock, whose waiters do not queue.
    pub(crate) async fn release(
        &self,
        name: &LockName,
        owner: &str,
        wake: Wake,
    ) -> Result<Released, Fault> {
        self.release_as(name, (owner, None), wake).await
    }

    /// [`release`](Self::release) of a writer's hold with token `fence`.
    async fn release_as(
        &self,
        name: &LockName,
        held: (&str, Option<u64>),
        wake: Wake,
    ) -> Result<Released, Fault> {
        let (freed, repeated) = self.run_release(name, held, wake, false).await?;
        Ok(self.released(freed, repeated))
    }

    /// What a release's answer means.
    fn released(&self, freed: i64, repeated: bool) -> Released {
        match freed {
            1 => Released::Freed,
            // An earlier send whose reply was lost may have released it, and
            // a waiter may have taken it since: nothing here says it was
            // lost before.
            _ if repeated => Released::Freed,
            // (The cluster client sends nothing twice by itself: every
            // repeat is this node's, and counted above.)
            _ => Released::NotOwner,
        }
    }

    /// Release a writer's hold that nobody is likely to wait behind: one
    /// native compare-and-delete of its exact value where the server has
    /// one (`DELIFEQ` on Valkey 9, `DELEX … IFEQ` on Redis 8.4), which
    /// deletes only an unmarked lock; the script otherwise (someone queued,
    /// the lock was handed over, or it is gone).
    pub(crate) async fn release_writer(
        &self,
        name: &LockName,
        owner: &str,
        fence: u64,
    ) -> Result<Released, Fault> {
        let refused = self
            .native_refused
            .load(std::sync::atomic::Ordering::Relaxed);
        if let Some(native) = self.native_delete.filter(|_| !refused) {
            let mut cmd = Cmd::with_capacity(4, name.hash.len() + owner.len() + 40);
            cmd.arg(native.command()).arg(&*name.hash);
            if native == NativeDelete::DelEx {
                cmd.arg("IFEQ");
            }
            if fence == 0 {
                cmd.arg(owner);
            } else {
                cmd.write_arg_fmt(format_args!("{owner} {fence}"));
            }
            let cmd = Query::Cmd(cmd);
            let (deleted, repeated): (i64, bool) = {
                let ran = std::sync::atomic::AtomicBool::new(false);
                let ran = &ran;
                let cmd = &cmd;
                let d = self
                    .retrying(|limit| async move {
                        let out = self.query(cmd, "releasing a lock", limit).await;
                        if matches!(&out, Err(e) if e.may_have_run()) {
                            ran.store(true, std::sync::atomic::Ordering::Relaxed);
                        }
                        out
                    })
                    .await;
                let d = match d {
                    Ok(d) => d,
                    // Refused by the server: never again here; the script
                    // releases (it found nothing deleted).
                    Err(e) if !e.is_transient() => {
                        tracing::warn!(redis = %self.addr, error = %e, "the server refused its own compare-and-delete; releasing by script from now on");
                        self.native_refused
                            .store(true, std::sync::atomic::Ordering::Relaxed);
                        return self
                            .release_as(name, (owner, Some(fence)), Wake::IfReleased)
                            .await;
                    }
                    Err(e) => return Err(e),
                };
                (d, ran.load(std::sync::atomic::Ordering::Relaxed))
            };
            if deleted == 1 {
                return Ok(Released::Freed);
            }
            if repeated {
                // The first send may have deleted it; the script below
                // finds it absent and says so, which counts as released.
                let (freed, _) = self
                    .run_release(name, (owner, Some(fence)), Wake::IfReleased, false)
                    .await?;
                return Ok(self.released(freed, true));
            }
        }
        self.release_as(name, (owner, Some(fence)), Wake::IfReleased)
            .await
    }

    /// End `owner`'s hold but leave the lock taken for `left` more, unless
    /// it is another's (the release of a hold with `min_hold` left).
    pub(crate) async fn keep(
        &self,
        name: &LockName,
        owner: &str,
        left: Duration,
    ) -> Result<Released, Fault> {
        if let Mode::Permit(_) = Mode::of(owner) {
            return self.keep_permit(name, owner, left).await;
        }
        // Counted from here: a send that lands later (after a slot move)
        // leaves the lock for what is left of it.
        let until = tokio::time::Instant::now() + left;
        let readers = name.readers();
        let keys: &[&str] = &[&name.hash, &readers];
        let kept: i64 = self
            .retrying(|limit| async move {
                let left = until.saturating_duration_since(tokio::time::Instant::now());
                let args = [Arg::Str(owner), Arg::Num(millis(left))];
                let sha = Query::Cmd(scripts::KEEP.evalsha(keys, &args));
                self.eval_once(&scripts::KEEP, &sha, keys, &args, limit)
                    .await
            })
            .await?;
        Ok(if kept == 1 {
            Released::Freed
        } else {
            Released::NotOwner
        })
    }

    /// Whether `owner` still waits in the lock's queue, or was handed the
    /// lock already.
    pub(crate) async fn still_queued(&self, name: &LockName, owner: &str) -> Result<bool, Fault> {
        if let Mode::Permit(_) = Mode::of(owner) {
            return self.still_queued_permit(name, owner).await;
        }
        // Queued, or already handed the lock (its grant message is on the
        // way: this client listened when it was published).
        let mut pipe = Pipeline::new();
        pipe.cmd("HEXISTS").arg(name.waiters()).arg(owner);
        pipe.cmd("GET").arg(&*name.hash);
        pipe.cmd("ZSCORE").arg(name.readers()).arg(owner);
        let pipe = Query::Pipe(pipe);
        let (queued, value, reads): (bool, Option<String>, Option<String>) = self
            .retrying(|limit| self.query(&pipe, "checking the lock queue", limit))
            .await?;
        let holder = value.as_deref().and_then(|v| v.split(' ').next());
        Ok(queued || holder == Some(owner) || (reads.is_some() && holder == Some("~r")))
    }

    /// Raise the token counter to at least `fence`, and `owner`'s hold to
    /// that token (Redlock: every granted node learns the token handed
    /// out, so that later majorities see it).
    pub(crate) async fn raise_fence(
        &self,
        name: &LockName,
        owner: &str,
        fence: u64,
    ) -> Result<(), Fault> {
        let ttl = millis(self.settings.fence_ttl);
        let counter = self.counter(name);
        let _: i64 = self
            .eval(
                &scripts::RAISE_FENCE,
                &[&name.hash, &counter],
                &[Arg::Str(owner), Arg::Num(fence), Arg::Num(ttl)],
            )
            .await?;
        Ok(())
    }

    /// Renew a batch in one pipelined round trip (one script call per lock
    /// on a cluster, where the locks live in different slots).
    pub(crate) async fn renew(&self, batch: &[Renewal]) -> Vec<Renewed> {
        if self.is_cluster() {
            return futures_util::future::join_all(batch.iter().map(|r| self.renew_one(r))).await;
        }
        self.renew_with(batch, None).await
    }

    /// [`renew`](Self::renew) on one server, each send followed in its
    /// pipeline by `WAIT replicas timeout` (Sentinel with `replica_acks`):
    /// a renewal counts only once `replicas` replicas acknowledged it, and
    /// one that ran unacknowledged is a failure (no verdict), so the
    /// holder's deadline stays where the replicas have it. One `WAIT` a
    /// tick, in the same round trip, on the connection that ran the
    /// renewals: a `WAIT` sent apart could go on a connection that replaced
    /// a broken one, and would wait for none of them.
    pub(crate) async fn renew_acked(
        &self,
        batch: &[Renewal],
        acks: (usize, Duration),
    ) -> Vec<Renewed> {
        self.renew_with(batch, Some(acks)).await
    }

    async fn renew_with(&self, batch: &[Renewal], acks: Option<(usize, Duration)>) -> Vec<Renewed> {
        let op = self.settings.op_timeout;
        match self
            .retrying(|limit| self.renew_once(batch, acks, limit))
            .await
        {
            Err(Fault::Redis { source, .. }) if scripts::is_noscript(&source) => {
                match self.load_scripts().await {
                    Ok(()) => self.renew_once(batch, acks, Limit::from_now(op)).await,
                    Err(e) => Err(e),
                }
            }
            other => other,
        }
        .unwrap_or_else(|e| Renewed::all_failed(batch.len(), &e))
    }

    async fn renew_one(&self, r: &Renewal) -> Renewed {
        let (front, rest) = owner_parts(&r.owner);
        let args = [Arg::Num(millis(r.lease)), Arg::Str(front), Arg::Str(rest)];
        let out = if is_reader(&r.owner) {
            let keys = [&*r.name.hash, &r.name.readers()];
            self.eval::<Vec<u8>>(&scripts::RENEW_READ, &keys, &args)
                .await
        } else if let Mode::Permit(_) = Mode::of(&r.owner) {
            self.eval::<Vec<u8>>(&scripts::RENEW_PERMITS, &[&r.name.hash], &args)
                .await
        } else {
            self.eval::<Vec<u8>>(&scripts::RENEW, &[&r.name.hash], &args)
                .await
        };
        match out {
            Ok(flags) if flags.first() == Some(&b'1') => Renewed::Yes,
            Ok(_) => Renewed::NotOwner,
            Err(e) => Renewed::Failed(e),
        }
    }

    async fn renew_once(
        &self,
        batch: &[Renewal],
        acks: Option<(usize, Duration)>,
        limit: Limit,
    ) -> Result<Vec<Renewed>, Fault> {
        // One EVALSHA per lease and chunk: a client's locks mostly share a
        // lease, and all share the front of their owner ids, which then
        // travel once per call instead of once per lock. Each owner id is
        // split once: with 100k locks a tick, that is most of the work here.
        // Read holds (owner ids `<client id>:r<n>`) go to their own script,
        // which also needs each lock's readers; permits (`<client id>:s…`)
        // to theirs. The kind is the rest's first byte.
        let parts: Vec<(Duration, &str, u8, &str)> = batch
            .iter()
            .map(|r| {
                let (front, rest) = owner_parts(&r.owner);
                let kind = match rest.as_bytes().first() {
                    Some(&k @ (b'r' | b's')) => k,
                    _ => b'w',
                };
                (r.lease, front, kind, rest)
            })
            .collect();
        let group = |i: usize| (parts[i].0, parts[i].1, parts[i].2);
        let mut order: Vec<usize> = (0..batch.len()).collect();
        if parts
            .windows(2)
            .any(|w| (w[0].0, w[0].1, w[0].2) != (w[1].0, w[1].1, w[1].2))
        {
            order.sort_by(|&a, &b| group(a).cmp(&group(b)));
        }
        let mut pipe = Pipeline::new();
        let mut calls = 0;
        for same in order.chunk_by(|&a, &b| group(a) == group(b)) {
            let (lease, front, kind) = group(same[0]);
            let lease = millis(lease);
            for chunk in same.chunks(RENEW_CHUNK) {
                let mut args: Vec<Arg<'_>> = Vec::with_capacity(chunk.len() + 2);
                args.push(Arg::Num(lease));
                args.push(Arg::Str(front));
                args.extend(chunk.iter().map(|&i| Arg::Str(parts[i].3)));
                if kind == b's' {
                    let keys: Vec<&str> = chunk.iter().map(|&i| &*batch[i].name.hash).collect();
                    pipe.add_command(scripts::RENEW_PERMITS.evalsha(&keys, &args));
                } else if kind == b'r' {
                    let readers: Vec<String> =
                        chunk.iter().map(|&i| batch[i].name.readers()).collect();
                    let keys: Vec<&str> = chunk
                        .iter()
                        .zip(&readers)
                        .flat_map(|(&i, r)| [&*batch[i].name.hash, r.as_str()])
                        .collect();
                    pipe.add_command(scripts::RENEW_READ.evalsha(&keys, &args));
                } else {
                    let keys: Vec<&str> = chunk.iter().map(|&i| &*batch[i].name.hash).collect();
                    pipe.add_command(scripts::RENEW.evalsha(&keys, &args));
                }
                calls += 1;
            }
        }
        let (flags, unacked) = match acks {
            None => (
                self.query::<Vec<Vec<u8>>>(&Query::Pipe(pipe), "renewing locks", limit)
                    .await?,
                None,
            ),
            Some((replicas, wait)) => {
                pipe.cmd("WAIT").arg(replicas).arg(millis(wait));
                let mut replies: Vec<Value> = self
                    .query(&Query::Pipe(pipe), "renewing locks", limit)
                    .await?;
                let acked = replies
                    .pop()
                    .and_then(|v| redis::from_redis_value::<i64>(v).ok());
                let flags = replies
                    .into_iter()
                    .map(redis::from_redis_value::<Vec<u8>>)
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| {
                        Fault::other(format!(
                            "renewing locks on Redis at {}: unexpected reply ({e})",
                            self.addr
                        ))
                    })?;
                let unacked = match acked {
                    Some(n) if n >= replicas as i64 => None,
                    Some(n) => Some(format!(
                        "renewed on Redis at {} but only {n} of the {replicas} replicas required confirmed within {wait:?}",
                        self.addr
                    )),
                    None => Some(format!(
                        "renewed on Redis at {} but WAIT gave no count of replicas",
                        self.addr
                    )),
                };
                (flags, unacked)
            }
        };
        if flags.len() != calls {
            return Err(Fault::other(format!(
                "renewing locks: {} replies to {calls} calls",
                flags.len()
            )));
        }
        let mut out: Vec<Renewed> = Vec::with_capacity(batch.len());
        out.resize_with(batch.len(), || Renewed::NotOwner);
        let mut seen = 0;
        for (&i, f) in order.iter().zip(flags.iter().flatten()) {
            if *f == b'1' {
                out[i] = match &unacked {
                    None => Renewed::Yes,
                    Some(why) => Renewed::Failed(Fault::other(why.clone())),
                };
            }
            seen += 1;
        }
        if seen != batch.len() {
            return Err(Fault::other(format!(
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

/// What an acquire script's reply says (`acquire.lua`, `permit.lua`):
/// `{1, token}` taken, `{2, token}` already this owner's, `{0, ttl ms,
/// queued at}` busy.
pub(crate) fn acquired(reply: &Value, script: &str, addr: &str) -> Result<Acquired, Fault> {
    let int = |v: &Value| redis::from_redis_value_ref::<i64>(v).ok();
    let (flag, n, at) = match reply {
        Value::Array(items) => match &items[..] {
            [flag, n] => (int(flag), int(n), Some(0)),
            [flag, n, at] => (int(flag), int(n), int(at)),
            _ => (None, None, None),
        },
        _ => (None, None, None),
    };
    let (Some(flag), Some(n), Some(at)) = (flag, n, at) else {
        return Err(Fault::other(format!(
            "{script} on Redis at {addr}: unexpected reply {reply:?}"
        )));
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

/// The KEYS of `acquire.lua` and `release.lua` (see
/// [`RedisNode::script_keys`]).
struct ScriptKeys<'a> {
    lock: &'a str,
    counter: std::borrow::Cow<'a, str>,
    /// A cluster's queue, waiters and readers.
    more: Option<[String; 3]>,
}

impl ScriptKeys<'_> {
    /// The names, and how many of them there are.
    fn refs(&self) -> ([&str; 5], usize) {
        match &self.more {
            None => ([self.lock, &self.counter, "", "", ""], 2),
            Some([q, w, r]) => ([self.lock, &self.counter, q, w, r], 5),
        }
    }
}

#[derive(Clone)]
enum Query {
    Cmd(Cmd),
    Pipe(Pipeline),
}

pub(crate) fn millis(d: Duration) -> u64 {
    (d.as_millis() as u64).max(1)
}

/// An owner id (`<client id>:<n>`) split after its first `:`.
fn owner_parts(owner: &str) -> (&str, &str) {
    owner.split_at(owner.find(':').map_or(0, |i| i + 1))
}
