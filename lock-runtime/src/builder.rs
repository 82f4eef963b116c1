use std::future::Future;
use std::time::Duration;

use tokio::runtime::Handle;

use crate::backend::cluster;
use crate::backend::fault::Fault;
use crate::backend::memory::MemoryBackend;
use crate::backend::node::NodeSettings;
use crate::backend::redis::RedisBackend;
use crate::backend::redlock::RedlockBackend;
use crate::backend::sentinel::SentinelBackend;
use crate::backend::Backend;
use crate::client::Config;
use crate::io::Io;
use crate::{LockClient, LockError};

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

    /// How long to wait for a busy lock when a lock does not say. Default 0
    /// (try once).
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
    /// lock is released and the acquire fails with [`LockError::Backend`].
    /// A failover then cannot promote a replica that never saw the lock, at
    /// the price of one more round trip per acquire and failed acquires
    /// while replicas lag. Default: off.
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

    /// Connect to one Redis server.
    pub async fn connect(self, url: &str) -> Result<LockClient, LockError> {
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

    /// A Redis Cluster; see [`LockClient::cluster`].
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

    /// Locks in this process only.
    ///
    /// # Panics
    /// If the settings are invalid (zero lease or timeouts), or the OS
    /// refuses to start a thread.
    pub fn memory(self) -> LockClient {
        let config = self.checked().unwrap_or_else(|e| panic!("{e}"));
        let io = Io::start().unwrap_or_else(|e| panic!("{e}"));
        LockClient::from_parts(config, Backend::Memory(MemoryBackend::new()), io)
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
    let connecting = connect(&config, config.node_settings(), io.handle().clone());
    let backend = io
        .run(async move { connecting.await.map_err(LockError::from) })
        .await?;
    Ok(LockClient::from_parts(config, backend, io))
}

fn owned(urls: impl IntoIterator<Item = impl AsRef<str>>) -> Vec<String> {
    urls.into_iter().map(|u| u.as_ref().to_owned()).collect()
}
