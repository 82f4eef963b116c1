//! A primary found through Redis Sentinel, followed across failovers.
//!
//! The sentinels are asked for the primary's address (`SENTINEL
//! get-master-addr-by-name`) at start-up, every second in the background, and
//! again whenever a command fails (connection lost, timeout, `READONLY` from
//! a demoted primary). Locks live on the primary exactly as with a single
//! Redis server.
//!
//! Replication is asynchronous: a lock the old primary granted but had not
//! yet sent to the replica is gone after a failover. With
//! [`replica_acks`](crate::LockClientBuilder::replica_acks) an acquire is
//! followed by `WAIT k timeout` in the same round trip, and only reports
//! the lock held once `k` replicas have it,
//! and each renewal tick ends with a `WAIT` in its pipeline: a renewal moves
//! the holder's deadline only once `k` replicas have it, so a promoted
//! replica never lets the lock go before its holder counts it gone.
//!
//! What the client ended on an old primary after its replica was promoted
//! (a planned failover leaves it answering for seconds) is sent again to
//! the new one once the client follows (`sentinel/journal.rs`).

mod journal;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::runtime::Handle;
use tokio::time::Instant;

use super::endpoint;
use super::fault::Fault;
use super::node::{NodeSettings, RedisNode, Wake};
use super::pubsub::Subscriber;
use super::{Acquired, Queue, Released, Renewal, Renewed, Seen};
use crate::key::LockName;
use crate::wakeups::Waiter;
use journal::{Ended, Entry, Journal};

/// How often the sentinels are asked whether the primary moved, even when
/// nothing failed: a restarted old primary may answer before it is demoted.
const REFRESH: Duration = Duration::from_secs(1);

/// Releases sent side by side when a new primary is told what was ended
/// on the old one.
const REPLAY_AT_ONCE: usize = 32;

/// The primary as last discovered.
struct Primary {
    addr: String,
    node: RedisNode,
    /// A connection of its own for acquires followed by WAIT: WAIT blocks
    /// its connection, and renewals must not queue behind it.
    acks_node: Option<RedisNode>,
    /// With `replica_acks`, the renewals and their WAIT: on a connection
    /// of their own too, so that nothing else waits behind a tick.
    renew_node: Option<RedisNode>,
    subscriber: Subscriber,
    /// What the client ended here lately (see `sentinel/journal.rs`).
    journal: Journal,
}

struct Shared {
    sentinels: Vec<String>,
    master: String,
    settings: NodeSettings,
    acks: Option<(usize, Duration)>,
    io: Handle,
    current: Mutex<Arc<Primary>>,
    /// One discovery at a time; the time of the last one.
    discovery: tokio::sync::Mutex<Instant>,
    /// When a sentinel last named the primary.
    answered_at: Mutex<Instant>,
    /// The longest lease or queue stay asked for, in ms: how long a copy
    /// of a hold or a queue entry may outlive its last write.
    longest_ms: AtomicU64,
}

pub(crate) struct SentinelBackend {
    shared: Arc<Shared>,
}

impl SentinelBackend {
    pub(crate) async fn connect(
        sentinels: Vec<String>,
        master: String,
        settings: NodeSettings,
        acks: Option<(usize, Duration)>,
        io: Handle,
    ) -> Result<Self, Fault> {
        for url in &sentinels {
            endpoint::sentinel(url, &settings.access)?;
        }
        // Asking and connecting share one budget: an unreachable deployment
        // is an error within seconds, never a hang.
        let budget = settings.connect_timeout + settings.op_timeout;
        let primary = tokio::time::timeout(budget, async {
            let addr = ask_sentinels(&sentinels, &master, &settings).await?;
            open_primary(&sentinels[0], &addr, &settings, acks, &io).await
        })
        .await
        .map_err(|_| {
            Fault::timed_out(
                format!("finding master `{master}` through Sentinel"),
                budget,
            )
        })??;
        let shared = Arc::new(Shared {
            sentinels,
            master,
            settings,
            acks,
            io: io.clone(),
            current: Mutex::new(Arc::new(primary)),
            discovery: tokio::sync::Mutex::new(Instant::now()),
            longest_ms: AtomicU64::new(0),
            answered_at: Mutex::new(Instant::now()),
        });
        io.spawn(refresh(Arc::downgrade(&shared)));
        Ok(SentinelBackend { shared })
    }
}

