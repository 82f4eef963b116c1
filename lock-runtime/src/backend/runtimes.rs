//! One connection to a Redis server per runtime that uses the client,
//! driven by that runtime.
//!
//! A command sent from a task is answered on that task's own runtime: the
//! connection's driver runs there, so the reply wakes the caller without a
//! hop to another thread. The connection is opened on first use from a
//! runtime (with that runtime entered, so its driver lives there), opened
//! again there after it broke, and gone with that runtime: an idle task on
//! it notices the runtime shutting down. What must outlive a caller (the
//! watchdog, background releases) keeps the client's own connection on its
//! I/O thread.
//!
//! So a client holds at most one connection per server for each live
//! runtime that used it, plus the I/O thread's own.
//!
//! An undo follows its attempt ([`Runtimes::find`]): over the same
//! connection, behind it. A connection that ended (closed with its runtime,
//! or broken) may still have sent Redis an attempt it has not run yet, and
//! Redis would run it whenever it reads it: such a connection is killed
//! first (`CLIENT KILL ID … ADDR …`, with the identity `CLIENT INFO` gave
//! when it opened), after which Redis runs nothing more it sent, and only
//! then does an undo go over another connection.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use redis::AsyncConnectionConfig;
use tokio::runtime::{Handle, Id};
use tokio::sync::{oneshot, OnceCell};

use crate::own_keys::OwnKeys;

/// How long a runtime that went away is remembered: the undo of an attempt
/// it sent looks for its connections there.
const REMEMBERED: Duration = Duration::from_secs(60);

/// Ended connections remembered per runtime until an undo kills them.
const MAX_ENDED: usize = 8;

/// The connections to one server, by runtime.
pub(crate) struct Runtimes {
    client: redis::Client,
    config: AsyncConnectionConfig,
    /// How long opening a connection may take, `CLIENT INFO` included: a
    /// stalled open must not hold every command of its runtime.
    open_within: Duration,
    by_id: Mutex<HashMap<Id, Arc<Local>, OwnKeys>>,
}

/// One runtime's connection to the server.
pub(crate) struct Local {
    state: Mutex<State>,
    /// The runtime that drives these connections.
    handle: Handle,
    /// Dropped with this: ends the task that watches the runtime.
    _watching: oneshot::Sender<()>,
}

struct State {
    /// The connection in use, or being opened.
    current: Arc<OnceCell<Conn>>,
    /// When the runtime went away (it drives nothing any more).
    gone: Option<Instant>,
    /// Connections of this runtime that ended, which may still have sent
    /// Redis a command it has not run (`None`: one Redis cannot name).
    ended: Vec<Option<Identity>>,
    /// One of them was forgotten unkilled (more than [`MAX_ENDED`] ended
    /// at once): from then on an undo cannot count on kills alone.
    forgot: bool,
}

/// One connection, and who Redis says it is.
#[derive(Clone)]
pub(crate) struct Conn {
    pub(crate) conn: MultiplexedConnection,
    who: Option<Identity>,
}

/// A connection as Redis knows it (`CLIENT INFO`): its client id, and its
/// address seen from the server, which no later connection that may reuse
/// the id (after a restart) shares.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Identity {
    pub(crate) id: i64,
    pub(crate) addr: String,
}

impl Identity {
    /// From a `CLIENT INFO` line (`id=7 addr=127.0.0.1:5000 laddr=…`).
    fn parse(info: &str) -> Option<Identity> {
        let field = |name: &str| {
            info.split_ascii_whitespace()
                .find_map(|f| f.strip_prefix(name)?.strip_prefix('='))
        };
        Some(Identity {
            id: field("id")?.parse().ok()?,
            addr: field("addr")?.to_owned(),
        })
    }
}

/// A connection picked for a command, and where it came from.
pub(crate) struct Picked {
    local: Arc<Local>,
    cell: Arc<OnceCell<Conn>>,
    pub(crate) conn: MultiplexedConnection,
}

impl Picked {
    /// The state of the runtime this connection belongs to.
    pub(crate) fn local(&self) -> &Arc<Local> {
        &self.local
    }

    /// The connection broke under a command: the next one opens another.
    pub(crate) fn broke(&self) {
        self.local.retire(&self.cell);
    }
}

