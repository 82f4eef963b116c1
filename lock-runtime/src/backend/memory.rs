//! Locks in this process: the same protocol as Redis (one owner per
//! acquisition, lease expiry, fencing, a queue of waiters served in order
//! by the release) for single-instance services and users' unit tests.
//!
//! Time is tokio's (`tokio::time::Instant`, read on the caller's runtime):
//! under `tokio::time::pause()` leases, waits and renewals follow
//! `advance`. Memory stays bounded by what is held or awaited: tokens come
//! from one counter for the whole backend (so a free key keeps nothing),
//! and lapsed leases and waiters are dropped as time passes, a few per
//! call.
//!
//! A key is a lock or a semaphore (`permits.rs`, the rules of
//! `docs/SEMAPHORES.md`), never both at once: a request of the other kind
//! finds it busy and is not queued, as on Redis.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use super::fault::Fault;
use super::{Acquired, Queue, Released, Renewal, Renewed};
use crate::claims::{self, Grant, Stamp};
use crate::key::LockName;
use crate::key::{client_of, is_reader, Mode};
use crate::wakeups::{Waiter, Wakeups};

mod operations;
mod permits;

use permits::Permit;

/// First pause before a failed call is tried again, doubled up to the
/// second (as the Redis backends do after a cut connection).
const RETRY_PAUSE: Duration = Duration::from_millis(10);
const MAX_RETRY_PAUSE: Duration = Duration::from_millis(200);
/// The least time worth giving another try.
const MIN_SEND: Duration = Duration::from_millis(20);

pub(crate) struct MemoryBackend {
    shared: Arc<Shared>,
}

struct Shared {
    state: Mutex<State>,
    wakeups: Arc<Wakeups>,
    /// Calls still to fail (`MemoryControl::fail_next`).
    failures: AtomicUsize,
    /// How long one call is tried again after a failure.
    op_timeout: Duration,
}

struct State {
    locks: HashMap<Arc<str>, Lock>,
    queues: HashMap<Arc<str>, VecDeque<Queued>>,
    /// The last token handed out, for every key: a writer takes the next
    /// one, a reader the current one. Never 0 (the token of a lock taken
    /// without fencing).
    last_token: u64,
    /// When a lease or a waiter's stay may run out, by key: popped as time
    /// passes, each pop looks at that key only. Stale items (the lease was
    /// renewed since) are dropped when their time comes.
    expiries: BinaryHeap<Reverse<(Instant, Arc<str>)>>,
    /// How many permits were ever taken: each permit's place in line, to
    /// tell the oldest (`MemoryControl::expire`).
    permits_taken: u64,
}

impl Default for State {
    fn default() -> Self {
        State {
            locks: HashMap::new(),
            queues: HashMap::new(),
            last_token: 1,
            expiries: BinaryHeap::new(),
            permits_taken: 0,
        }
    }
}

/// A waiter in a lock's queue.
struct Queued {
    owner: Arc<str>,
    lease: Duration,
    until: Instant,
    /// Its grant carries a token (`fence = false`: 0).
    fence: bool,
}

/// A held lock: one writer, or readers each with a lease of its own, or a
/// semaphore's permit holders. `fence`: the token its holders were given.
enum Lock {
    Written {
        owner: Arc<str>,
        expires: Instant,
        fence: u64,
    },
    Read {
        readers: HashMap<Arc<str>, Instant>,
        fence: u64,
    },
    /// A semaphore: every permit with its own lease and token.
    Permits(HashMap<Arc<str>, Permit>),
}

impl Lock {
    fn is_owner(&self, owner: &str) -> bool {
        match self {
            Lock::Written { owner: o, .. } => &**o == owner,
            Lock::Read { readers, .. } => readers.contains_key(owner),
            Lock::Permits(permits) => permits.contains_key(owner),
        }
    }

    /// The token of the hold (of a semaphore: the highest).
    fn fence(&self) -> u64 {
        match self {
            Lock::Written { fence, .. } | Lock::Read { fence, .. } => *fence,
            Lock::Permits(permits) => permits.values().map(|p| p.fence).max().unwrap_or(0),
        }
    }

    /// When the last lease ends.
    fn expires(&self) -> Instant {
        match self {
            Lock::Written { expires, .. } => *expires,
            Lock::Read { readers, .. } => {
                readers.values().copied().max().unwrap_or_else(Instant::now)
            }
            Lock::Permits(permits) => permits
                .values()
                .map(|p| p.ends)
                .max()
                .unwrap_or_else(Instant::now),
        }
    }