/// Re-discover in the background until the backend is dropped.
async fn refresh(shared: Weak<Shared>) {
    loop {
        tokio::time::sleep(REFRESH).await;
        let Some(shared) = shared.upgrade() else {
            return;
        };
        let _ = shared.rediscover(None).await;
    }
}

/// The primary's `host:port` according to the first sentinel (in the
/// order given) that knows; all are asked at once.
async fn ask_sentinels(
    sentinels: &[String],
    master: &str,
    settings: &NodeSettings,
) -> Result<(String, u16), Fault> {
    let limit = settings.connect_timeout + settings.op_timeout;
    let answers = futures_util::future::join_all(sentinels.iter().map(|url| async move {
        let ask = async {
            let client = endpoint::sentinel(url, &settings.access).map_err(|e| e.to_string())?;
            let mut conn = client
                .get_multiplexed_async_connection()
                .await
                .map_err(|e| e.to_string())?;
            redis::cmd("SENTINEL")
                .arg("get-master-addr-by-name")
                .arg(master)
                .query_async::<Option<(String, u16)>>(&mut conn)
                .await
                .map_err(|e| e.to_string())
        };
        match tokio::time::timeout(limit, ask).await {
            Ok(Ok(Some((host, port)))) => Ok((host, port)),
            Ok(Ok(None)) => Err(format!(
                "{}: does not know master `{master}`",
                endpoint::redact(url)
            )),
            Ok(Err(e)) => Err(format!("{}: {e}", endpoint::redact(url))),
            Err(_) => Err(format!(
                "{}: no answer within {limit:?}",
                endpoint::redact(url)
            )),
        }
    }))
    .await;
    let mut why = Vec::new();
    for a in answers {
        match a {
            Ok(addr) => return Ok(addr),
            Err(e) => why.push(e),
        }
    }
    Err(Fault::other(format!(
        "no sentinel gave the address of master `{master}`: {}",
        why.join("; ")
    )))
}

/// Connect to the primary at `host:port`, the way the Sentinel URL `via`
/// says (TLS, credentials, database).
async fn open_primary(
    via: &str,
    (host, port): &(String, u16),
    settings: &NodeSettings,
    acks: Option<(usize, Duration)>,
    io: &Handle,
) -> Result<Primary, Fault> {
    let addr = format!("{host}:{port}");
    let info = endpoint::data_node(via, host, *port)?;
    let node = RedisNode::connect_to(info.clone(), settings.clone()).await?;
    // Sentinel may still name a primary that has just been demoted.
    let role: Vec<redis::Value> = node
        .command(redis::cmd("ROLE"), "asking the primary's role")
        .await?;
    let is_master = matches!(role.first(), Some(redis::Value::BulkString(r)) if r == b"master");
    if !is_master {
        return Err(Fault::other(format!(
            "Sentinel names {addr} as primary but it is a replica (failover in progress?)"
        )));
    }
    let (acks_node, renew_node) = match acks {
        Some(acks @ (_, wait)) => {
            let settings = NodeSettings {
                op_timeout: settings.op_timeout + wait,
                ..settings.clone()
            };
            (
                Some(
                    RedisNode::connect_to(info.clone(), settings.clone())
                        .await?
                        .with_acks(acks),
                ),
                Some(RedisNode::connect_to(info.clone(), settings).await?),
            )
        }
        None => (None, None),
    };
    Ok(Primary {
        subscriber: Subscriber::new_to(info, settings.clone(), io.clone())?,
        addr,
        node,
        acks_node,
        renew_node,
        journal: Journal::default(),
    })
}

impl Primary {
    /// Renew a batch here; with `replica_acks`, confirmed by the replicas
    /// (see [`RedisNode::renew_acked`]).
    async fn renew(&self, batch: &[Renewal], acks: Option<(usize, Duration)>) -> Vec<Renewed> {
        match (&self.renew_node, acks) {
            (Some(node), Some(acks)) => node.renew_acked(batch, acks).await,
            _ => self.node.renew(batch).await,
        }
    }
}

