//! A few connections to one PostgreSQL server, shared by every lock of a
//! client: nothing per held lock, nothing per waiter. A call goes over the
//! connection its lock name picks, so the calls of one lock stay in order
//! (an undo never overtakes the attempt it takes back); tokio-postgres
//! pipelines the calls of many locks on one connection.
//!
//! Each call is one statement (a lock function, or the fast path with its
//! function behind it, `fast_path.rs`). On a
//! connection that reaches the server itself (`direct.rs`), each statement
//! is prepared once, beside its first call, and then only bound: the
//! server parses and plans it once per connection, not once per call.
//! Anywhere else (a pooler, proxy or tunnel in between, a Unix socket)
//! statements are typed and unnamed (`query_typed`): a pooler in
//! transaction mode may run a connection's statements on any server
//! session, where a name one process prepared could be bound by another to
//! a statement of its own. A call whose
//! connection broke is sent again on a new one while the operation timeout
//! lasts: every statement is safe to run twice.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::runtime::Handle;
use tokio::time::Instant;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, NoTls, Row, Statement};

use super::direct::{open_socket, reaches_the_server, single_tcp_server, Ends};
use super::tls::Tls;

use super::errors::{connect_fault, describe, io_fault, sql_fault};
use super::schema;
use crate::backend::fault::Fault;
use crate::backend::node::NodeSettings;

/// Connections per client (the listening one comes on top). Commits
/// share a WAL flush only across sessions: 32 tasks reached 0.53× a
/// connection-per-task lease row's throughput on 4, 0.68× on 8
/// (docs/BENCHMARKS.md, case P2).
pub(crate) const POOL_SIZE: usize = 8;

/// First pause before a broken call is sent again.
const RETRY_PAUSE: Duration = Duration::from_millis(20);

/// One typed parameter of a statement.
pub(crate) type Param<'a> = (&'a (dyn ToSql + Sync), Type);

pub(crate) struct Pool {
    pub(crate) config: tokio_postgres::Config,
    tls: Tls,
    slots: Vec<Slot>,
    pub(crate) settings: NodeSettings,
    /// Where the connections' tasks run: the client's I/O runtime.
    io: Handle,
    /// The schema was found or created (once per client).
    installed: tokio::sync::OnceCell<()>,
    /// `host:port/db`, for messages.
    pub(crate) addr: String,
    /// Statements may be prepared on connections that reach the server
    /// itself; cleared for good if a session ever turns out to be shared
    /// ([`is_pooled`]: something between us pools sessions after all).
    may_prepare: Arc<AtomicBool>,
}

/// One open connection.
pub(crate) struct Conn {
    client: Client,
    /// Whether it reaches the server itself (`direct.rs`): found out by a
    /// task of its own after it opened; until then, and if not, its
    /// statements go unnamed.
    direct: AtomicBool,
    /// The statements prepared on it, by their text; `None`: one is being
    /// prepared.
    prepared: Mutex<HashMap<String, Option<Statement>>>,
}

#[derive(Default)]
struct Slot {
    conn: Mutex<Option<Arc<Conn>>>,
    /// One connect at a time per slot.
    gate: tokio::sync::Mutex<()>,
}

impl Pool {
    pub(crate) fn new(
        config: tokio_postgres::Config,
        tls: Tls,
        settings: NodeSettings,
        io: Handle,
    ) -> Pool {
        let addr = describe(&config);
        Pool {
            config,
            tls,
            slots: (0..POOL_SIZE).map(|_| Slot::default()).collect(),
            settings,
            io,
            installed: tokio::sync::OnceCell::new(),
            addr,
            may_prepare: Arc::new(AtomicBool::new(true)),
        }
    }

    /// The connection a lock name's calls go over.
    pub(crate) fn route(name: &str) -> usize {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        name.hash(&mut h);
        (h.finish() % POOL_SIZE as u64) as usize
    }

    /// Open the connections now (and create the schema): `connect` fails
    /// here, not at the first lock, and no renewal waits for a connection
    /// (with its authentication) while its lease runs.
    pub(crate) async fn warm(&self) -> Result<(), Fault> {
        let deadline = Instant::now() + self.settings.connect_timeout + self.settings.op_timeout;
        self.client(0, deadline).await?;
        let rest = (1..POOL_SIZE).map(|i| self.client(i, deadline));
        for opened in futures_util::future::join_all(rest).await {
            opened?;
        }
        Ok(())
    }

