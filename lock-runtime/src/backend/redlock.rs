//! Redlock: one lock over N independent Redis servers, held while a
//! majority of them grants it, so that it survives a minority of them
//! failing.
//!
//! Every step asks all nodes at once, each with a short per-node timeout, and
//! counts answers: acquire and renewal need `N/2 + 1` grants (a permit of a
//! semaphore more, see [`quorum`]),
//! and the time they took plus a clock-drift allowance must leave part of the
//! lease. A failed acquire is taken back on every node, also those that did
//! not answer (a lost reply is not a refusal).
//!
//! Fencing: each granting node increments its own counter; the token is the
//! maximum, and before the guard is returned every granting node's counter
//! is raised to it. A later majority shares at least one node with those
//! raised, so its maximum is higher — for as long as a majority keeps its
//! data. Every node is given one token floor, this client's clock in
//! microseconds: nodes whose counters are behind it all answer with the
//! same token, so raising is rarely needed. A node that restarts empty
//! forgets the lock and the counter, but its tokens still exceed every
//! token handed out before (as long as the clients' clocks agree to within
//! the time the restart took). The lock it forgot is another
//! matter: run the nodes with persistence (`appendfsync always`) or keep a
//! restarted node out for longer than the longest lease.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use tokio::runtime::Handle;
use tokio::sync::OnceCell;
use tokio::time::Instant;

use super::endpoint;
use super::fault::Fault;
use super::node::{NodeSettings, RedisNode, Wake};
use super::subscribers::AnySubscriber;
use super::{Acquired, Queue, Released, Renewal, Renewed, Seen};
use crate::key::{LockName, Mode};
use crate::wakeups::Waiter;

/// One of the N servers. Connected lazily if it was down at start-up, so a
/// node that comes back later rejoins the vote.
struct Slot {
    info: redis::ConnectionInfo,
    /// Its URL, password replaced, for messages.
    url: String,
    settings: NodeSettings,
    node: OnceCell<RedisNode>,
}

impl Slot {
    async fn node(&self) -> Result<RedisNode, Fault> {
        self.node
            .get_or_try_init(|| RedisNode::connect_to(self.info.clone(), self.settings.clone()))
            .await
            .cloned()
    }
}

/// One node's answer, or why there was none.
type Answer<T> = Result<T, NoAnswer>;

/// Why a node did not answer, and whether what was sent may have run there
/// (no answer in time, a connection that broke after the send) or surely
/// did not (refused: the node is down).
#[derive(Debug)]
struct NoAnswer {
    why: String,
    may_have_run: bool,
}

impl std::fmt::Display for NoAnswer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.why)
    }
}

struct Shared {
    slots: Vec<Slot>,
    /// A majority: what a lock needs, and what must answer a read.
    quorum: usize,
    op_timeout: Duration,
    /// Upper bound of the random pause after a split vote.
    jitter: Duration,
}

pub(crate) struct RedlockBackend {
    shared: Arc<Shared>,
    subscriber: AnySubscriber,
}

/// What the nodes' answers prove about a majority.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    /// A majority confirmed.
    Majority,
    /// So many nodes denied that no majority can confirm.
    Impossible,
    /// Too many nodes did not answer to tell.
    Unknown,
}

fn verdict(n: usize, quorum: usize, confirmed: usize, denied: usize) -> Verdict {
    if confirmed >= quorum {
        Verdict::Majority
    } else if n - denied < quorum {
        Verdict::Impossible
    } else {
        Verdict::Unknown
    }
}

/// How many of `nodes` must admit a permit of a semaphore of `permits`:
/// `⌊permits·nodes/(permits+1)⌋ + 1`, a majority for a lock (`permits` 1).
///
/// Each node admits at most `permits` holders of a key, so `permits + 1`
/// holders could hold `q` nodes each only if `(permits+1)·q ≤ permits·nodes`;
/// this `q` is the least that rules it out. A plain majority does not:
/// with three nodes and two permits, holders on {1,2}, {2,3} and {1,3}
/// leave each node with two, and three hold. From `permits ≥ nodes − 1` on
/// every node must admit (no node may be down for an acquire). Any two
/// such quorums share a node, so tokens still rise as for locks.
pub(crate) fn quorum(permits: u32, nodes: usize) -> usize {
    let (p, m) = (u64::from(permits.max(1)), nodes as u64);
    (p * m / (p + 1)) as usize + 1
}