/// Whether an error may mean the primary moved.
fn may_have_moved(e: &Fault) -> bool {
    match e {
        Fault::Redis { source, .. } => {
            source.is_io_error()
                || source.is_connection_dropped()
                || source.is_connection_refusal()
                || source.is_timeout()
                || matches!(source.code(), Some("READONLY" | "MASTERDOWN" | "LOADING"))
        }
        Fault::Timeout { .. } | Fault::Other(_) | Fault::Unavailable(_) => true,
        // (The primary answered; its owner id must not be sent again.)
        Fault::GivenBack { .. } | Fault::Config(_) | Fault::Sql { .. } => false,
    }
}

impl Shared {
    fn current(&self) -> Arc<Primary> {
        self.current.lock().unwrap().clone()
    }

    /// A lease or queue stay of `d` was asked for.
    fn asked_for(&self, d: Duration) {
        let ms = u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        self.longest_ms.fetch_max(ms, Ordering::Relaxed);
    }

    /// How long what was ended on a primary is kept for a new one.
    fn keep_for(&self) -> Duration {
        Duration::from_millis(self.longest_ms.load(Ordering::Relaxed))
    }

    /// `owner`'s hold or queue entry of `name` was ended on `on`: noted
    /// there, or, if the client left `on` meanwhile, ended on the current
    /// primary too.
    async fn ended(&self, on: &Arc<Primary>, name: &LockName, owner: &Arc<str>, how: Ended) {
        if !on.journal.note(name, owner, how, self.keep_for()) {
            let _ = end_on(&self.current(), name, owner, how).await;
        }
    }

    /// Ask the sentinels again; switch if the primary moved. `failed` is
    /// the primary a failed command went to and when that command started:
    /// if the primary was replaced or the sentinels were asked since, that
    /// answer stands. Returns the current primary.
    async fn rediscover(
        &self,
        failed: Option<(&Arc<Primary>, Instant)>,
    ) -> Result<Arc<Primary>, Fault> {
        let mut last = self.discovery.lock().await;
        let now = self.current();
        if let Some((seen, started)) = failed {
            if !Arc::ptr_eq(seen, &now) || *last >= started {
                return Ok(now);
            }
        }
        *last = Instant::now();
        let found = ask_sentinels(&self.sentinels, &self.master, &self.settings).await?;
        *self.answered_at.lock().unwrap() = Instant::now();
        let addr = format!("{}:{}", found.0, found.1);
        if addr == now.addr {
            return Ok(now);
        }
        let primary = Arc::new(
            open_primary(
                &self.sentinels[0],
                &found,
                &self.settings,
                self.acks,
                &self.io,
            )
            .await?,
        );
        tracing::warn!(from = %now.addr, to = %addr, master = %self.master, "Sentinel failover: following the new primary");
        *self.current.lock().unwrap() = primary.clone();
        // Ended on the old primary, maybe after the promotion: the new one
        // may still have it (see `sentinel/journal.rs`).
        let ended = now.journal.leave(self.keep_for());
        if !ended.is_empty() {
            self.io.spawn(replay(primary.clone(), ended));
        }
        // Waiters listening on the old primary would hear nothing more:
        // wake them to subscribe again on the new one.
        now.subscriber.retire();
        Ok(primary)
    }

    /// Re-discover after `primary` failed a command that began at `started`,
    /// within one operation timeout.
    async fn after_failure(
        &self,
        primary: &Arc<Primary>,
        started: Instant,
    ) -> Option<Arc<Primary>> {
        let limit = self.settings.op_timeout;
        match tokio::time::timeout(limit, self.rediscover(Some((primary, started)))).await {
            Ok(Ok(next)) if !Arc::ptr_eq(&next, primary) => Some(next),
            _ => None,
        }
    }

    /// Run `op` on the primary; if it failed in a way that may mean the
    /// primary moved and it did, run it once more on the new one.
    async fn on_primary<T, F, Fut>(&self, op: F) -> Result<T, Fault>
    where
        F: Fn(Arc<Primary>) -> Fut,
        Fut: std::future::Future<Output = Result<T, Fault>>,
    {
        self.on_primary_by(None, op).await
    }

