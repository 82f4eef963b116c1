use std::future::Future;
use std::time::Duration;

use tokio::runtime::Handle;

#[cfg(feature = "cluster")]
use crate::backend::cluster;
use crate::backend::fault::Fault;
use crate::backend::memory::{MemoryBackend, MemoryControl};
use crate::backend::node::NodeSettings;
use crate::backend::redis::RedisBackend;
use crate::backend::redlock::RedlockBackend;
use crate::backend::sentinel::SentinelBackend;
use crate::backend::Backend;
use crate::client::Config;
use crate::io::Io;
use crate::{LockClient, LockError};

/// Longest `fence_ttl`: ten years is "forever" for a counter.
const MAX_FENCE_TTL: Duration = Duration::from_secs(3660 * 86_400);

/// Settings for a new [`LockClient`]; every annotated fn and lock request
/// that does not say otherwise uses them.
///
/// ```no_run
/// # async fn demo() -> Result<(), lock_runtime::LockError> {
/// use std::time::Duration;
/// let client = lock_runtime::LockClient::builder()
///     .lease(Duration::from_secs(10))
///     .wait(Duration::from_secs(2))
///     .key_prefix("shop:lock:")
///     .connect("redis://127.0.0.1:6379")
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Default)]
pub struct LockClientBuilder {
    config: Config,
}