    /// Extend `owner`'s lease, if it holds one.
    fn extend(&mut self, owner: &str, until: Instant) -> bool {
        match self {
            Lock::Written {
                owner: o, expires, ..
            } if &**o == owner => *expires = until,
            Lock::Read { readers, .. } => match readers.get_mut(owner) {
                Some(ends) => *ends = until,
                None => return false,
            },
            Lock::Permits(permits) => match permits.get_mut(owner) {
                Some(p) => p.ends = until,
                None => return false,
            },
            Lock::Written { .. } => return false,
        }
        true
    }
}

impl State {
    /// The live lock under `hash`, dropping readers and writers whose
    /// lease ran out.
    fn live(&mut self, hash: &str, now: Instant) -> Option<&mut Lock> {
        let gone = match self.locks.get_mut(hash) {
            Some(Lock::Read { readers, .. }) => {
                readers.retain(|_, ends| *ends > now);
                readers.is_empty()
            }
            Some(Lock::Written { expires, .. }) => *expires <= now,
            Some(Lock::Permits(permits)) => {
                permits.retain(|_, p| p.ends > now);
                permits.is_empty()
            }
            None => false,
        };
        if gone {
            self.locks.remove(hash);
        }
        self.locks.get_mut(hash)
    }

    /// Whether a live writer waits in the queue: new readers queue behind.
    fn writer_waits(&self, hash: &str, now: Instant) -> bool {
        self.queues
            .get(hash)
            .is_some_and(|q| q.iter().any(|w| !is_reader(&w.owner) && w.until > now))
    }

    /// Look at `hash` again at `at`, to drop what has lapsed by then.
    fn expire_at(&mut self, at: Instant, hash: &Arc<str>) {
        self.expiries.push(Reverse((at, hash.clone())));
    }

    /// Drop the leases and waiters that lapsed by `now`. Each item was
    /// pushed by a call, so the work is paid for by the calls that made it.
    fn prune(&mut self, now: Instant) {
        while let Some(Reverse((at, _))) = self.expiries.peek() {
            if *at > now {
                break;
            }
            let Some(Reverse((_, hash))) = self.expiries.pop() else {
                break;
            };
            self.live(&hash, now);
            if let Some(q) = self.queues.get_mut(&hash) {
                q.retain(|w| w.until > now);
                if q.is_empty() {
                    self.queues.remove(&hash);
                }
            }
        }
    }

    /// The token a new holder of `hash` gets: a writer the next one, a
    /// reader that of the readers it joins, else the current one (at least
    /// the last writer's, and below the next writer's).
    fn token_for(&self, hash: &str, reader: bool) -> u64 {
        match (reader, self.locks.get(hash)) {
            (true, Some(lock @ Lock::Read { .. })) => lock.fence(),
            (true, _) => self.last_token,
            (false, _) => self.last_token + 1,
        }
    }

    /// Make `owner` the holder (a reader joins the readers); returns its
    /// token (see [`token_for`](Self::token_for)).
    fn take(&mut self, name: &LockName, owner: Arc<str>, lease: Duration, now: Instant) -> u64 {
        let reader = is_reader(&owner);
        let fence = self.token_for(&name.hash, reader);
        self.expire_at(now + lease, &name.hash);
        if reader {
            match self.locks.get_mut(&name.hash) {
                Some(Lock::Read { readers, .. }) => {
                    readers.insert(owner, now + lease);
                }
                _ => {
                    self.locks.insert(
                        name.hash.clone(),
                        Lock::Read {
                            readers: HashMap::from([(owner, now + lease)]),
                            fence,
                        },
                    );
                }
            }
            return fence;
        }
        self.last_token = fence;
        self.locks.insert(
            name.hash.clone(),
            Lock::Written {
                owner,
                expires: now + lease,
                fence,
            },
        );
        fence
    }

    /// Take `owner` out of the queue; whether it was in it.
    fn leave_queue(&mut self, hash: &str, owner: &str) -> bool {
        let Some(q) = self.queues.get_mut(hash) else {
            return false;
        };
        let before = q.len();
        q.retain(|w| &*w.owner != owner);
        let left = q.len() < before;
        if q.is_empty() {
            self.queues.remove(hash);
        }
        left
    }
}