impl Runtimes {
    /// `config` must have no response timeout: every command's caller sets
    /// its own deadline.
    pub(crate) fn new(
        client: redis::Client,
        config: AsyncConnectionConfig,
        open_within: Duration,
    ) -> Self {
        Runtimes {
            client,
            config,
            open_within,
            by_id: Mutex::default(),
        }
    }

    /// The connection of `caller`'s runtime, opened there if it has none;
    /// `None` if that runtime is going away (the I/O thread's connection
    /// serves its last commands).
    pub(crate) async fn pick(&self, caller: &Handle) -> Option<redis::RedisResult<Picked>> {
        let local = self.local(caller)?;
        let cell = local.current()?;
        if let Some(c) = cell.get() {
            return Some(Ok(Picked {
                conn: c.conn.clone(),
                local,
                cell,
            }));
        }
        // Opened by a task of that runtime (its driver is spawned there),
        // not by this caller: a command whose time ran out while the
        // connection was being made does not throw the half-made
        // connection away, and the next command waits for the same one
        // instead of starting over. Where every reply is slow, opening
        // (a handshake, then `CLIENT INFO`) takes longer than one command.
        let opening = {
            let cell = cell.clone();
            let open = open(self.client.clone(), self.config.clone(), self.open_within);
            caller.spawn(async move { cell.get_or_try_init(|| open).await.map(|c| c.conn.clone()) })
        };
        let opened = opening.await.unwrap_or_else(|e| {
            Err(redis::RedisError::from(std::io::Error::other(format!(
                "opening a connection: {e}"
            ))))
        });
        Some(opened.map(|conn| Picked { local, cell, conn }))
    }

    /// The connection state of the runtime with this id, live or gone
    /// recently (for an undo).
    pub(crate) fn find(&self, id: Id) -> Option<Arc<Local>> {
        self.by_id.lock().unwrap().get(&id).cloned()
    }

    fn local(&self, caller: &Handle) -> Option<Arc<Local>> {
        let id = caller.id();
        let mut by_id = self.by_id.lock().unwrap();
        if let Some(local) = by_id.get(&id) {
            // Whether it still lives, `current` says (one lock fewer a
            // command).
            return Some(local.clone());
        }
        // A new runtime: forget those gone long enough ago.
        let now = Instant::now();
        by_id.retain(|_, l| l.gone_at().is_none_or(|t| now - t < REMEMBERED));
        let (watching, ended) = oneshot::channel();
        let local = Arc::new(Local {
            state: Mutex::new(State {
                current: Arc::new(OnceCell::new()),
                gone: None,
                ended: Vec::new(),
                forgot: false,
            }),
            handle: caller.clone(),
            _watching: watching,
        });
        by_id.insert(id, local.clone());
        drop(by_id);
        // Dropped when the runtime shuts down (at once if it already is),
        // or ends when this connection state is dropped.
        let watch = Watch(Arc::downgrade(&local));
        caller.spawn(async move {
            let _watch = watch;
            let _ = ended.await;
        });
        local.is_live().then_some(local)
    }
}

/// Open a connection (in the runtime that is to drive it) and learn who
/// it is (`CLIENT INFO`: Redis 6.2 and later).
/// Bounded by `within`: a failed open leaves the cell empty, and the next
/// command opens anew.
async fn open(
    client: redis::Client,
    config: AsyncConnectionConfig,
    within: Duration,
) -> redis::RedisResult<Conn> {
    let open = async {
        let mut conn = client
            .get_multiplexed_async_connection_with_config(&config)
            .await?;
        let who = redis::cmd("CLIENT")
            .arg("INFO")
            .query_async::<String>(&mut conn)
            .await
            .ok()
            .and_then(|info| Identity::parse(&info));
        Ok(Conn { conn, who })
    };
    tokio::time::timeout(within, open)
        .await
        .unwrap_or_else(|_| {
            Err(redis::RedisError::from(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("opening a connection took longer than {within:?}"),
            )))
        })
}

impl Local {
    fn is_live(&self) -> bool {
        self.state.lock().unwrap().gone.is_none()
    }

