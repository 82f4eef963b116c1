//! Hearing of hand-offs: one connection per client that `LISTEN`s on the
//! client's own channel (`lock_<client id>`), opened when a first waiter
//! parks. A release that serves a waiter sends `NOTIFY` on that waiter's
//! channel, in its own statement: `<owner> <token> <server ms> <name>`.
//! The message is routed to the waiting request as a Redis grant is
//! (`wakeups.rs`, `claims.rs`); nobody polls. If this connection drops,
//! every waiter asks again and listens afresh, on a new session.
//!
//! The session records itself in `lock_listeners` (`lock_listen_v1`): a
//! release serves only waiters whose client's session is alive, as a Redis
//! release serves only waiters whose client heard the grant.

use std::sync::Arc;
use std::time::Duration;

use tokio::runtime::Handle;
use tokio::time::Instant;
use tokio_postgres::AsyncMessage;

use super::errors::{describe, sql_fault};
use super::tls::Tls;
use crate::backend::fault::Fault;
use crate::backend::node::NodeSettings;
use crate::claims::{Grant, Stamp};
use crate::key::{client_of, LockName};
use crate::wakeups::{Waiter, Wakeups};

/// The channel a client listens on.
pub(crate) fn channel_of(client: &str) -> String {
    format!("lock_{client}")
}

pub(crate) struct Listener {
    config: tokio_postgres::Config,
    tls: Tls,
    settings: NodeSettings,
    io: Handle,
    wakeups: Arc<Wakeups>,
    live: tokio::sync::Mutex<Option<Live>>,
    addr: String,
}

/// The listening connection.
struct Live {
    client: tokio_postgres::Client,
    /// When it started listening: a waiter that queued before then may
    /// have missed its grant.
    since: Instant,
}

impl Listener {
    pub(crate) fn new(
        config: tokio_postgres::Config,
        tls: Tls,
        settings: NodeSettings,
        io: Handle,
    ) -> Self {
        Listener {
            addr: describe(&config),
            config,
            tls,
            settings,
            io,
            wakeups: Arc::new(Wakeups::new(None)),
            live: tokio::sync::Mutex::new(None),
        }
    }

    pub(crate) fn waiting(&self, name: &LockName) -> usize {
        self.wakeups.waiting(name)
    }

    /// A waiter for `owner`'s grant of `name`, listening before this
    /// returns; and whether the listening connection is new (a grant sent
    /// before it went unheard: the caller asks whether it was passed over).
    pub(crate) async fn subscribe(
        &self,
        name: &LockName,
        owner: &Arc<str>,
    ) -> Result<(Waiter, bool), Fault> {
        let client = client_of(owner);
        let channel = name.grant_channel(client);
        let (waiter, _) = self.wakeups.join(&channel, Some(owner));
        let fresh = self.listen(client).await?;
        self.wakeups.mark_ready(&channel);
        Ok((waiter, fresh))
    }

    /// Make sure the client's channel is listened on; whether that
    /// connection is recent enough that a grant may have been missed.
    async fn listen(&self, client: &str) -> Result<bool, Fault> {
        let op = self.settings.op_timeout;
        let what = format!("listening for lock grants on PostgreSQL at {}", self.addr);
        let mut live = tokio::time::timeout(op, self.live.lock())
            .await
            .map_err(|_| Fault::timed_out(&what, op))?;
        if let Some(l) = live.as_ref().filter(|l| !l.client.is_closed()) {
            return Ok(l.since.elapsed() < 2 * op);
        }
        *live = None;
        let conn = self.open(&what).await?;
        // (The channel is `lock_` and a hex client id: nothing to escape.)
        let channel = channel_of(client);
        let listen = format!("LISTEN \"{channel}\"; SELECT lock_listen_v1('{channel}')");
        tokio::time::timeout(op, conn.batch_execute(&listen))
            .await
            .map_err(|_| Fault::timed_out(&what, op))?
            .map_err(|e| sql_fault(&what, &e))?;
        *live = Some(Live {
            client: conn,
            since: Instant::now(),
        });
        Ok(true)
    }

    /// A connection whose messages go to the waiters.
    async fn open(&self, what: &str) -> Result<tokio_postgres::Client, Fault> {
        let budget = self.settings.connect_timeout;
        let mut config = self.config.clone();
        config.connect_timeout(budget);
        let wakeups = self.wakeups.clone();
        let tls = self.tls.clone();
        let opened = self.io.spawn(async move {
            match tls {
                Tls::Off => {
                    let (client, connection) = config.connect(tokio_postgres::NoTls).await?;
                    tokio::spawn(hear(connection, wakeups));
                    Ok::<_, tokio_postgres::Error>(client)
                }
                #[cfg(feature = "tls")]
                Tls::On(tls) => {
                    let (client, connection) = config.connect(tls).await?;
                    tokio::spawn(hear(connection, wakeups));
                    Ok(client)
                }
            }
        });
        match tokio::time::timeout(budget + Duration::from_millis(100), opened).await {
            Ok(Ok(Ok(c))) => Ok(c),
            Ok(Ok(Err(e))) => Err(sql_fault(what, &e)),
            Ok(Err(_)) => Err(Fault::other(format!("{what}: the I/O thread has stopped"))),
            Err(_) => Err(Fault::timed_out(what, budget)),
        }
    }
}

/// A grant heard: `<owner> <token> <server ms> <name>`.
fn heard(wakeups: &Arc<Wakeups>, payload: &str) {
    let mut parts = payload.splitn(4, ' ');
    let (Some(owner), Some(fence), Some(at), Some(name)) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return;
    };
    let (Ok(fence), Ok(at)) = (fence.parse::<u64>(), at.parse::<u64>()) else {
        return;
    };
    let channel = format!("{name}:granted:{}", client_of(owner));
    wakeups.granted(
        &channel,
        owner,
        Grant {
            fence,
            at: Stamp::ServerMs(at, Instant::now()),
        },
    );
}

/// The listening connection's task: hands each notification to the
/// waiters, until the connection ends.
async fn hear<S, T>(mut connection: tokio_postgres::Connection<S, T>, wakeups: Arc<Wakeups>)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    loop {
        match std::future::poll_fn(|cx| connection.poll_message(cx)).await {
            Some(Ok(AsyncMessage::Notification(n))) => heard(&wakeups, n.payload()),
            Some(Ok(_)) => {}
            Some(Err(e)) => {
                tracing::debug!(error = %e, "lock listening connection broke");
                break;
            }
            None => break,
        }
    }
    // Closed first, so that a waiter woken below finds the client closed
    // and opens a new session rather than wait on this one.
    drop(connection);
    // Grants sent from now on reach nobody here: every waiter asks again
    // and listens afresh.
    wakeups.listener_gone();
}