impl MemoryBackend {
    pub(crate) fn new(op_timeout: Duration) -> Self {
        MemoryBackend {
            shared: Arc::new(Shared {
                state: Mutex::default(),
                wakeups: Arc::default(),
                failures: AtomicUsize::new(0),
                op_timeout,
            }),
        }
    }

    /// A handle for tests to end holds and to make calls fail.
    pub(crate) fn control(&self, prefix: Arc<str>) -> MemoryControl {
        MemoryControl {
            shared: self.shared.clone(),
            prefix,
        }
    }

    /// How many entries the backend keeps (locks, queues, pending
    /// expiries), after dropping what has lapsed.
    #[cfg(test)]
    pub(crate) fn entries(&self) -> usize {
        let mut state = self.shared.state.lock().unwrap();
        state.prune(Instant::now());
        state.locks.len() + state.queues.len() + state.expiries.len()
    }
}

impl Shared {
    /// Run `op` on the state unless a failure is due: then the call fails
    /// as on a cut connection and is tried again after a pause, within the
    /// operation timeout, as the Redis backends do.
    async fn call<T>(&self, what: &str, mut op: impl FnMut(&Shared) -> T) -> Result<T, Fault> {
        let deadline = Instant::now() + self.op_timeout;
        let mut pause = RETRY_PAUSE;
        loop {
            let due = self
                .failures
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
                .is_ok();
            if !due {
                return Ok(op(self));
            }
            let fault = Fault::redis(
                format!("{what} in memory"),
                redis::RedisError::from(std::io::Error::new(
                    std::io::ErrorKind::ConnectionReset,
                    "connection cut (MemoryControl::fail_next)",
                )),
            );
            if Instant::now() + pause + MIN_SEND >= deadline {
                return Err(fault);
            }
            tracing::debug!(error = %fault, "lock call failed; trying again");
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(MAX_RETRY_PAUSE);
        }
    }

    fn acquire_now(
        &self,
        name: &LockName,
        owner: &Arc<str>,
        lease: Duration,
        queue: Queue,
    ) -> Acquired {
        let now = Instant::now();
        let mut state = self.state.lock().unwrap();
        state.prune(now);
        if let Mode::Permit(permits) = Mode::of(owner) {
            return self.acquire_permit(&mut state, name, owner, permits, lease, queue, now);
        }
        if let Some(lock @ Lock::Permits(_)) = state.live(&name.hash, now) {
            // A semaphore: busy for a lock, which does not queue behind
            // its permits.
            let ttl = Some(lock.expires() - now);
            return Acquired::Busy { ttl, queued: None };
        }
        let shared = is_reader(owner)
            && matches!(state.live(&name.hash, now), Some(Lock::Read { .. }))
            && !state.writer_waits(&name.hash, now);
        if let Some(lock) = state.live(&name.hash, now).filter(|_| !shared) {
            if lock.extend(owner, now + lease) {
                let fence = if queue.fence { lock.fence() } else { 0 };
                state.expire_at(now + lease, &name.hash);
                return Acquired::Repeated { fence };
            }
            let ttl = Some(lock.expires() - now);
            let Some(stay) = queue.stay else {
                return Acquired::Busy { ttl, queued: None };
            };
            let q = state.queues.entry(name.hash.clone()).or_default();
            match q.iter_mut().find(|w| w.owner == *owner) {
                Some(w) => w.until = now + stay,
                None => q.push_back(Queued {
                    owner: owner.clone(),
                    lease,
                    until: now + stay,
                    fence: queue.fence,
                }),
            }
            state.expire_at(now + stay, &name.hash);
            return Acquired::Busy {
                ttl,
                queued: Some(super::Queued::Here),
            };
        }
        if queue.rejoin {
            state.leave_queue(&name.hash, owner);
        }
        let fence = state.take(name, owner.clone(), lease, now);
        Acquired::Fresh {
            fence: if queue.fence { fence } else { 0 },
        }
    }