    /// A connection that is open now, if any (else `fallback`): for a call
    /// that no other call must be ordered with, such as a renewal round.
    pub(crate) fn open_route(&self, fallback: usize) -> usize {
        (0..POOL_SIZE)
            .map(|i| (fallback + i) % POOL_SIZE)
            .find(|&i| {
                self.slots[i]
                    .conn
                    .lock()
                    .unwrap()
                    .as_ref()
                    .is_some_and(|c| !c.client.is_closed())
            })
            .unwrap_or(fallback)
    }

    /// Run `sql` over connection `route`, sent again on a new connection if
    /// this one broke, within the operation timeout.
    pub(crate) async fn query(
        &self,
        route: usize,
        what: &str,
        sql: &str,
        params: &[Param<'_>],
    ) -> Result<Vec<Row>, Fault> {
        self.query_by(route, what, sql, params, None).await
    }

    /// [`query`](Self::query), ending by `by` if that comes first (a
    /// request that has had no answer yet ends its attempt then).
    pub(crate) async fn query_by(
        &self,
        route: usize,
        what: &str,
        sql: &str,
        params: &[Param<'_>],
        by: Option<Instant>,
    ) -> Result<Vec<Row>, Fault> {
        Ok(self.query_sent(route, what, sql, params, by).await?.0)
    }

    /// [`query_by`](Self::query_by), saying too whether the rows answer a
    /// resend after an earlier send that may have run (its reply lost): a
    /// release that then finds nothing was most likely that send's.
    pub(crate) async fn query_sent(
        &self,
        route: usize,
        what: &str,
        sql: &str,
        params: &[Param<'_>],
        by: Option<Instant>,
    ) -> Result<(Vec<Row>, bool), Fault> {
        let mut op = self.settings.op_timeout;
        let mut deadline = Instant::now() + op;
        if let Some(by) = by.filter(|by| *by < deadline) {
            deadline = by;
            op = by.saturating_duration_since(Instant::now());
        }
        let mut pause = RETRY_PAUSE;
        let mut repeated = false;
        loop {
            let conn = self.client(route, deadline).await?;
            let out = tokio::time::timeout_at(deadline, self.run(&conn, sql, params)).await;
            let fault = match out {
                Ok(Ok(rows)) => return Ok((rows, repeated)),
                Ok(Err(Failed::Unbound(e))) => {
                    // Nothing ran: sent again unnamed, on every connection
                    // from now on (a pooler hands sessions around), or on
                    // this one until the statement is prepared afresh (its
                    // plan no longer fits).
                    if is_pooled(&e) {
                        self.stop_preparing(route, &conn);
                    } else {
                        conn.prepared.lock().unwrap().remove(sql);
                    }
                    continue;
                }
                Ok(Err(Failed::Run(e))) => {
                    if e.is_closed() || conn.client.is_closed() {
                        self.drop_conn(route, &conn);
                    }
                    sql_fault(what, &e)
                }
                Err(_) => return Err(Fault::timed_out(format!("{what} on {}", self.addr), op)),
            };
            if !fault.is_transient() || Instant::now() + pause >= deadline {
                return Err(fault);
            }
            repeated |= fault.may_have_run();
            tracing::debug!(error = %fault, "lock statement failed; sending it again");
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(200));
        }
    }

    /// `sql` on `conn`: bound to its prepared statement if it has one,
    /// else typed and unnamed. On a direct connection the first run of a
    /// statement also starts preparing it, beside the call: preparing
    /// never delays a call, nor makes it fail.
    async fn run(
        &self,
        conn: &Arc<Conn>,
        sql: &str,
        params: &[Param<'_>],
    ) -> Result<Vec<Row>, Failed> {
        let statement =
            if conn.direct.load(Ordering::Relaxed) && self.may_prepare.load(Ordering::Relaxed) {
                let mut prepared = conn.prepared.lock().unwrap();
                match prepared.get(sql) {
                    Some(known) => known.clone(),
                    None => {
                        prepared.insert(sql.to_owned(), None);
                        self.prepare(conn, sql, params);
                        None
                    }
                }
            } else {
                None
            };
        let Some(statement) = statement else {
            return conn
                .client
                .query_typed(sql, params)
                .await
                .map_err(Failed::Run);
        };
        let values: Vec<&(dyn ToSql + Sync)> = params.iter().map(|(v, _)| *v).collect();
        match conn.client.query(&statement, &values).await {
            // Bound to a statement the session lacks, or whose plan no
            // longer fits: it ran nothing.
            Err(e) if is_pooled(&e) || is_stale_plan(&e) => Err(Failed::Unbound(e)),
            out => out.map_err(Failed::Run),
        }
    }

    /// Prepare `sql` on `conn` by a task of the I/O runtime, which keeps
    /// the statement when it is ready (and leaves no unknown name on the
    /// session if the caller is gone meanwhile). A failure leaves it
    /// unnamed on this connection, and a session that already has the name
    /// stops preparing everywhere (see [`is_pooled`]).
    fn prepare(&self, conn: &Arc<Conn>, sql: &str, params: &[Param<'_>]) {
        let types: Vec<Type> = params.iter().map(|(_, t)| t.clone()).collect();
        let (conn, text, may_prepare) = (conn.clone(), sql.to_owned(), self.may_prepare.clone());
        let server = self.addr.clone();
        self.io.spawn(async move {
            match conn.client.prepare_typed(&text, &types).await {
                Ok(statement) => {
                    conn.prepared.lock().unwrap().insert(text, Some(statement));
                }
                Err(e) if is_pooled(&e) => {
                    // (Said once, as `stop_preparing` says it.)
                    if may_prepare.swap(false, Ordering::Relaxed) {
                        tracing::warn!(
                            %server, error = %e,
                            "a session already had the name of a lock statement this client \
                             prepared (a pooler between?); sending lock statements unnamed from now on"
                        );
                    }
                }
                Err(e) => {
                    tracing::debug!(error = %e, "preparing a lock statement failed; it stays unnamed");
                }
            }
        });
    }

    /// Statements go unnamed from now on, on every connection: a session
    /// lacked one this client prepared on it, so something between us
    /// hands sessions around.
    fn stop_preparing(&self, route: usize, conn: &Arc<Conn>) {
        if self.may_prepare.swap(false, Ordering::Relaxed) {
            tracing::warn!(
                server = %self.addr,
                "a session did not have the lock statement prepared on it \
                 (a pooler between?); sending lock statements unnamed from now on"
            );
        }
        self.drop_conn(route, conn);
    }

    fn drop_conn(&self, route: usize, conn: &Arc<Conn>) {
        let mut slot = self.slots[route].conn.lock().unwrap();
        if slot.as_ref().is_some_and(|c| Arc::ptr_eq(c, conn)) {
            *slot = None;
        }
    }

    /// The open connection of `route`, connecting it if needed by
    /// `deadline`.
    async fn client(&self, route: usize, deadline: Instant) -> Result<Arc<Conn>, Fault> {
        let slot = &self.slots[route];
        let open = |slot: &Slot| {
            slot.conn
                .lock()
                .unwrap()
                .clone()
                .filter(|c| !c.client.is_closed())
        };
        if let Some(c) = open(slot) {
            return Ok(c);
        }
        let what = format!("connecting to PostgreSQL at {}", self.addr);
        let _gate = tokio::time::timeout_at(deadline, slot.gate.lock())
            .await
            .map_err(|_| Fault::timed_out(&what, self.settings.op_timeout))?;
        if let Some(c) = open(slot) {
            return Ok(c);
        }
        let budget = self
            .settings
            .connect_timeout
            .min(deadline.saturating_duration_since(Instant::now()))
            .max(Duration::from_millis(1));
        let (client, ends) = connect(&self.config, &self.tls, &self.io, budget, &what).await?;
        let conn = Arc::new(Conn {
            client,
            direct: AtomicBool::new(false),
            prepared: Mutex::default(),
        });
        if let Some(ends) = ends.filter(|_| self.may_prepare.load(Ordering::Relaxed)) {
            // Found out beside the calls.
            let found = conn.clone();
            self.io.spawn(async move {
                if reaches_the_server(&found.client, ends).await {
                    found.direct.store(true, Ordering::Relaxed);
                }
            });
        }
        let client = &conn.client;
        self.installed
            .get_or_try_init(|| async {
                tokio::time::timeout_at(deadline, schema::install(client))
                    .await
                    .map_err(|_| {
                        Fault::timed_out("creating the lock tables", self.settings.op_timeout)
                    })?
            })
            .await?;
        *slot.conn.lock().unwrap() = Some(conn.clone());
        Ok(conn)
    }
}

/// How a statement failed: bound to a prepared statement the session
/// could not run (nothing ran), or running.
enum Failed {
    Unbound(tokio_postgres::Error),
    Run(tokio_postgres::Error),
}

/// The session lacks a statement this client prepared on it, has one of
/// that name already, or bound the name to a statement of other parameters
/// (their count, or their binary form): something between us hands
/// sessions around.
fn is_pooled(e: &tokio_postgres::Error) -> bool {
    [
        SqlState::INVALID_SQL_STATEMENT_NAME,
        SqlState::DUPLICATE_PSTATEMENT,
        SqlState::PROTOCOL_VIOLATION,
        SqlState::INVALID_BINARY_REPRESENTATION,
    ]
    .iter()
    .any(|code| e.code() == Some(code))
}

/// The statement's plan no longer fits (the function was replaced under
/// it): the server says so before running anything.
fn is_stale_plan(e: &tokio_postgres::Error) -> bool {
    e.code() == Some(&SqlState::FEATURE_NOT_SUPPORTED)
        && e.as_db_error()
            .and_then(|d| d.routine())
            .is_some_and(|r| r == "RevalidateCachedQuery")
}

/// Open one connection within `budget`, its task on `io`; with the ends of
/// its socket where the client opened that itself (`direct.rs`).
pub(crate) async fn connect(
    config: &tokio_postgres::Config,
    tls: &Tls,
    io: &Handle,
    budget: Duration,
    what: &str,
) -> Result<(Client, Option<Ends>), Fault> {
    let mut config = config.clone();
    config.connect_timeout(budget);
    let tls = tls.clone();
    let opened = io.spawn(async move {
        /// The connection's task: it carries every statement of `client`.
        fn drive<F>(connection: F)
        where
            F: std::future::Future<Output = Result<(), tokio_postgres::Error>> + Send + 'static,
        {
            tokio::spawn(async move {
                if let Err(e) = connection.await {
                    tracing::debug!(error = %e, "lock connection to PostgreSQL ended");
                }
            });
        }
        if let Some((host, port, hostaddr)) = single_tcp_server(&config) {
            let (stream, ends) = open_socket(&host, port, hostaddr, config.get_keepalives())
                .await
                .map_err(Opening::Socket)?;
            let client = match tls {
                Tls::Off => {
                    let (client, connection) = config.connect_raw(stream, NoTls).await?;
                    drive(connection);
                    client
                }
                #[cfg(feature = "tls")]
                Tls::On(mut tls) => {
                    use tokio_postgres::tls::MakeTlsConnect;
                    let connect =
                        MakeTlsConnect::<tokio::net::TcpStream>::make_tls_connect(&mut tls, &host)
                            .map_err(Opening::Socket)?;
                    let (client, connection) = config.connect_raw(stream, connect).await?;
                    drive(connection);
                    client
                }
            };
            return Ok::<_, Opening>((client, Some(ends)));
        }
        let client = match tls {
            Tls::Off => {
                let (client, connection) = config.connect(NoTls).await?;
                drive(connection);
                client
            }
            #[cfg(feature = "tls")]
            Tls::On(tls) => {
                let (client, connection) = config.connect(tls).await?;
                drive(connection);
                client
            }
        };
        Ok((client, None))
    });
    match tokio::time::timeout(budget, opened).await {
        Ok(Ok(Ok(opened))) => Ok(opened),
        Ok(Ok(Err(Opening::Sql(e)))) => Err(connect_fault(what, &e)),
        Ok(Ok(Err(Opening::Socket(e)))) => Err(io_fault(what, &e)),
        Ok(Err(_)) => Err(Fault::other(format!(
            "{what}: the lock client's I/O thread has stopped"
        ))),
        Err(_) => Err(Fault::timed_out(what, budget)),
    }
}

/// How opening a connection failed.
enum Opening {
    Socket(std::io::Error),
    Sql(tokio_postgres::Error),
}

impl From<tokio_postgres::Error> for Opening {
    fn from(e: tokio_postgres::Error) -> Self {
        Opening::Sql(e)
    }
}