/// Microseconds since the Unix epoch on this machine: the lowest token a
/// Redlock acquire hands out, so tokens stay above earlier ones even where a
/// majority of nodes lost their counters.
fn clock_floor() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// Clock drift allowed between the nodes: 1% of the lease plus 2 ms.
pub(crate) fn drift(lease: Duration) -> Duration {
    lease / 100 + Duration::from_millis(2)
}

impl RedlockBackend {
    /// Connect to every node; a majority must answer now, the rest are
    /// retried on use.
    pub(crate) async fn connect(
        urls: Vec<String>,
        settings: NodeSettings,
        io: Handle,
        jitter: Duration,
    ) -> Result<Self, Fault> {
        if urls.is_empty() {
            return Err(Fault::Config(
                "Redlock needs at least one Redis URL (three or five independent servers)".into(),
            ));
        }
        let subscriber = AnySubscriber::new(&urls, settings.clone(), io, settings.op_timeout)?;
        let shared = Shared {
            quorum: quorum(1, urls.len()),
            op_timeout: settings.op_timeout,
            jitter,
            slots: urls
                .iter()
                .map(|url| {
                    Ok(Slot {
                        info: endpoint::info(url)?,
                        url: endpoint::redact(url),
                        settings: settings.clone(),
                        node: OnceCell::new(),
                    })
                })
                .collect::<Result<_, Fault>>()?,
        };
        let budget = settings.connect_timeout + settings.op_timeout;
        let answers = shared
            .all(budget, |s| async move { s.node().await.map(|_| ()) })
            .await;
        let up = answers.iter().filter(|a| a.is_ok()).count();
        if up < shared.quorum {
            return Err(Fault::other(format!(
                "Redlock: only {up} of {} nodes reachable, {} needed: {}",
                shared.slots.len(),
                shared.quorum,
                shared.failures(&answers)
            )));
        }
        Ok(RedlockBackend {
            shared: Arc::new(shared),
            subscriber,
        })
    }
}

impl Shared {
    /// Per-node time limit for steps that race a lease: far below it.
    fn node_timeout(&self, lease: Duration) -> Duration {
        self.op_timeout
            .min(lease / 10)
            .max(Duration::from_millis(5))
    }