    fn gone_at(&self) -> Option<Instant> {
        self.state.lock().unwrap().gone
    }

    /// The connection in use or being opened, unless the runtime is gone.
    fn current(&self) -> Option<Arc<OnceCell<Conn>>> {
        let state = self.state.lock().unwrap();
        state.gone.is_none().then(|| state.current.clone())
    }

    /// The open connection a command of this runtime would go on now, if
    /// the runtime still drives one.
    pub(crate) fn open_conn(self: &Arc<Self>) -> Option<Picked> {
        let cell = self.current()?;
        let conn = cell.get()?.conn.clone();
        Some(Picked {
            local: self.clone(),
            cell,
            conn,
        })
    }

    /// The connections of this runtime that ended, which an undo must
    /// kill before it goes over another one.
    pub(crate) fn ended(&self) -> Vec<Option<Identity>> {
        let state = self.state.lock().unwrap();
        let mut ended = state.ended.clone();
        if state.forgot {
            ended.push(None);
        }
        ended
    }

    /// Resolves once this runtime has not run a task within `every`: it
    /// lives but rests (a current-thread runtime between two `block_on`s),
    /// or is shutting down, and drives none of its connections. A runtime
    /// that runs keeps this pending, however slow its connection is.
    pub(crate) async fn resting(&self, every: Duration) {
        loop {
            let (ran, probe) = oneshot::channel();
            self.handle.spawn(async move {
                let _ = ran.send(());
            });
            if !matches!(tokio::time::timeout(every, probe).await, Ok(Ok(()))) {
                return;
            }
            tokio::time::sleep(every).await;
        }
    }

    /// Whether a connection of this runtime ended unkilled, one Redis can
    /// be asked to kill.
    pub(crate) fn has_ended(&self) -> bool {
        self.state.lock().unwrap().ended.iter().any(Option::is_some)
    }

    /// Redis refused to kill this ended connection (an ACL without
    /// `CLIENT KILL`): not asked again; an undo goes twice instead.
    pub(crate) fn unkillable(&self, who: &Identity) {
        for w in &mut self.state.lock().unwrap().ended {
            if w.as_ref() == Some(who) {
                *w = None;
            }
        }
    }

    /// This ended connection was killed: nothing it sent runs any more.
    pub(crate) fn killed(&self, who: &Identity) {
        self.state
            .lock()
            .unwrap()
            .ended
            .retain(|w| w.as_ref() != Some(who));
    }

    /// The connection of `cell` broke (Redis closed it, or the network
    /// did): the next command opens another.
    fn retire(&self, cell: &Arc<OnceCell<Conn>>) {
        let mut state = self.state.lock().unwrap();
        if Arc::ptr_eq(&state.current, cell) {
            state.current = Arc::new(OnceCell::new());
            state.end(cell);
        }
    }

    /// The runtime shut down: its connection went with it.
    fn gone(&self) {
        let mut state = self.state.lock().unwrap();
        if state.gone.is_some() {
            return;
        }
        state.gone = Some(Instant::now());
        let current = std::mem::replace(&mut state.current, Arc::new(OnceCell::new()));
        state.end(&current);
    }
}

impl State {
    /// Remember the connection of `cell`, if it was open.
    fn end(&mut self, cell: &OnceCell<Conn>) {
        if let Some(conn) = cell.get() {
            if self.ended.len() == MAX_ENDED {
                self.forgot |= self.ended.remove(0).is_some();
            }
            self.ended.push(conn.who.clone());
        }
    }
}

/// Lives as a task on a runtime that has a connection: dropped, that
/// runtime is shutting down.
struct Watch(Weak<Local>);

impl Drop for Watch {
    fn drop(&mut self) {
        if let Some(local) = self.0.upgrade() {
            local.gone();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Identity;

    #[test]
    fn a_connection_is_known_by_its_id_and_address() {
        let info = "id=42 addr=127.0.0.1:51234 laddr=127.0.0.1:6379 fd=8 name= age=0";
        assert_eq!(
            Identity::parse(info),
            Some(Identity {
                id: 42,
                addr: "127.0.0.1:51234".into()
            })
        );
        assert_eq!(Identity::parse("laddr=1.2.3.4:5 id=x"), None);
    }
}