impl LockClientBuilder {
    /// Lease (Redis TTL) when a lock does not set one. Default 30 s.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.config.lease = lease;
        self
    }

    /// How long to wait for a busy lock when a lock does not say. Default
    /// 5 s: a handler queues briefly behind the request that holds its key
    /// rather than failing at once. `Duration::ZERO` tries once.
    /// (`on_busy = "skip"`, [`LockRequest::try_acquire`](crate::LockRequest::try_acquire)
    /// and [`run_or_skip`](crate::LockRequest::run_or_skip) try once unless
    /// given a `wait` of their own.)
    pub fn wait(mut self, wait: Duration) -> Self {
        self.config.wait = wait;
        self
    }

    /// Prefix of every Redis name this client writes. Default `lock:`.
    pub fn key_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.config.prefix = prefix.into().into();
        self
    }

    /// Longest a waiter sleeps between attempts when no release message
    /// arrives (a safety net under pub/sub; it is also capped by the lock's
    /// remaining TTL). Default 1 s.
    pub fn retry_delay(mut self, delay: Duration) -> Self {
        self.config.retry_delay = delay;
        self
    }

    /// Random extra delay (0 to this) added to each fallback retry, so
    /// waiters do not retry in lock-step. Default 50 ms.
    pub fn retry_jitter(mut self, jitter: Duration) -> Self {
        self.config.retry_jitter = jitter;
        self
    }

    /// How long the token counter of a hash slot outlives its last use.
    /// Default 24 h.
    ///
    /// Tokens come from one counter per Redis Cluster slot (one in all on a
    /// single server), not one per lock name: a service that locks
    /// `order:{id}` for millions of orders keeps no key per order. A counter
    /// that lapsed starts again at the server's clock in microseconds, where
    /// every token starts anyway, so tokens still rise as long as the clock
    /// has not stepped back by more than the time the counter was unused.
    /// (Each use sets the expiry again: a counter in use never lapses, and
    /// while it lives a clock step back changes nothing. Clients that share
    /// a key prefix share the counters; each use sets its own client's
    /// `fence_ttl`, so give them one.) Between 1 s and ten years; anything
    /// else is [`LockError::Config`] when the client is built.
    pub fn fence_ttl(mut self, ttl: Duration) -> Self {
        self.config.fence_ttl = ttl;
        self
    }

    /// Time limit of one Redis command. Default 2 s.
    pub fn op_timeout(mut self, timeout: Duration) -> Self {
        self.config.op_timeout = timeout;
        self
    }

    /// Time limit of one connection attempt. Default 2 s.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.config.connect_timeout = timeout;
        self
    }

    /// Sentinel only: after taking a lock, wait (Redis `WAIT`) until
    /// `replicas` replicas have it, at most `timeout`; if fewer confirm, the
    /// lock is released and the request tries again under a new owner id
    /// (acquire, `WAIT`, release) until its `wait` runs out, then fails with
    /// [`LockError::Timeout`] if a try found the lock busy, else
    /// [`LockError::Backend`] naming the shortfall.
    /// Renewals count the same way: each renewal tick ends with one `WAIT`
    /// in its pipeline, and a renewal the replicas did not acknowledge does
    /// not extend the hold. A failover then cannot promote a replica that
    /// never saw the lock, or that lets it go before its holder is told, at
    /// the price of one more round trip per acquire, failed acquires while
    /// replicas lag, and holds lost when replicas lag for a whole lease.
    /// Default: off.
    pub fn replica_acks(mut self, replicas: usize, timeout: Duration) -> Self {
        self.config.replica_acks = Some((replicas, timeout));
        self
    }

    /// Trust `pem` (one or more PEM certificates) as the CA of `rediss://`
    /// servers, instead of the platform's roots: for a private CA. Applies
    /// to every node of every deployment, the data nodes found through
    /// Sentinel included. A certificate that does not parse fails
    /// `connect` with [`LockError::Config`].
    #[cfg(feature = "tls")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tls")))]
    pub fn tls_root_ca(mut self, pem: &[u8]) -> Self {
        self.config.access.root_ca = Some(pem.into());
        self
    }

    /// Sentinel only: the user and password of the sentinels themselves
    /// (an empty `user`: password only, `requirepass`). The credentials in
    /// the Sentinel URLs (`redis://user:password@sentinel:26379`) are the
    /// data nodes': they are passed on to the primary the sentinels name,
    /// with the URLs' TLS setting. Default: the sentinels need no password.
    pub fn sentinel_auth(mut self, user: impl Into<String>, password: impl Into<String>) -> Self {
        self.config.access.sentinel_auth = Some((user.into(), password.into()));
        self
    }

    fn checked(self) -> Result<Config, LockError> {
        let c = self.config;
        if c.lease.is_zero() {
            return Err(LockError::Config(
                "the default lease must be longer than zero".into(),
            ));
        }
        if c.op_timeout.is_zero() || c.connect_timeout.is_zero() {
            return Err(LockError::Config(
                "timeouts must be longer than zero".into(),
            ));
        }
        if c.fence_ttl < Duration::from_secs(1) || c.fence_ttl > MAX_FENCE_TTL {
            return Err(LockError::Config(format!(
                "fence_ttl must be between 1 s and {} days (got {:?})",
                MAX_FENCE_TTL.as_secs() / 86_400,
                c.fence_ttl
            )));
        }
        Ok(c)
    }

    /// `replica_acks` only means something behind Sentinel.
    fn without_acks(self, what: &str) -> Result<Config, LockError> {
        if self.config.replica_acks.is_some() {
            return Err(LockError::Config(format!(
                "replica_acks applies to `sentinel` clients only, not to `{what}`"
            )));
        }
        if self.config.access.sentinel_auth.is_some() {
            return Err(LockError::Config(format!(
                "sentinel_auth applies to `sentinel` clients only, not to `{what}`"
            )));
        }
        self.checked()
    }

    /// PostgreSQL only: open the client's listening connection (`LISTEN`,
    /// how a waiter hears that a release handed it the lock) to `url`
    /// instead of the URL given to `connect`. For a pooler in transaction
    /// mode, such as PgBouncer's, which does not pass notifications: lock
    /// calls go through the pooler, and this one connection per client goes
    /// to the server itself. Without it behind such a pooler, waiters
    /// still get the lock, by asking again at `retry_delay`.
    #[cfg(feature = "postgres")]
    #[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
    pub fn listen_url(mut self, url: impl Into<String>) -> Self {
        self.config.listen_url = Some(url.into());
        self
    }

    /// Connect to one Redis server (`redis://`, `rediss://`), or with the
    /// `postgres` feature to PostgreSQL (`postgres://`, `postgresql://`).
    pub async fn connect(self, url: &str) -> Result<LockClient, LockError> {
        if postgres_url(url) {
            return self.connect_postgres(url).await;
        }
        let url = url.to_owned();
        start(
            self.without_acks("connect")?,
            |_, settings, io| async move {
                RedisBackend::connect(&url, settings, io)
                    .await
                    .map(Backend::Redis)
            },
        )
        .await
    }

    /// One Redis server, connected on first use: see
    /// [`LockClient::connect_lazy`]. Settings and the URL are checked here.
    pub fn connect_lazy(self, url: &str) -> Result<LockClient, LockError> {
        if postgres_url(url) {
            return self.connect_postgres_lazy(url);
        }
        let config = self.without_acks("connect_lazy")?;
        let io = Io::start()?;
        crate::metrics::describe();
        let backend = {
            // Reconnects are spawned on the runtime the connection is made in.
            let _rt = io.handle().enter();
            RedisBackend::connect_lazy(url, config.node_settings(), io.handle())?
        };
        Ok(LockClient::from_parts(config, Backend::Redis(backend), io))
    }

    /// Redlock over independent Redis servers; see [`LockClient::redlock`].
    pub async fn redlock(
        self,
        urls: impl IntoIterator<Item = impl AsRef<str>>,
    ) -> Result<LockClient, LockError> {
        let urls = owned(urls);
        start(self.without_acks("redlock")?, |config, settings, io| {
            let connect = RedlockBackend::connect(urls, settings, io, config.retry_jitter);
            async move { connect.await.map(Backend::Redlock) }
        })
        .await
    }

    /// Connect to the deployment the environment names, the twelve-factor
    /// way: `LOCK_REDIS_URL` (one Redis), `LOCK_REDIS_SENTINELS`
    /// (comma-separated) with `LOCK_REDIS_MASTER` (Sentinel),
    /// `LOCK_REDIS_CLUSTER` (comma-separated seed nodes) or
    /// `LOCK_REDIS_REDLOCK` (comma-separated masters); if none of them is
    /// set, `REDIS_URL` (one Redis). Exactly one deployment may be named:
    /// none, two, or a Sentinel list without its master is
    /// [`LockError::Config`] naming the variables.
    pub async fn from_env(self) -> Result<LockClient, LockError> {
        match Deployment::from_env(|k| std::env::var(k).ok())? {
            Deployment::One(url) => self.connect(&url).await,
            Deployment::Sentinel(urls, master) => self.sentinel(urls, &master).await,
            #[cfg(feature = "cluster")]
            Deployment::Cluster(urls) => self.cluster(urls).await,
            #[cfg(not(feature = "cluster"))]
            Deployment::Cluster(_) => Err(LockError::Config(
                "LOCK_REDIS_CLUSTER is set, but lock-runtime was built without its `cluster` feature".into(),
            )),
            Deployment::Redlock(urls) => self.redlock(urls).await,
        }
    }

    /// A Redis Cluster; see [`LockClient::cluster`].
    #[cfg(feature = "cluster")]
    #[cfg_attr(docsrs, doc(cfg(feature = "cluster")))]
    pub async fn cluster(
        self,
        urls: impl IntoIterator<Item = impl AsRef<str>>,
    ) -> Result<LockClient, LockError> {
        let urls = owned(urls);
        if urls.is_empty() {
            return Err(LockError::Config(
                "a Redis Cluster client needs at least one node URL".into(),
            ));
        }
        start(
            self.without_acks("cluster")?,
            |_, settings, io| async move {
                cluster::connect(urls, settings, io)
                    .await
                    .map(Backend::Cluster)
            },
        )
        .await
    }

    /// A primary found through Redis Sentinel; see [`LockClient::sentinel`].
    pub async fn sentinel(
        self,
        urls: impl IntoIterator<Item = impl AsRef<str>>,
        master_name: &str,
    ) -> Result<LockClient, LockError> {
        let urls = owned(urls);
        if urls.is_empty() || master_name.is_empty() {
            return Err(LockError::Config(
                "a Sentinel client needs at least one sentinel URL and the master name".into(),
            ));
        }
        if self.config.replica_acks.is_some_and(|(_, t)| t.is_zero()) {
            return Err(LockError::Config(
                "the replica_acks timeout must be longer than zero (WAIT 0 blocks forever)".into(),
            ));
        }
        let master = master_name.to_owned();
        start(self.checked()?, |config, settings, io| {
            let connect = SentinelBackend::connect(urls, master, settings, config.replica_acks, io);
            async move { connect.await.map(Backend::Sentinel) }
        })
        .await
    }

    /// Locks in this process only (see [`LockClient::memory`]), with these
    /// settings; invalid ones (a zero lease or timeout, a Redis-only
    /// option) are [`LockError::Config`].
    ///
    /// ```
    /// # fn main() -> Result<(), lock_runtime::LockError> {
    /// use std::time::Duration;
    /// let client = lock_runtime::LockClient::builder()
    ///     .wait(Duration::from_secs(1))
    ///     .memory()?;
    /// assert!(lock_runtime::LockClient::builder().lease(Duration::ZERO).memory().is_err());
    /// # Ok(()) }
    /// ```
    pub fn memory(self) -> Result<LockClient, LockError> {
        Ok(self.memory_with_control()?.0)
    }

    /// [`memory`](Self::memory), and the test hooks of its backend (see
    /// [`LockClient::memory_with_control`]).
    pub fn memory_with_control(self) -> Result<(LockClient, MemoryControl), LockError> {
        Ok(memory(self.without_acks("memory")?))
    }
}