    /// [`on_primary`](Self::on_primary), with no second try once `by` has
    /// passed.
    async fn on_primary_by<T, F, Fut>(&self, by: Option<Instant>, op: F) -> Result<T, Fault>
    where
        F: Fn(Arc<Primary>) -> Fut,
        Fut: std::future::Future<Output = Result<T, Fault>>,
    {
        let (first, started) = (self.current(), Instant::now());
        match op(first.clone()).await {
            Err(e) if by.is_some_and(|by| Instant::now() >= by) => Err(self.failing_over(e)),
            Err(e) if may_have_moved(&e) => match self.after_failure(&first, started).await {
                Some(next) => op(next).await,
                None => Err(self.failing_over(e)),
            },
            other => other,
        }
    }

    /// A primary that could not be reached while the sentinels still
    /// answer is a failover under way (or one that cannot happen yet): the
    /// deployment is there, and a call keeps trying while its wait lasts
    /// (see [`Fault::reached`]). With the sentinels silent too, `e` as it
    /// is: the call ends as against one unreachable Redis.
    fn failing_over(&self, e: Fault) -> Fault {
        let answered = self.answered_at.lock().unwrap().elapsed();
        let recent = 2 * REFRESH + self.settings.connect_timeout + self.settings.op_timeout;
        if e.reached() || !may_have_moved(&e) || answered > recent {
            return e;
        }
        Fault::unavailable(format!(
            "{e} (the sentinels answer for master `{}`: a failover under way?)",
            self.master
        ))
    }

    async fn acquire(
        &self,
        name: &LockName,
        owner: &Arc<str>,
        lease: Duration,
        queue: Queue,
    ) -> Result<Acquired, Fault> {
        self.asked_for(lease.max(queue.stay.unwrap_or_default()));
        if queue.by.is_none() {
            // A request that saw its lock busy sends each attempt with one
            // operation's time (its last one at its deadline): a second
            // try on a new primary after the first timed out would run up
            // to two operations more past that deadline. So the attempt
            // ends within one operation of its start, the `WAIT`
            // included; while the wait lasts, the next attempt goes to the
            // primary the sentinels name by then.
            let budget = self.settings.op_timeout + self.acks.map_or(Duration::ZERO, |(_, w)| w);
            let until = Instant::now() + budget;
            let attempt = self.acquire_on_primary(Some(until), name, owner, lease, queue);
            return match tokio::time::timeout_at(until, attempt).await {
                Ok(out) => out,
                Err(_) => Err(Fault::timed_out(
                    format!("taking lock `{}` behind Sentinel", name.key),
                    budget,
                )),
            };
        }
        self.acquire_on_primary(queue.by, name, owner, lease, queue)
            .await
    }

    /// [`acquire`](Self::acquire) on the primary, once more on a new one
    /// if it moved before `by`.
    async fn acquire_on_primary(
        &self,
        by: Option<Instant>,
        name: &LockName,
        owner: &Arc<str>,
        lease: Duration,
        queue: Queue,
    ) -> Result<Acquired, Fault> {
        self.on_primary_by(by, |p| async move {
            let Some((replicas, _)) = self.acks else {
                return p.node.acquire(name, owner, lease, None, queue).await;
            };
            // The acquire and its WAIT in one round trip, on a connection
            // of their own (WAIT blocks it). A repeat (an earlier send's
            // reply was lost) waits too: its PEXPIRE is a write on this
            // connection, so replicas that acknowledge it also have the lock.
            let node = p.acks_node.as_ref().unwrap_or(&p.node);
            match node.acquire(name, owner, lease, None, queue).await {
                Err(Fault::Unavailable(got)) => {
                    // Behind the acquire on its connection: sent on
                    // another, it could overtake it. Journalled, so a
                    // failover sends it again: this owner id is spent,
                    // and the request goes on under a new one.
                    let released = node.release(name, owner, Wake::IfReleased).await.is_ok();
                    self.ended(&p, name, owner, Ended::Released).await;
                    Err(Fault::GivenBack {
                        message: format!(
                            "lock `{}` was taken on primary {} but {got} of the {replicas} replicas required; it was released (replicas lagging or down?)",
                            name.key, p.addr
                        ),
                        released,
                    })
                }
                other => other,
            }
        })
        .await
    }
}