    /// Run `f` on every node at once, each bounded by `limit`.
    async fn all<'a, T, F, Fut>(&'a self, limit: Duration, f: F) -> Vec<Answer<T>>
    where
        F: Fn(&'a Slot) -> Fut,
        Fut: std::future::Future<Output = Result<T, Fault>> + 'a,
    {
        join_all(self.slots.iter().map(|slot| {
            let fut = f(slot);
            async move {
                match tokio::time::timeout(limit, fut).await {
                    Ok(Ok(v)) => Ok(v),
                    Ok(Err(e)) => Err(NoAnswer {
                        why: e.to_string(),
                        may_have_run: e.may_have_run(),
                    }),
                    Err(_) => Err(NoAnswer {
                        why: format!("no answer within {limit:?}"),
                        may_have_run: true,
                    }),
                }
            }
        }))
        .await
    }

    /// `url: why` for every node that did not answer.
    fn failures<T>(&self, answers: &[Answer<T>]) -> String {
        let list: Vec<String> = self
            .slots
            .iter()
            .zip(answers)
            .filter_map(|(s, a)| a.as_ref().err().map(|e| format!("{}: {e}", s.url)))
            .collect();
        if list.is_empty() {
            "every node answered".into()
        } else {
            list.join("; ")
        }
    }

    /// Take back an acquire on every node, also those that did not answer:
    /// a lost reply is not a refusal. Each node's connection keeps order, so
    /// the release lands after the acquire even on a slow node. The owner id
    /// belongs to this one acquisition, so no other hold is touched.
    ///
    /// `wake`: a partial grant freed nothing, and waking waiters would only
    /// send them (this one too) round again; a majority grant taken back
    /// (too slow, fence not raised) frees a lock others saw held.
    async fn undo(&self, name: &LockName, owner: &str, wake: Wake) {
        join_all(self.slots.iter().map(|slot| async move {
            let fut = async { slot.node().await?.release(name, owner, wake).await };
            let _ = tokio::time::timeout(self.op_timeout, fut).await;
        }))
        .await;
    }

    /// How many nodes must grant `owner`'s hold: a majority, or for a
    /// permit the [`quorum`] of its request's own `permits`.
    fn quorum_for(&self, owner: &str) -> usize {
        match Mode::of(owner) {
            Mode::Permit(permits) => quorum(permits, self.slots.len()),
            Mode::Write | Mode::Read => self.quorum,
        }
    }

    async fn acquire(
        &self,
        name: &LockName,
        owner: &str,
        lease: Duration,
        queue: Queue,
    ) -> Result<Acquired, Fault> {
        let started = Instant::now();
        let n = self.slots.len();
        let quorum = self.quorum_for(owner);
        // One floor for every node (this client's clock), so that nodes whose
        // counters are behind it all hand out the same token and the fence
        // needs no raising round trip; each node's own clock would differ.
        let floor = clock_floor();
        let mut limit = self.node_timeout(lease);
        if let Some(by) = queue.by {
            limit = limit.min(
                by.saturating_duration_since(started)
                    .max(Duration::from_millis(5)),
            );
        }
        let answers = self
            .all(limit, |s| async move {
                s.node()
                    .await?
                    .acquire(name, owner, lease, Some(floor), queue)
                    .await
            })
            .await;
        // A node that answers `Repeated` ran an earlier send of this same
        // attempt: it is a grant like any other.
        let (mut fresh, mut busy_ttl, mut busy) = (vec![], None, 0);
        for (i, a) in answers.iter().enumerate() {
            match a {
                Ok(Acquired::Fresh { fence } | Acquired::Repeated { fence }) => {
                    fresh.push((i, *fence))
                }
                Ok(Acquired::Busy { ttl, .. }) => {
                    busy += 1;
                    if let Some(t) = ttl {
                        busy_ttl = Some(busy_ttl.map_or(*t, |b: Duration| b.min(*t)));
                    }
                }
                Err(_) => {}
            }
        }
        let key = &name.key;
        let what = match Mode::of(owner) {
            Mode::Permit(permits) => format!("a permit of semaphore `{key}` ({permits} permits)"),
            _ => format!("lock `{key}`"),
        };

        if fresh.len() < quorum {
            self.undo(name, owner, Wake::Never).await;
            let failed = n - fresh.len() - busy;
            if failed > n - quorum {
                let why = format!(
                    "Redlock: acquiring {what}: granted by {} and refused by {busy} of {n} nodes, {} grants needed; the others failed",
                    fresh.len(),
                    quorum,
                );
                // Nodes that answer slowly, or whose connection broke
                // after the send, may yet grant a majority: the call keeps
                // trying while it has wait left. Only where so many nodes
                // refused connections that no majority is left does it
                // give up early, as on one server that is down.
                let down = answers
                    .iter()
                    .filter(|a| a.as_ref().is_err_and(|e| !e.may_have_run))
                    .count();
                if n - down >= quorum {
                    return Err(Fault::timed_out(
                        format!("{why} ({})", self.failures(&answers)),
                        limit,
                    ));
                }
                return Err(Fault::other(format!("{why}: {}", self.failures(&answers))));
            }
            if busy + failed < quorum {
                // Split vote: nobody holds a majority, and the partial
                // grants were taken back without waking anyone. Try again
                // after a random moment, so that contenders do not collide
                // again in lock-step.
                let pause = self.jitter.mul_f64(fastrand::f64());
                return Ok(Acquired::Busy {
                    ttl: Some(pause.max(Duration::from_millis(1))),
                    queued: None,
                });
            }
            return Ok(Acquired::Busy {
                ttl: busy_ttl,
                queued: None,
            });
        }

        // The token is the highest any granting node handed out; every
        // granting node is raised to it, so any later majority sees it.
        // A permit's raise is refused where another permit carries that
        // token already (permits overlap; tokens stay unique per key): the
        // token then goes above the highest counter that refused, and
        // every granting node is raised again.
        let mut at: Vec<Option<u64>> = fresh.iter().map(|g| Some(g.1)).collect();
        let mut fence = fresh.iter().map(|g| g.1).max().unwrap_or(0);
        let timeout = self.node_timeout(lease);
        let mut why: Vec<String> = Vec::new();
        for _ in 0..RAISE_ROUNDS {
            let raised = join_all(fresh.iter().zip(&at).map(|(&(i, _), &now)| async move {
                if now == Some(fence) {
                    return Ok(None);
                }
                let fut = async {
                    let node = self.slots[i].node().await?;
                    match Mode::of(owner) {
                        Mode::Permit(_) => node.raise_permit_fence(name, owner, fence).await,
                        Mode::Write | Mode::Read => {
                            node.raise_fence(name, owner, fence).await.map(|()| None)
                        }
                    }
                };
                match tokio::time::timeout(timeout, fut).await {
                    Ok(r) => r.map_err(|e| format!("{}: {e}", self.slots[i].url)),
                    Err(_) => Err(format!(
                        "{}: no answer within {timeout:?}",
                        self.slots[i].url
                    )),
                }
            }))
            .await;
            let mut above = None;
            why.clear();
            for (slot, r) in at.iter_mut().zip(raised) {
                match r {
                    Ok(None) => *slot = Some(fence),
                    Ok(Some(counter)) => above = above.max(Some(counter)),
                    Err(e) => {
                        *slot = None;
                        why.push(e);
                    }
                }
            }
            match above {
                Some(counter) => {
                    fence = counter + 1;
                    why.push(format!("the token was taken; {fence} next"));
                }
                None => break,
            }
        }
        let carried = at.iter().filter(|&&t| t == Some(fence)).count();
        if carried < quorum {
            self.undo(name, owner, Wake::IfReleased).await;
            return Err(Fault::unavailable(format!(
                "Redlock: acquiring {what}: could not raise the fence token {fence} on {quorum} nodes: {}",
                why.join("; ")
            )));
        }
        let elapsed = started.elapsed();
        if elapsed + drift(lease) >= lease {
            self.undo(name, owner, Wake::IfReleased).await;
            return Err(Fault::unavailable(format!(
                "Redlock: acquiring {what} took {elapsed:?}, leaving nothing of its {lease:?} lease (minus {:?} clock drift); use a longer lease or faster nodes",
                drift(lease)
            )));
        }
        Ok(Acquired::Fresh { fence })
    }

    /// Release on every node. Each node also publishes where the lock is
    /// absent: waiters listen on one node, which may never have had it.
    async fn release(&self, name: &LockName, owner: &str) -> Result<Released, Fault> {
        let answers = self
            .all(self.op_timeout, |s| async move {
                s.node().await?.release(name, owner, Wake::Always).await
            })
            .await;
        self.released_by_majority(&answers, name, "releasing", self.quorum_for(owner))
    }

    /// Leave the lock to expire `left` from now on every node (min_hold).
    async fn keep(&self, name: &LockName, owner: &str, left: Duration) -> Result<Released, Fault> {
        let answers = self
            .all(self.op_timeout, |s| async move {
                s.node().await?.keep(name, owner, left).await
            })
            .await;
        self.released_by_majority(
            &answers,
            name,
            "leaving to its min_hold",
            self.quorum_for(owner),
        )
    }

    /// What a release (or keep) on every node comes to: done where a
    /// `quorum` did it (the hold's own: a majority, or a permit's), not
    /// ours where too few nodes could still have it, else unknown (`doing`
    /// says what, for the error).
    fn released_by_majority(
        &self,
        answers: &[Answer<Released>],
        name: &LockName,
        doing: &str,
        quorum: usize,
    ) -> Result<Released, Fault> {
        let count = |r: Released| {
            answers
                .iter()
                .filter(|a| a.as_ref().ok() == Some(&r))
                .count()
        };
        let (done, not_owner) = (count(Released::Freed), count(Released::NotOwner));
        let n = self.slots.len();
        match verdict(n, quorum, done, not_owner) {
            Verdict::Majority => Ok(Released::Freed),
            Verdict::Impossible => Ok(Released::NotOwner),
            Verdict::Unknown => Err(Fault::other(format!(
                "Redlock: {doing} lock `{}`: confirmed by {done} of {n} nodes, {} needed: {}",
                name.key,
                quorum,
                self.failures(answers)
            ))),
        }
    }

    /// Renew a batch on every node. Each node's answer may take as long
    /// as any command's (`op_timeout`), not the acquire's lease/10: a
    /// renewal's deadline counts from when it was sent, so a late answer
    /// takes nothing from the hold, and the watchdog stops waiting at the
    /// holds' deadlines anyway. Cut shorter, nodes that all extended a hold
    /// (answering at 0.6 × `op_timeout` under a lease below 6 ×
    /// `op_timeout`) counted as none, and the hold was lost.
    async fn renew(&self, batch: Vec<Renewal>) -> Vec<Renewed> {
        let batch = &batch;
        let answers = self
            .all(self.op_timeout, |s| async move {
                Ok(s.node().await?.renew(batch).await)
            })
            .await;
        let n = self.slots.len();
        (0..batch.len())
            .map(|i| {
                let (mut yes, mut not_owner, mut why) = (0, 0, Vec::new());
                for (slot, a) in self.slots.iter().zip(&answers) {
                    match a.as_ref().map(|v| v.get(i)) {
                        Ok(Some(Renewed::Yes)) => yes += 1,
                        Ok(Some(Renewed::NotOwner)) => not_owner += 1,
                        Ok(Some(Renewed::Failed(e))) => why.push(format!("{}: {e}", slot.url)),
                        Ok(None) => why.push(format!("{}: no outcome", slot.url)),
                        Err(e) => why.push(format!("{}: {e}", slot.url)),
                    }
                }
                let quorum = self.quorum_for(&batch[i].owner);
                match verdict(n, quorum, yes, not_owner) {
                    Verdict::Majority => Renewed::Yes,
                    Verdict::Impossible => Renewed::NotOwner,
                    Verdict::Unknown => Renewed::Failed(Fault::other(format!(
                        "Redlock: renewing lock `{}`: renewed on {yes} of {n} nodes, {} needed: {}",
                        batch[i].name.key,
                        quorum,
                        why.join("; ")
                    ))),
                }
            })
            .collect()
    }
}