#[cfg(feature = "postgres")]
impl LockClientBuilder {
    async fn connect_postgres(self, url: &str) -> Result<LockClient, LockError> {
        use crate::backend::postgres::PostgresBackend;
        let url = url.to_owned();
        start(self.without_acks("connect")?, |config, settings, io| {
            let listen = config.listen_url.clone();
            let access = config.access.clone();
            async move {
                PostgresBackend::connect(&url, listen.as_deref(), &access, settings, io)
                    .await
                    .map(|b| Backend::Postgres(Box::new(b)))
            }
        })
        .await
    }

    fn connect_postgres_lazy(self, url: &str) -> Result<LockClient, LockError> {
        use crate::backend::postgres::PostgresBackend;
        let config = self.without_acks("connect_lazy")?;
        let io = Io::start()?;
        crate::metrics::describe();
        let backend = PostgresBackend::connect_lazy(
            url,
            config.listen_url.as_deref(),
            &config.access,
            config.node_settings(),
            io.handle(),
        )?;
        Ok(LockClient::from_parts(
            config,
            Backend::Postgres(Box::new(backend)),
            io,
        ))
    }
}

#[cfg(not(feature = "postgres"))]
impl LockClientBuilder {
    async fn connect_postgres(self, _url: &str) -> Result<LockClient, LockError> {
        Err(no_postgres())
    }