    fn release_now(&self, name: &LockName, owner: &Arc<str>) -> Released {
        let now = Instant::now();
        let mut state = self.state.lock().unwrap();
        state.prune(now);
        if let Mode::Permit(_) = Mode::of(owner) {
            return self.release_permit(&mut state, name, owner, now);
        }
        match state.live(&name.hash, now) {
            Some(Lock::Read { readers, .. }) if readers.contains_key(&**owner) => {
                readers.remove(&**owner);
                if !readers.is_empty() {
                    return Released::Freed;
                }
            }
            Some(lock) if lock.is_owner(owner) => {}
            Some(lock) => {
                // A queued writer giving up: readers that queued only
                // behind it join the readers now.
                let joining = matches!(lock, Lock::Read { .. }) && !is_reader(owner);
                if state.leave_queue(&name.hash, owner) && joining {
                    self.serve(&mut state, name, now, true);
                }
                return Released::NotOwner;
            }
            None => {
                state.leave_queue(&name.hash, owner);
                return Released::NotOwner;
            }
        }
        state.locks.remove(&name.hash);
        self.serve(&mut state, name, now, false);
        Released::Freed
    }

    /// Serve the first waiter still waiting whose client takes the grant
    /// (a reader: with every reader right behind it); the rest stay
    /// queued. `joining`: the lock is read-held, and only readers at the
    /// head of the queue join them.
    fn serve(&self, state: &mut State, name: &LockName, now: Instant, joining: bool) {
        let permit_first = state
            .queues
            .get(&name.hash)
            .and_then(VecDeque::front)
            .is_some_and(|w| matches!(Mode::of(&w.owner), Mode::Permit(_)));
        if permit_first {
            // The key became a semaphore's again (its permits lapsed while
            // they waited, and a lock was taken and given back).
            return self.serve_permits(state, name, now);
        }
        let mut readers = joining;
        while let Some(next) = state.queues.get_mut(&name.hash).and_then(|q| {
            q.front()
                .is_some_and(|w| !readers || is_reader(&w.owner))
                .then(|| q.pop_front())
                .flatten()
        }) {
            if next.until <= now {
                continue;
            }
            let reader = is_reader(&next.owner);
            let fence = state.token_for(&name.hash, reader);
            let grant = Grant {
                fence: if next.fence { fence } else { 0 },
                at: Stamp::Local(now),
            };
            // (A waiter whose request is over is skipped, as on Redis one
            // whose client no longer listens.)
            if claims::deliver(&next.owner, grant) {
                state.take(name, next.owner, next.lease, now);
                if !reader {
                    break;
                }
                readers = true;
            }
        }
        if state.queues.get(&name.hash).is_some_and(VecDeque::is_empty) {
            state.queues.remove(&name.hash);
        }
    }

    fn renew_now(&self, state: &mut State, r: &Renewal, now: Instant) -> Renewed {
        match state.live(&r.name.hash, now) {
            Some(lock) if lock.is_owner(&r.owner) => {
                lock.extend(&r.owner, now + r.lease);
                state.expire_at(now + r.lease, &r.name.hash);
                Renewed::Yes
            }
            _ => Renewed::NotOwner,
        }
    }

    /// `min_hold`: the hold ends, renamed `<owner>!` (as on Redis), and the
    /// lock stays taken until `left` from now at most.
    fn keep_now(&self, name: &LockName, owner: &Arc<str>, left: Duration) -> Released {
        let now = Instant::now();
        let mut state = self.state.lock().unwrap();
        state.prune(now);
        let kept: Arc<str> = format!("{owner}!").into();
        match state.live(&name.hash, now) {
            Some(Lock::Written {
                owner: o, expires, ..
            }) if o == owner => {
                *o = kept;
                *expires = (*expires).min(now + left);
                Released::Freed
            }
            Some(Lock::Read { readers, .. }) => match readers.remove(&**owner) {
                Some(ends) => {
                    readers.insert(kept, ends.min(now + left));
                    Released::Freed
                }
                None => Released::NotOwner,
            },
            // Still counted until then; renewed and released by nobody.
            Some(Lock::Permits(permits)) => match permits.remove(&**owner) {
                Some(p) => {
                    let ends = p.ends.min(now + left);
                    permits.insert(kept, Permit { ends, ..p });
                    Released::Freed
                }
                None => Released::NotOwner,
            },
            _ => Released::NotOwner,
        }
    }