impl SentinelBackend {
    pub(crate) async fn acquire(
        &self,
        name: &LockName,
        owner: &Arc<str>,
        lease: Duration,
        queue: Queue,
    ) -> Result<Acquired, Fault> {
        self.shared.acquire(name, owner, lease, queue).await
    }

    pub(crate) async fn release(
        &self,
        name: &LockName,
        owner: &Arc<str>,
    ) -> Result<Released, Fault> {
        let (first, started) = (self.shared.current(), Instant::now());
        let out = first.node.release(name, owner, Wake::IfReleased).await;
        let out = self
            .release_on_new_primary(&first, started, name, owner, out)
            .await;
        self.shared
            .ended(&first, name, owner, Ended::Released)
            .await;
        out
    }

    /// A release that failed as if the primary moved is sent again to the
    /// new one, if there is one; `out` otherwise.
    async fn release_on_new_primary(
        &self,
        first: &Arc<Primary>,
        started: Instant,
        name: &LockName,
        owner: &Arc<str>,
        out: Result<Released, Fault>,
    ) -> Result<Released, Fault> {
        match out {
            Err(e) if may_have_moved(&e) => match self.shared.after_failure(first, started).await {
                Some(next) => match next.node.release(name, owner, Wake::IfReleased).await {
                    // The first send may have released it (and the new
                    // primary has that, or never had the lock).
                    Ok(Released::NotOwner) if e.may_have_run() => Ok(Released::Freed),
                    other => other,
                },
                None => Err(e),
            },
            other => other,
        }
    }

    /// With `replica_acks`, acquires go on a connection of their own:
    /// their undo follows them there, so that it reaches Redis after the
    /// acquire it takes back, however slow that one is.
    pub(crate) async fn undo(&self, name: &LockName, owner: &Arc<str>) -> Result<Released, Fault> {
        let (first, started) = (self.shared.current(), Instant::now());
        let Some(acks) = first.acks_node.as_ref() else {
            return self.release(name, owner).await;
        };
        let out = match acks.release(name, owner, Wake::IfReleased).await {
            // Only a new primary is asked on another connection (it has
            // whatever survived the failover); on the same primary, the
            // main connection could overtake the acquire still on this one.
            Err(e) if may_have_moved(&e) => {
                match self.shared.after_failure(&first, started).await {
                    Some(next) => next.node.release(name, owner, Wake::IfReleased).await,
                    None => Err(e),
                }
            }
            other => other,
        };
        self.shared
            .ended(&first, name, owner, Ended::Released)
            .await;
        out
    }

    pub(crate) async fn release_writer(
        &self,
        name: &LockName,
        owner: &Arc<str>,
        fence: u64,
    ) -> Result<Released, Fault> {
        let (first, started) = (self.shared.current(), Instant::now());
        let out = first.node.release_writer(name, owner, fence).await;
        let out = self
            .release_on_new_primary(&first, started, name, owner, out)
            .await;
        self.shared
            .ended(&first, name, owner, Ended::Released)
            .await;
        out
    }

    /// Not waited for by the replicas: `keep` never extends a hold (it
    /// renames it and only shortens its expiry; a `min_hold` past the lease
    /// is stretched to by a renewal first, which is acknowledged), so a
    /// replica without it keeps the lock until the last acknowledged
    /// renewal, no earlier than the holder counted on.
    pub(crate) async fn keep(
        &self,
        name: &LockName,
        owner: &Arc<str>,
        left: Duration,
    ) -> Result<Released, Fault> {
        // Idempotent: sent again on the new primary if the old one failed.
        let (first, until) = (self.shared.current(), Instant::now() + left);
        self.shared.asked_for(left);
        let out = self
            .shared
            .on_primary(|p| async move { p.node.keep(name, owner, left).await })
            .await;
        self.shared
            .ended(&first, name, owner, Ended::Kept { until })
            .await;
        out
    }