    fn connect_postgres_lazy(self, _url: &str) -> Result<LockClient, LockError> {
        Err(no_postgres())
    }
}

#[cfg(not(feature = "postgres"))]
fn no_postgres() -> LockError {
    LockError::Config(
        "a postgres:// URL needs lock-runtime's `postgres` feature, which this build does not have"
            .into(),
    )
}

/// Whether `url` names a PostgreSQL server (`postgres://`, `postgresql://`).
fn postgres_url(url: &str) -> bool {
    url.split_once("://").is_some_and(|(scheme, _)| {
        scheme.eq_ignore_ascii_case("postgres") || scheme.eq_ignore_ascii_case("postgresql")
    })
}

/// An in-memory client; its background work runs on the caller's runtime.
fn memory(config: Config) -> (LockClient, MemoryControl) {
    let backend = MemoryBackend::new(config.op_timeout);
    let control = backend.control(config.prefix.clone());
    crate::metrics::describe();
    let client = LockClient::from_parts(config, Backend::Memory(backend), Io::caller());
    (client, control)
}

impl LockClient {
    /// Connect to one Redis server (`redis://[:password@]host:port[/db]`).
    ///
    /// Fails with [`LockError::Backend`] within about 4 s if Redis cannot be
    /// reached. Reconnects after a connection loss are automatic.
    pub async fn connect(url: &str) -> Result<LockClient, LockError> {
        Self::builder().connect(url).await
    }