impl RedlockBackend {
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
        self.shared.release(name, owner).await
    }

    pub(crate) async fn renew(&self, batch: Vec<Renewal>) -> Vec<Renewed> {
        self.shared.renew(batch).await
    }

    pub(crate) async fn keep(
        &self,
        name: &LockName,
        owner: &Arc<str>,
        left: Duration,
    ) -> Result<Released, Fault> {
        self.shared.keep(name, owner, left).await
    }

    pub(crate) async fn subscribe(
        &self,
        name: &LockName,
        _owner: &Arc<str>,
    ) -> Result<(Waiter, bool), Fault> {
        self.subscriber.subscribe(name).await
    }

    pub(crate) fn waiting(&self, name: &LockName) -> usize {
        self.subscriber.waiting(name)
    }
}

/// What an operator does: read what a majority says, clear on every node.
impl Shared {
    /// Each node's view of the lock; an error unless a majority answered.
    async fn views(&self, name: &LockName) -> Result<Vec<Seen>, Fault> {
        let answers = self
            .all(self.op_timeout, |s| async move {
                s.node().await?.inspect(name).await
            })
            .await;
        let n = self.slots.len();
        let failures = self.failures(&answers);
        let views: Vec<Seen> = answers.into_iter().filter_map(Result::ok).collect();
        if views.len() < self.quorum {
            return Err(Fault::other(format!(
                "Redlock: reading lock `{}`: {} of {n} nodes answered, {} needed: {failures}",
                name.key,
                views.len(),
                self.quorum,
            )));
        }
        Ok(views)
    }