    pub(crate) async fn renew(&self, batch: Vec<Renewal>) -> Vec<Renewed> {
        let shared = &self.shared;
        if let Some(longest) = batch.iter().map(|r| r.lease).max() {
            shared.asked_for(longest);
        }
        let (first, started) = (shared.current(), Instant::now());
        let out = first.renew(&batch, shared.acks).await;
        let failed = out
            .iter()
            .find_map(|r| match r {
                Renewed::Failed(e) => Some(may_have_moved(e)),
                _ => None,
            })
            .unwrap_or(false);
        if !failed {
            return out;
        }
        match shared.after_failure(&first, started).await {
            Some(next) => next.renew(&batch, shared.acks).await,
            None => out,
        }
    }

    pub(crate) async fn subscribe(
        &self,
        name: &LockName,
        owner: &Arc<str>,
    ) -> Result<(Waiter, bool), Fault> {
        self.shared
            .on_primary(|p| async move { p.subscriber.subscribe(name, Some(owner)).await })
            .await
    }

    pub(crate) async fn still_queued(
        &self,
        name: &LockName,
        owner: &Arc<str>,
    ) -> Result<bool, Fault> {
        self.shared
            .on_primary(|p| async move { p.node.still_queued(name, owner).await })
            .await
    }

    pub(crate) fn waiting(&self, name: &LockName) -> usize {
        self.shared.current().subscriber.waiting(name)
    }

    pub(crate) fn grants_need_confirming(&self) -> bool {
        self.shared.acks.is_some()
    }
}

/// End `owner`'s hold or queue entry of `name` on `primary` as it was
/// ended on another.
async fn end_on(
    primary: &Primary,
    name: &LockName,
    owner: &Arc<str>,
    how: Ended,
) -> Result<Released, Fault> {
    match how {
        Ended::Kept { until } if until > Instant::now() => {
            let left = until.saturating_duration_since(Instant::now());
            primary.node.keep(name, owner, left).await
        }
        _ => primary.node.release(name, owner, Wake::IfReleased).await,
    }
}

/// Send again to the new `primary` what was ended on the one the client
/// left (see `sentinel/journal.rs`).
async fn replay(primary: Arc<Primary>, ended: Vec<Entry>) {
    use futures_util::StreamExt;
    let (n, failed) = (ended.len(), AtomicU64::new(0));
    futures_util::stream::iter(ended)
        .for_each_concurrent(REPLAY_AT_ONCE, |e| {
            let (primary, failed) = (&primary, &failed);
            async move {
                if end_on(primary, &e.name, &e.owner, e.how).await.is_err() {
                    failed.fetch_add(1, Ordering::Relaxed);
                }
            }
        })
        .await;
    let failed = failed.load(Ordering::Relaxed);
    tracing::debug!(primary = %primary.addr, ended = n, failed, "sent what was ended on the old primary to the new one");
}

/// What an operator does: on the primary, as every lock operation.
impl SentinelBackend {
    pub(crate) async fn inspect(&self, name: &LockName) -> Result<Seen, Fault> {
        self.shared
            .on_primary(|p| async move { p.node.inspect(name).await })
            .await
    }

    /// Not run again on a new primary after a failure: the first run may
    /// have handed the lock to a waiter there, which a second run would
    /// then clear too. The primary is looked up again for the next call.
    pub(crate) async fn force_release(&self, name: &LockName) -> Result<Vec<String>, Fault> {
        let (primary, started) = (self.shared.current(), Instant::now());
        let out = primary.node.force_release(name, Wake::IfReleased).await;
        if matches!(&out, Err(e) if may_have_moved(e)) {
            self.shared.after_failure(&primary, started).await;
        }
        out
    }

    /// Like [`force_release`](Self::force_release), not run again on a new
    /// primary after a failure.
    pub(crate) async fn force_release_if(
        &self,
        name: &LockName,
        holder: &str,
    ) -> Result<bool, Fault> {
        let (primary, started) = (self.shared.current(), Instant::now());
        let out = primary
            .node
            .force_release_if(name, holder, Wake::IfReleased)
            .await;
        if matches!(&out, Err(e) if may_have_moved(e)) {
            self.shared.after_failure(&primary, started).await;
        }
        out
    }

    pub(crate) async fn scan(&self, pattern: &str) -> Result<Vec<String>, Fault> {
        self.shared
            .on_primary(|p| async move { p.node.scan(pattern).await })
            .await
    }
}
