//! PostgreSQL as the lock store: the lock protocol as SQL functions
//! (`lock-runtime/sql/`, with the uncontended writer's lock and release
//! inline in `fast_path.rs`), one autocommit statement per call over a small
//! pool of connections (`pool.rs`), hand-offs heard on one listening
//! connection per client (`listener.rs`), the schema created on first use
//! (`schema.rs`).
//!
//! Leases run on the database's clock (`clock_timestamp()` in every
//! function), never the client's. A held lock is a row, not a session: it
//! does not depend on any connection staying open, survives a restart of
//! the server like any committed row, and passes through a pooler in
//! transaction mode. See `docs/POSTGRES.md`.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use tokio::runtime::Handle;
use tokio_postgres::types::Type;

use super::fault::Fault;
use super::node::NodeSettings;
use super::{Acquired, Queue, Queued, Released, Renewal, Renewed};
use crate::key::{client_of, LockName, Mode};
use crate::wakeups::Waiter;

mod direct;
mod errors;
mod fast_path;
mod listener;
mod operations;
pub(crate) mod pool;
pub(crate) mod schema;
mod tls;

use listener::{channel_of, Listener};
use pool::{Param, Pool};
use tls::Tls;

use super::endpoint::Access;

/// One PostgreSQL server (or a pooler in front of it).
pub(crate) struct PostgresBackend {
    pool: Pool,
    listener: Listener,
}

/// The settings of a URL, checked.
fn config_of(url: &str) -> Result<tokio_postgres::Config, Fault> {
    // The driver reads the scheme in lower case only.
    let lowered = url
        .split_once("://")
        .map(|(_, rest)| format!("postgresql://{rest}"));
    let mut config =
        tokio_postgres::Config::from_str(lowered.as_deref().unwrap_or(url)).map_err(|e| {
            Fault::Config(format!(
                "`{}` is not a PostgreSQL URL: {e}",
                super::endpoint::redact(url)
            ))
        })?;
    if config.get_application_name().is_none() {
        config.application_name("lock-runtime");
    }
    Ok(config)
}

impl PostgresBackend {
    /// Connect now (and create the schema if it is missing): a server that
    /// cannot be reached, a wrong password or a missing database fails
    /// here. `listen_url`: where the listening connection goes, if not to
    /// `url` (a pooler in transaction mode does not pass `LISTEN`).
    pub(crate) async fn connect(
        url: &str,
        listen_url: Option<&str>,
        access: &Access,
        settings: NodeSettings,
        io: Handle,
    ) -> Result<Self, Fault> {
        let backend = Self::connect_lazy(url, listen_url, access, settings, io)?;
        backend.pool.warm().await?;
        Ok(backend)
    }

    /// [`connect`](Self::connect) without I/O: the URL is checked, the
    /// connections open on first use.
    pub(crate) fn connect_lazy(
        url: &str,
        listen_url: Option<&str>,
        access: &Access,
        settings: NodeSettings,
        io: Handle,
    ) -> Result<Self, Fault> {
        let config = config_of(url)?;
        let listen = match listen_url {
            Some(u) => config_of(u)?,
            None => config.clone(),
        };
        let (tls, listen_tls) = (Tls::of(&config, access)?, Tls::of(&listen, access)?);
        Ok(PostgresBackend {
            listener: Listener::new(listen, listen_tls, settings.clone(), io.clone()),
            pool: Pool::new(config, tls, settings, io),
        })
    }

    fn fence_ttl_ms(&self) -> i64 {
        millis(self.pool.settings.fence_ttl)
    }

    pub(crate) async fn acquire(
        &self,
        name: &LockName,
        owner: &Arc<str>,
        lease: Duration,
        queue: Queue,
    ) -> Result<Acquired, Fault> {
        let (kind, permits) = kind_of(owner);
        let lease_ms = millis(lease);
        let stay_ms = queue.stay.map(millis);
        let channel = channel_of(client_of(owner));
        let ttl = self.fence_ttl_ms();
        let params: [Param<'_>; 10] = [
            (&&*name.hash, Type::TEXT),
            (&&**owner, Type::TEXT),
            (&kind, Type::CHAR),
            (&permits, Type::INT4),
            (&lease_ms, Type::INT8),
            (&stay_ms, Type::INT8),
            (&queue.rejoin, Type::BOOL),
            (&queue.fence, Type::BOOL),
            (&channel, Type::TEXT),
            (&ttl, Type::INT8),
        ];
        let rows = self
            .pool
            .query_by(
                Pool::route(&name.hash),
                "acquiring a lock",
                fast_path::ACQUIRE,
                &params,
                queue.by,
            )
            .await?;
        let row = one(&rows, "acquiring a lock")?;
        let status: i32 = row.get(0);
        let token = row.get::<_, i64>(1).max(0) as u64;
        Ok(match status {
            1 => Acquired::Fresh { fence: token },
            2 => Acquired::Repeated { fence: token },
            _ => {
                let ttl: Option<i64> = row.get(2);
                let queued_at: i64 = row.get(3);
                Acquired::Busy {
                    ttl: ttl.map(|ms| Duration::from_millis(ms.max(0) as u64)),
                    queued: (queued_at > 0).then_some(Queued::At(queued_at as u64)),
                }
            }
        })
    }