    async fn inspect(&self, name: &LockName) -> Result<Seen, Fault> {
        let n = self.slots.len();
        let seen = majority(
            &self.views(name).await?,
            self.quorum,
            |holder: &str| match Mode::of(holder.trim_end_matches('!')) {
                Mode::Permit(permits) => quorum(permits, n),
                Mode::Write | Mode::Read => self.quorum,
            },
        );
        Ok(seen)
    }

    /// Every holder any node knows (a partial grant on a minority too) is
    /// released on every node; a hold counts as removed where a majority
    /// ended it.
    async fn force_release(&self, name: &LockName) -> Result<Vec<String>, Fault> {
        let mut holders: Vec<String> = Vec::new();
        for view in self.views(name).await? {
            for h in view.holders {
                if !holders.contains(&h) {
                    holders.push(h);
                }
            }
        }
        let mut removed = Vec::new();
        for holder in holders {
            if self.release_forced(name, &holder).await? {
                removed.push(holder);
            }
        }
        Ok(removed)
    }

    /// `holder`'s hold ended on every node, if any answering node still
    /// has it (a partial grant on a minority too); whether a majority
    /// ended it.
    async fn force_release_if(&self, name: &LockName, holder: &str) -> Result<bool, Fault> {
        let known = self.views(name).await?.iter().any(|v| v.holds(holder));
        if !known {
            return Ok(false);
        }
        self.release_forced(name, holder).await
    }