    /// End every hold of `name` now (of a semaphore: its oldest permit),
    /// as if its leases ran out, and serve its waiters; whether anything
    /// was held.
    fn expire(&self, name: &LockName) -> bool {
        let now = Instant::now();
        let mut state = self.state.lock().unwrap();
        state.prune(now);
        match state.live(&name.hash, now) {
            None => return false,
            Some(Lock::Permits(permits)) => {
                permits::end_oldest(permits);
                if !permits.is_empty() {
                    self.serve_permits(&mut state, name, now);
                    return true;
                }
            }
            Some(_) => {}
        }
        state.locks.remove(&name.hash);
        self.serve(&mut state, name, now, false);
        true
    }
}

impl MemoryBackend {
    pub(crate) async fn acquire(
        &self,
        name: &LockName,
        owner: &Arc<str>,
        lease: Duration,
        queue: Queue,
    ) -> Result<Acquired, Fault> {
        self.shared
            .call("acquiring a lock", |s| {
                s.acquire_now(name, owner, lease, queue)
            })
            .await
    }

    pub(crate) async fn release(
        &self,
        name: &LockName,
        owner: &Arc<str>,
    ) -> Result<Released, Fault> {
        self.shared
            .call("releasing a lock", |s| s.release_now(name, owner))
            .await
    }

    pub(crate) async fn keep(
        &self,
        name: &LockName,
        owner: &Arc<str>,
        left: Duration,
    ) -> Result<Released, Fault> {
        self.shared
            .call("leaving a lock to its min_hold", |s| {
                s.keep_now(name, owner, left)
            })
            .await
    }

    pub(crate) async fn renew(&self, batch: Vec<Renewal>) -> Vec<Renewed> {
        let out = self
            .shared
            .call("renewing locks", |s| {
                let now = Instant::now();
                let mut state = s.state.lock().unwrap();
                state.prune(now);
                batch
                    .iter()
                    .map(|r| s.renew_now(&mut state, r, now))
                    .collect::<Vec<_>>()
            })
            .await;
        out.unwrap_or_else(|e| Renewed::all_failed(batch.len(), &e))
    }

    pub(crate) async fn subscribe(
        &self,
        name: &LockName,
        owner: &Arc<str>,
    ) -> Result<(Waiter, bool), Fault> {
        let wakeups = &self.shared.wakeups;
        let channel = name.grant_channel(client_of(owner));
        let (waiter, _) = wakeups.join(&channel, Some(owner));
        wakeups.mark_ready(&channel);
        // Always "fresh": a release on another thread may have passed this
        // owner over between its attempt and this registration, and
        // checking the queue here costs nothing.
        Ok((waiter, true))
    }

    pub(crate) async fn still_queued(
        &self,
        name: &LockName,
        owner: &Arc<str>,
    ) -> Result<bool, Fault> {
        self.shared
            .call("checking the lock queue", |s| {
                let mut state = s.state.lock().unwrap();
                let holds = state
                    .live(&name.hash, Instant::now())
                    .is_some_and(|l| l.is_owner(owner));
                holds
                    || state
                        .queues
                        .get(&name.hash)
                        .is_some_and(|q| q.iter().any(|w| w.owner == *owner))
            })
            .await
    }

    pub(crate) fn waiting(&self, name: &LockName) -> usize {
        self.shared.wakeups.waiting(name)
    }
}

/// Test hooks of an in-memory client ([`LockClient::memory_with_control`](crate::LockClient::memory_with_control)):
/// end a hold as if its lease ran out, or make the next calls fail as a
/// cut connection does. With them a test exercises its own `on_lost` path
/// and its retry behaviour without a real outage.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), lock_runtime::LockError> {
/// let (client, control) = lock_runtime::LockClient::memory_with_control();
/// let guard = client.lock("order:42").await?;
/// assert!(control.expire("order:42"));
/// // Its holder learns at the next renewal; the key is free now.
/// let next = client.lock("order:42").await?;
/// assert!(next.fence() > guard.fence());
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct MemoryControl {
    shared: Arc<Shared>,
    prefix: Arc<str>,
}

impl MemoryControl {
    /// End every hold of `key` now, as if its lease ran out; `true` if it
    /// was held. The holder finds out at its next renewal (`on_lost`
    /// applies; `release()` says `Err(Lost)`), and the first waiters are
    /// served at once.
    ///
    /// On a semaphore ([`LockClient::semaphore`](crate::LockClient::semaphore))
    /// it ends **one** permit: the one taken first of those still held (the
    /// oldest; a permit handed over to a waiter counts as taken then), and
    /// the next waiter gets it. Call it once per permit to end them all.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), lock_runtime::LockError> {
    /// let (client, control) = lock_runtime::LockClient::memory_with_control();
    /// let first = client.semaphore("render", 2).await?;
    /// let second = client.semaphore("render", 2).await?;
    /// assert!(control.expire("render"));   // ends `first`'s permit
    /// let info = client.inspect("render").await?.expect("one permit left");
    /// assert_eq!(info.holders, [second.holder()]);
    /// # drop(first); Ok(()) }
    /// ```
    pub fn expire(&self, key: &str) -> bool {
        LockName::new(&self.prefix, key).is_ok_and(|name| self.shared.expire(&name))
    }