    /// A client of one Redis server that connects on its first call, for a
    /// service that must start while Redis is not up yet (start order in
    /// Kubernetes, a Redis restart during a deploy): like
    /// `sqlx::PgPool::connect_lazy`. Nothing is sent until a lock call;
    /// a URL that does not parse is still [`LockError::Config`] at once.
    ///
    /// While Redis cannot be reached, each call fails as a connected
    /// client's does when Redis goes away: within its `wait` (at least one
    /// attempt of `op_timeout`), with [`LockError::Backend`]. Once Redis
    /// answers, calls succeed; there is nothing to restart. A lazy client
    /// releases by script (it does not ask the server for its own
    /// compare-and-delete) and loads the scripts on first use.
    ///
    /// ```
    /// # fn main() -> Result<(), lock_runtime::LockError> {
    /// // No Redis needed to build it:
    /// let client = lock_runtime::LockClient::connect_lazy("redis://127.0.0.1:6379")?;
    /// assert!(lock_runtime::LockClient::connect_lazy("not a url").is_err());
    /// # drop(client); Ok(()) }
    /// ```
    pub fn connect_lazy(url: &str) -> Result<LockClient, LockError> {
        Self::builder().connect_lazy(url)
    }

    /// Redlock over independent Redis servers (three or five; not replicas
    /// of each other). A lock is held while a majority grants it, so it
    /// survives a minority of the servers failing.
    ///
    /// A majority must be reachable now; the others join when they answer.
    /// See `docs/DEPLOYMENTS.md` for the persistence this needs.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lock_runtime::LockError> {
    /// let client = lock_runtime::LockClient::redlock([
    ///     "redis://10.0.0.1:6379",
    ///     "redis://10.0.0.2:6379",
    ///     "redis://10.0.0.3:6379",
    /// ])
    /// .await?;
    /// # Ok(()) }
    /// ```
    pub async fn redlock(
        urls: impl IntoIterator<Item = impl AsRef<str>>,
    ) -> Result<LockClient, LockError> {
        Self::builder().redlock(urls).await
    }