    /// `holder`'s release, forced, on every node: whether a majority ended
    /// its hold.
    async fn release_forced(&self, name: &LockName, holder: &str) -> Result<bool, Fault> {
        let n = self.slots.len();
        let answers = self
            .all(self.op_timeout, |s| async move {
                s.node()
                    .await?
                    .release_forced(name, holder, Wake::Always)
                    .await
            })
            .await;
        let ended = answers.iter().filter(|a| matches!(a, Ok(true))).count();
        let kept = answers.iter().filter(|a| matches!(a, Ok(false))).count();
        let quorum = self.quorum_for(holder);
        match verdict(n, quorum, ended, kept) {
            Verdict::Majority => Ok(true),
            Verdict::Impossible => Ok(false),
            Verdict::Unknown => Err(Fault::other(format!(
                "Redlock: force-releasing lock `{}` held by {holder}: confirmed by {ended} of {n} nodes, {} needed: {}",
                name.key,
                quorum,
                self.failures(&answers)
            ))),
        }
    }

    /// The names any answering node has; an error unless a majority
    /// answered (a lock held by a majority is then on one of them).
    async fn scan(&self, pattern: &str) -> Result<Vec<String>, Fault> {
        // Each SCAN step is bounded by the operation timeout; this only
        // caps the whole walk of a node's keyspace.
        let walk = Duration::from_secs(600);
        let answers = self
            .all(walk, |s| async move { s.node().await?.scan(pattern).await })
            .await;
        let answered = answers.iter().filter(|a| a.is_ok()).count();
        if answered < self.quorum {
            return Err(Fault::other(format!(
                "Redlock: listing locks: {answered} of {} nodes answered, {} needed: {}",
                self.slots.len(),
                self.quorum,
                self.failures(&answers)
            )));
        }
        Ok(answers.into_iter().flatten().flatten().collect())
    }
}

/// How many times a permit's token is raised before the acquisition is
/// given back: each refusal moves it above a counter that refused it, so a
/// second round is rare and a third needs acquisitions racing on as many
/// nodes.
const RAISE_ROUNDS: usize = 4;

/// What at least `quorum` of the nodes' views agree on: the holders their
/// own quorum has (`holds_on`: a majority, or a permit's), the lease as
/// many still give the first of them, and the highest token a majority
/// has seen.
fn majority(views: &[Seen], quorum: usize, holds_on: impl Fn(&str) -> usize) -> Seen {
    let on = |h: &String| views.iter().filter(|v| v.holders.contains(h)).count();
    let on_majority = |h: &String| on(h) >= holds_on(h);
    let mut holders: Vec<String> = Vec::new();
    for h in views.iter().flat_map(|v| &v.holders) {
        if !holders.contains(h) && on_majority(h) {
            holders.push(h.clone());
        }
    }
    let ttl = holders.first().and_then(|h| {
        quorum_th(
            views
                .iter()
                .filter(|v| v.holders.contains(h))
                .map(|v| v.ttl),
            holds_on(h),
        )
    });
    Seen {
        holders,
        ttl,
        waiters: views.iter().map(|v| v.waiters).max().unwrap_or(0),
        fence: quorum_th(views.iter().map(|v| v.fence), quorum),
    }
}

/// The `quorum`-th largest value: at least that much on a majority.
fn quorum_th<T: Ord>(values: impl Iterator<Item = Option<T>>, quorum: usize) -> Option<T> {
    let mut values: Vec<Option<T>> = values.collect();
    values.sort_by(|a, b| b.cmp(a));
    values.into_iter().nth(quorum.checked_sub(1)?).flatten()
}

impl RedlockBackend {
    pub(crate) async fn inspect(&self, name: &LockName) -> Result<Seen, Fault> {
        self.shared.inspect(name).await
    }

    pub(crate) async fn force_release(&self, name: &LockName) -> Result<Vec<String>, Fault> {
        self.shared.force_release(name).await
    }