    /// Make the next `n` calls to the backend (acquire attempts, releases,
    /// renewal rounds of the watchdog, queue checks; in whatever order they
    /// come) fail as on a cut connection. Each failed call is tried again
    /// within the client's `op_timeout`, as with Redis: a few failures are
    /// ridden out, more make the call fail with [`LockError::Backend`](crate::LockError::Backend)
    /// (a lock request then tries again while its `wait` lasts, and a
    /// renewal until the lease runs out). Replaces what was left of an
    /// earlier `fail_next`; `0` stops failing.
    pub fn fail_next(&self, n: usize) {
        self.shared.failures.store(n, Ordering::Release);
    }
}

impl std::fmt::Debug for MemoryControl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryControl")
            .field(
                "failing_next",
                &self.shared.failures.load(Ordering::Relaxed),
            )
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Backend;
    use crate::LockClient;

    fn entries(client: &LockClient) -> usize {
        match &*client.inner.backend {
            Backend::Memory(m) => m.entries(),
            _ => unreachable!(),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn memory_stays_bounded_however_many_keys_are_locked() {
        let client = LockClient::memory();
        for i in 0..2_000 {
            let key = format!("order:{i}");
            client.lock(&key).await.unwrap().release().await.unwrap();
            // Left to expire, not released: kept until its time comes.
            let kept = client
                .lock(format!("job:{i}"))
                .min_hold(Duration::from_secs(60));
            kept.await.unwrap().release().await.unwrap();
            client
                .read_lock(&key)
                .await
                .unwrap()
                .release()
                .await
                .unwrap();
        }
        assert!(entries(&client) >= 2_000, "the min_hold locks are kept");
        tokio::time::advance(Duration::from_secs(61)).await;
        // The next call drops what lapsed (the count's own call does).
        assert_eq!(entries(&client), 0, "nothing is kept for free keys");
    }

    #[tokio::test(start_paused = true)]
    async fn tokens_never_hand_out_zero_and_rise_per_key() {
        let client = LockClient::memory();
        let reader = client.read_lock("doc:1").await.unwrap();
        assert!(reader.fence() >= 1, "0 is the token of an unfenced lock");
        let second = client.read_lock("doc:1").await.unwrap();
        assert_eq!(second.fence(), reader.fence(), "readers of one hold share");
        let first_reader = reader.fence();
        reader.release().await.unwrap();
        second.release().await.unwrap();
        // Other keys move the counter; this key's tokens still only rise.
        let other = client.lock("doc:2").await.unwrap();
        let writer = client.lock("doc:1").await.unwrap();
        assert!(writer.fence() > first_reader && writer.fence() > other.fence());
        let w = writer.fence();
        writer.release().await.unwrap();
        let reader = client.read_lock("doc:1").await.unwrap();
        assert!(
            reader.fence() >= w,
            "a reader's token is at least the last writer's"
        );
        reader.release().await.unwrap();
        let next = client.lock("doc:1").await.unwrap();
        assert!(next.fence() > w);
    }

    #[tokio::test(start_paused = true)]
    async fn failed_calls_are_retried_within_the_operation_timeout() {
        let (client, control) = LockClient::builder()
            .op_timeout(Duration::from_secs(2))
            .wait(Duration::ZERO)
            .memory_with_control()
            .unwrap();
        control.fail_next(3);
        let guard = client.lock("k").await.expect("three cuts are ridden out");
        guard.release().await.unwrap();
        // More than fit in one operation timeout: the call fails as
        // with a connection that stays down.
        control.fail_next(usize::MAX);
        let err = client.lock("k").await.unwrap_err();
        assert!(matches!(err, crate::LockError::Backend(_)), "{err:?}");
        control.fail_next(0);
        client.lock("k").await.unwrap().release().await.unwrap();
    }
}