    /// Connect to the deployment the environment names (`LOCK_REDIS_URL`,
    /// `LOCK_REDIS_SENTINELS` + `LOCK_REDIS_MASTER`, `LOCK_REDIS_CLUSTER`,
    /// `LOCK_REDIS_REDLOCK`, else `REDIS_URL`); see
    /// [`LockClientBuilder::from_env`](crate::LockClientBuilder::from_env).
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lock_runtime::LockError> {
    /// // LOCK_REDIS_URL=rediss://app:pw@redis.internal:6380
    /// let client = lock_runtime::LockClient::from_env().await?;
    /// # Ok(()) }
    /// ```
    pub async fn from_env() -> Result<LockClient, LockError> {
        Self::builder().from_env().await
    }

    /// A Redis Cluster, reached through any of its nodes. A lock's hash,
    /// fence counter and channel share one slot; the client follows
    /// MOVED/ASK redirects and failovers.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lock_runtime::LockError> {
    /// let client = lock_runtime::LockClient::cluster(["redis://10.0.0.1:7000"]).await?;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "cluster")]
    #[cfg_attr(docsrs, doc(cfg(feature = "cluster")))]
    pub async fn cluster(
        urls: impl IntoIterator<Item = impl AsRef<str>>,
    ) -> Result<LockClient, LockError> {
        Self::builder().cluster(urls).await
    }

    /// A primary found through Redis Sentinel (`redis://host:26379` URLs of
    /// the sentinels) under `master_name`; failovers are followed.
    ///
    /// The primary is reached at the address Sentinel reports, the way the
    /// sentinel URLs say: over TLS if they are `rediss://` (feature `tls`),
    /// with their user, password and database;
    /// [`LockClientBuilder::sentinel_auth`] is for the sentinels' own
    /// credentials. See
    /// [`LockClientBuilder::replica_acks`] for locks that survive a failover.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lock_runtime::LockError> {
    /// let client = lock_runtime::LockClient::sentinel(
    ///     ["redis://10.0.0.1:26379", "redis://10.0.0.2:26379", "redis://10.0.0.3:26379"],
    ///     "mymaster",
    /// )
    /// .await?;
    /// # Ok(()) }
    /// ```
    pub async fn sentinel(
        urls: impl IntoIterator<Item = impl AsRef<str>>,
        master_name: &str,
    ) -> Result<LockClient, LockError> {
        Self::builder().sentinel(urls, master_name).await
    }

    /// Locks held in this process only, with the same semantics as Redis.
    /// For single-instance services and unit tests. Time is tokio's, read
    /// on the runtime that uses the client: under `tokio::time::pause()`
    /// leases, waits and renewals follow `tokio::time::advance`. See
    /// [`memory_with_control`](Self::memory_with_control) for test hooks.
    pub fn memory() -> LockClient {
        Self::memory_with_control().0
    }

    /// Defaults (lease, wait, key prefix, retry timing) for a new client.
    pub fn builder() -> LockClientBuilder {
        LockClientBuilder::default()
    }

    /// An in-memory client (see [`LockClient::memory`]) and its test hooks:
    /// [`MemoryControl::expire`] ends a hold as if its lease ran out, and
    /// [`MemoryControl::fail_next`] makes the next calls fail as a cut
    /// connection does, so a test can exercise its `on_lost` path and its
    /// retries. Time is tokio's: under `#[tokio::test(start_paused =
    /// true)]` a 20 s wait or a 10 min hold passes in no real time.
    ///
    /// ```
    /// use std::time::Duration;
    /// use lock_runtime::{LockClient, LockError};
    ///
    /// // Paused: the renewal that finds the loss comes in no real time.
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() -> Result<(), LockError> {
    /// let (client, control) = LockClient::memory_with_control();
    /// // Two failed calls: retried within `op_timeout`, the lock is taken.
    /// control.fail_next(2);
    /// let guard = client.lock("order:42").await?;
    /// // The hold ends as if its lease ran out: the holder learns at its
    /// // next renewal.
    /// assert!(control.expire("order:42"));
    /// tokio::time::timeout(Duration::from_secs(30), guard.lost()).await.unwrap();
    /// assert!(matches!(guard.release().await, Err(LockError::Lost { .. })));
    /// # Ok(()) }
    /// ```
    pub fn memory_with_control() -> (LockClient, MemoryControl) {
        memory(Config::default())
    }
}

/// Start the client's I/O thread and connect its backend there, so the
/// backend's connections live on the runtime that drives them.
async fn start<Fut>(
    config: Config,
    connect: impl FnOnce(&Config, NodeSettings, Handle) -> Fut,
) -> Result<LockClient, LockError>
where
    Fut: Future<Output = Result<Backend, Fault>> + Send + 'static,
{
    let io = Io::start()?;
    crate::metrics::describe();
    let connecting = connect(&config, config.node_settings(), io.handle().clone());
    let backend = io
        .run(async move { connecting.await.map_err(LockError::from) })
        .await?;
    Ok(LockClient::from_parts(config, backend, io))
}

fn owned(urls: impl IntoIterator<Item = impl AsRef<str>>) -> Vec<String> {
    urls.into_iter().map(|u| u.as_ref().to_owned()).collect()
}

/// A deployment named by environment variables (see
/// [`LockClientBuilder::from_env`]).
#[derive(Debug, PartialEq, Eq)]
enum Deployment {
    One(String),
    Sentinel(Vec<String>, String),
    Cluster(Vec<String>),
    Redlock(Vec<String>),
}

const ENV_VARS: &str =
    "LOCK_REDIS_URL, LOCK_REDIS_SENTINELS + LOCK_REDIS_MASTER, LOCK_REDIS_CLUSTER, LOCK_REDIS_REDLOCK or REDIS_URL";

impl Deployment {
    fn from_env(var: impl Fn(&str) -> Option<String>) -> Result<Deployment, LockError> {
        let var = |k: &str| var(k).filter(|v| !v.trim().is_empty());
        let list = |v: String| -> Vec<String> {
            v.split(',')
                .map(|s| s.trim().to_owned())
                .filter(|s| !s.is_empty())
                .collect()
        };
        let master = var("LOCK_REDIS_MASTER");
        let mut named = Vec::new();
        if let Some(url) = var("LOCK_REDIS_URL") {
            named.push(("LOCK_REDIS_URL", Deployment::One(url.trim().to_owned())));
        }
        if let Some(urls) = var("LOCK_REDIS_SENTINELS") {
            let Some(master) = master.clone() else {
                return Err(LockError::Config(
                    "LOCK_REDIS_SENTINELS is set but LOCK_REDIS_MASTER (the master name the sentinels monitor) is not".into(),
                ));
            };
            named.push((
                "LOCK_REDIS_SENTINELS",
                Deployment::Sentinel(list(urls), master.trim().to_owned()),
            ));
        } else if master.is_some() {
            return Err(LockError::Config(
                "LOCK_REDIS_MASTER is set but LOCK_REDIS_SENTINELS (the sentinels' URLs) is not"
                    .into(),
            ));
        }
        if let Some(urls) = var("LOCK_REDIS_CLUSTER") {
            named.push(("LOCK_REDIS_CLUSTER", Deployment::Cluster(list(urls))));
        }
        if let Some(urls) = var("LOCK_REDIS_REDLOCK") {
            named.push(("LOCK_REDIS_REDLOCK", Deployment::Redlock(list(urls))));
        }
        match named.len() {
            // REDIS_URL is often set for other reasons: it counts only
            // when no variable of ours names a deployment.
            0 => var("REDIS_URL")
                .map(|url| Deployment::One(url.trim().to_owned()))
                .ok_or_else(|| {
                    LockError::Config(format!(
                        "no Redis deployment in the environment: set one of {ENV_VARS}"
                    ))
                }),
            1 => Ok(named.pop().expect("one").1),
            _ => Err(LockError::Config(format!(
                "the environment names more than one Redis deployment ({}): keep one",
                named.iter().map(|(k, _)| *k).collect::<Vec<_>>().join(", ")
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PG_URLS: [&str; 3] = [
        "postgres://app@db.internal:5432/shop",
        "postgresql://db.internal/shop",
        "POSTGRES://db.internal/shop",
    ];

    #[cfg(not(feature = "postgres"))]
    #[tokio::test]
    async fn a_postgres_url_without_the_feature_is_a_config_error_naming_it() {
        let names_it =
            |e: &LockError| matches!(e, LockError::Config(m) if m.contains("`postgres` feature"));
        for url in PG_URLS {
            let err = LockClient::connect(url).await.unwrap_err();
            assert!(names_it(&err), "{url}: {err:?}");
            let err = LockClient::connect_lazy(url).unwrap_err();
            assert!(names_it(&err), "{url}: {err:?}");
            let err = LockClient::builder().connect(url).await.unwrap_err();
            assert!(names_it(&err), "{url}: {err:?}");
        }
    }

    #[cfg(feature = "postgres")]
    #[test]
    fn a_postgres_url_picks_the_postgres_engine() {
        for url in PG_URLS {
            let client = LockClient::connect_lazy(url).expect(url);
            assert!(
                matches!(&*client.inner.backend, Backend::Postgres(_)),
                "{url}"
            );
        }
        // TLS is the `tls` feature's: without it, a URL that requires TLS
        // says which feature to enable.
        let tls = LockClient::connect_lazy("postgres://db/shop?sslmode=require");
        #[cfg(feature = "tls")]
        assert!(tls.is_ok(), "{:?}", tls.err());
        #[cfg(not(feature = "tls"))]
        assert!(
            matches!(&tls, Err(LockError::Config(m)) if m.contains("`tls` feature")),
            "{:?}",
            tls.err()
        );
        let err = LockClient::connect_lazy("postgres://db:notaport/shop").unwrap_err();
        assert!(matches!(err, LockError::Config(_)), "{err:?}");
    }

    fn from(vars: &[(&str, &str)]) -> Result<Deployment, LockError> {
        Deployment::from_env(|k| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        })
    }

    #[test]
    fn the_environment_names_one_deployment() {
        assert_eq!(
            from(&[("LOCK_REDIS_URL", "redis://a"), ("REDIS_URL", "redis://b")]).unwrap(),
            Deployment::One("redis://a".into())
        );
        assert_eq!(
            from(&[("REDIS_URL", "redis://b")]).unwrap(),
            Deployment::One("redis://b".into())
        );
        assert_eq!(
            from(&[
                ("LOCK_REDIS_SENTINELS", "redis://s1, redis://s2"),
                ("LOCK_REDIS_MASTER", "m"),
                ("REDIS_URL", "redis://b")
            ])
            .unwrap(),
            Deployment::Sentinel(vec!["redis://s1".into(), "redis://s2".into()], "m".into())
        );
        assert_eq!(
            from(&[("LOCK_REDIS_CLUSTER", "redis://c1,redis://c2,")]).unwrap(),
            Deployment::Cluster(vec!["redis://c1".into(), "redis://c2".into()])
        );
        assert_eq!(
            from(&[("LOCK_REDIS_REDLOCK", "redis://r1,redis://r2,redis://r3")]).unwrap(),
            Deployment::Redlock(vec![
                "redis://r1".into(),
                "redis://r2".into(),
                "redis://r3".into()
            ])
        );
    }

    #[test]
    fn none_two_or_half_a_sentinel_setting_is_a_config_error() {
        let msg = |vars: &[(&str, &str)]| match from(vars) {
            Err(LockError::Config(m)) => m,
            other => panic!("{other:?}"),
        };
        assert!(msg(&[]).contains("LOCK_REDIS_URL"));
        assert!(msg(&[("LOCK_REDIS_URL", "  ")]).contains("no Redis deployment"));
        let two = msg(&[
            ("LOCK_REDIS_URL", "redis://a"),
            ("LOCK_REDIS_CLUSTER", "redis://c"),
        ]);
        assert!(two.contains("LOCK_REDIS_URL, LOCK_REDIS_CLUSTER"), "{two}");
        assert!(msg(&[("LOCK_REDIS_SENTINELS", "redis://s")]).contains("LOCK_REDIS_MASTER"));
        assert!(
            msg(&[("LOCK_REDIS_MASTER", "m"), ("LOCK_REDIS_URL", "redis://a")])
                .contains("LOCK_REDIS_SENTINELS")
        );
    }
}