    pub(crate) async fn force_release_if(
        &self,
        name: &LockName,
        holder: &str,
    ) -> Result<bool, Fault> {
        self.shared.force_release_if(name, holder).await
    }

    pub(crate) async fn scan(&self, pattern: &str) -> Result<Vec<String>, Fault> {
        self.shared.scan(pattern).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_majority_confirms_and_a_blocking_minority_denies() {
        // Five nodes, three needed.
        assert_eq!(verdict(5, 3, 3, 2), Verdict::Majority);
        assert_eq!(verdict(5, 3, 3, 0), Verdict::Majority);
        assert_eq!(verdict(5, 3, 2, 3), Verdict::Impossible);
        // Two confirmed, one denied, two silent: they may have it.
        assert_eq!(verdict(5, 3, 2, 1), Verdict::Unknown);
        assert_eq!(verdict(5, 3, 0, 2), Verdict::Unknown);
        // One node: it alone decides.
        assert_eq!(verdict(1, 1, 1, 0), Verdict::Majority);
        assert_eq!(verdict(1, 1, 0, 1), Verdict::Impossible);
        assert_eq!(verdict(1, 1, 0, 0), Verdict::Unknown);
    }

    #[test]
    fn a_lock_is_seen_as_a_majority_of_nodes_has_it() {
        let view = |holders: &[&str], ttl: u64, fence: Option<u64>| Seen {
            holders: holders.iter().map(|h| h.to_string()).collect(),
            ttl: (ttl > 0).then(|| Duration::from_millis(ttl)),
            waiters: 0,
            fence,
        };
        // Two of three nodes have `a`; a partial grant of `b` on one.
        let seen = majority(
            &[
                view(&["a"], 900, Some(7)),
                view(&["a"], 800, Some(7)),
                view(&["b"], 500, Some(9)),
            ],
            2,
            |_| 2,
        );
        assert_eq!(seen.holders, ["a"]);
        // Held on a majority for as long as the second longest lease.
        assert_eq!(seen.ttl, Some(Duration::from_millis(800)));
        // 9 is on one node only: a majority has seen 7.
        assert_eq!(seen.fence, Some(7));
        // No majority for anyone: not held.
        let seen = majority(&[view(&["a"], 900, None), view(&[], 0, None)], 2, |_| 2);
        assert!(seen.holders.is_empty() && seen.ttl.is_none() && seen.fence.is_none());
    }

    /// Whether `holders` holders can each be admitted by `q` of `nodes`
    /// nodes, every node admitting at most `permits`: greedily, each
    /// holder taking the `q` least loaded nodes (which is optimal).
    fn fits(holders: usize, q: usize, nodes: usize, permits: usize) -> bool {
        let mut load = vec![0; nodes];
        for _ in 0..holders {
            let mut order: Vec<usize> = (0..nodes).collect();
            order.sort_by_key(|&i| load[i]);
            for &i in &order[..q] {
                load[i] += 1;
                if load[i] > permits {
                    return false;
                }
            }
        }
        true
    }

    #[test]
    fn a_permits_quorum_keeps_holders_to_the_permits_and_is_the_least_that_does() {
        assert_eq!(quorum(1, 3), 2);
        assert_eq!(quorum(1, 5), 3);
        // A majority of three admits a third holder of two permits.
        assert_eq!(quorum(2, 3), 3);
        assert!(fits(3, 2, 3, 2));
        assert_eq!(quorum(2, 5), 4);
        assert_eq!(quorum(4, 5), 5);
        for nodes in 1..=7 {
            for permits in 1..=8u32 {
                let q = quorum(permits, nodes);
                let p = permits as usize;
                assert!(q <= nodes && q > nodes / 2, "{permits} of {nodes}: {q}");
                assert!(fits(p, q, nodes, p), "{permits} of {nodes}: {q}");
                assert!(!fits(p + 1, q, nodes, p), "{permits} of {nodes}: {q}");
                if q > 1 {
                    assert!(fits(p + 1, q - 1, nodes, p), "{permits} of {nodes}: {q}");
                }
            }
        }
    }

    #[test]
    fn drift_is_one_percent_plus_two_ms() {
        assert_eq!(drift(Duration::from_secs(10)), Duration::from_millis(102));
        assert_eq!(drift(Duration::from_millis(100)), Duration::from_millis(3));
    }
}