    /// The release function run as `owner` (`forced`: an operator's).
    /// The release function's answer (1: released), and whether it answers
    /// a resend after an earlier send that may have run.
    async fn run_release(
        &self,
        name: &LockName,
        owner: &str,
        forced: bool,
    ) -> Result<(i32, bool), Fault> {
        let (rows, repeated) = self
            .pool
            .query_sent(
                Pool::route(&name.hash),
                "releasing a lock",
                fast_path::RELEASE,
                &[
                    (&&*name.hash, Type::TEXT),
                    (&owner, Type::TEXT),
                    (&forced, Type::BOOL),
                ],
                None,
            )
            .await?;
        Ok((one(&rows, "releasing a lock")?.get(0), repeated))
    }

    pub(crate) async fn release(
        &self,
        name: &LockName,
        owner: &Arc<str>,
    ) -> Result<Released, Fault> {
        Ok(match self.run_release(name, owner, false).await? {
            (1, _) => Released::Freed,
            // An earlier send whose reply was lost may have released it, and
            // a waiter may have taken it since: nothing here says it was
            // lost before (as a repeated release on Redis).
            (_, true) => Released::Freed,
            _ => Released::NotOwner,
        })
    }

    pub(crate) async fn keep(
        &self,
        name: &LockName,
        owner: &Arc<str>,
        left: Duration,
    ) -> Result<Released, Fault> {
        let left_ms = millis(left);
        let rows = self
            .pool
            .query(
                Pool::route(&name.hash),
                "leaving a lock to its min_hold",
                "SELECT lock_keep_v1($1, $2, $3)",
                &[
                    (&&*name.hash, Type::TEXT),
                    (&&**owner, Type::TEXT),
                    (&left_ms, Type::INT8),
                ],
            )
            .await?;
        Ok(
            match one(&rows, "leaving a lock to its min_hold")?.get::<_, i32>(0) {
                1 => Released::Freed,
                _ => Released::NotOwner,
            },
        )
    }

    /// Every hold of the batch in one statement; a hold the statement did
    /// not find is gone.
    pub(crate) async fn renew(&self, batch: Vec<Renewal>) -> Vec<Renewed> {
        if batch.is_empty() {
            return Vec::new();
        }
        let names: Vec<&str> = batch.iter().map(|r| &*r.name.hash).collect();
        let owners: Vec<&str> = batch.iter().map(|r| &*r.owner).collect();
        let leases: Vec<i64> = batch.iter().map(|r| millis(r.lease)).collect();
        let out = self
            .pool
            .query(
                self.pool.open_route(pool::POOL_SIZE - 1),
                "renewing locks",
                "SELECT lock_renew_v1($1, $2, $3)",
                &[
                    (&names, Type::TEXT_ARRAY),
                    (&owners, Type::TEXT_ARRAY),
                    (&leases, Type::INT8_ARRAY),
                ],
            )
            .await;
        match out {
            Ok(rows) => {
                let mut found = vec![false; batch.len()];
                for row in rows {
                    let i: i64 = row.get(0);
                    if let Some(f) = usize::try_from(i - 1).ok().and_then(|i| found.get_mut(i)) {
                        *f = true;
                    }
                }
                found
                    .into_iter()
                    .map(|f| if f { Renewed::Yes } else { Renewed::NotOwner })
                    .collect()
            }
            Err(e) => Renewed::all_failed(batch.len(), &e),
        }
    }

    pub(crate) async fn subscribe(
        &self,
        name: &LockName,
        owner: &Arc<str>,
    ) -> Result<(Waiter, bool), Fault> {
        self.listener.subscribe(name, owner).await
    }

    pub(crate) async fn still_queued(
        &self,
        name: &LockName,
        owner: &Arc<str>,
    ) -> Result<bool, Fault> {
        let rows = self
            .pool
            .query(
                Pool::route(&name.hash),
                "checking the lock queue",
                "SELECT lock_queued_v1($1, $2)",
                &[(&&*name.hash, Type::TEXT), (&&**owner, Type::TEXT)],
            )
            .await?;
        Ok(one(&rows, "checking the lock queue")?.get(0))
    }

    pub(crate) fn waiting(&self, name: &LockName) -> usize {
        self.listener.waiting(name)
    }
}

/// The kind column of a hold or a waiter ('w', 'r', 's'), and a permit's
/// semaphore size (0 for a lock).
fn kind_of(owner: &str) -> (i8, i32) {
    match Mode::of(owner) {
        Mode::Write => (b'w' as i8, 0),
        Mode::Read => (b'r' as i8, 0),
        Mode::Permit(n) => (b's' as i8, i32::try_from(n).unwrap_or(i32::MAX)),
    }
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

fn one<'a>(rows: &'a [tokio_postgres::Row], what: &str) -> Result<&'a tokio_postgres::Row, Fault> {
    rows.first()
        .ok_or_else(|| Fault::other(format!("{what}: the lock function returned no row")))
}
