//! Locks in this process: the same protocol as Redis (one owner per
//! acquisition, lease expiry, fencing, a queue of waiters served in order
//! by the release) for single-instance services and users' unit tests.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use super::fault::Fault;
use super::{Acquired, Queue, Released, Renewal, Renewed};
use crate::claims::{self, Grant, Stamp};
use crate::key::LockName;
use crate::key::{client_of, is_reader};
use crate::wakeups::{Waiter, Wakeups};

mod operations;

#[derive(Default)]
pub(crate) struct MemoryBackend {
    state: Arc<Mutex<State>>,
    wakeups: Arc<Wakeups>,
}

#[derive(Default)]
struct State {
    locks: HashMap<Arc<str>, Lock>,
    fences: HashMap<Arc<str>, u64>,
    queues: HashMap<Arc<str>, VecDeque<Queued>>,
}

/// A waiter in a lock's queue.
struct Queued {
    owner: Arc<str>,
    lease: Duration,
    until: Instant,
}

/// A held lock: one writer, or readers each with a lease of its own.
enum Lock {
    Written { owner: Arc<str>, expires: Instant },
    Read(HashMap<Arc<str>, Instant>),
}

impl Lock {
    fn is_owner(&self, owner: &str) -> bool {
        match self {
            Lock::Written { owner: o, .. } => &**o == owner,
            Lock::Read(readers) => readers.contains_key(owner),
        }
    }

    /// When the last lease ends.
    fn expires(&self) -> Instant {
        match self {
            Lock::Written { expires, .. } => *expires,
            Lock::Read(readers) => readers.values().copied().max().unwrap_or_else(Instant::now),
        }
    }

    /// Extend `owner`'s lease, if it holds one.
    fn extend(&mut self, owner: &str, until: Instant) -> bool {
        match self {
            Lock::Written { owner: o, expires } if &**o == owner => *expires = until,
            Lock::Read(readers) => match readers.get_mut(owner) {
                Some(ends) => *ends = until,
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
            Some(Lock::Read(readers)) => {
                readers.retain(|_, ends| *ends > now);
                readers.is_empty()
            }
            Some(Lock::Written { expires, .. }) => *expires <= now,
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
}

impl State {
    /// Make `owner` the holder (a reader joins the readers); returns its
    /// token: a writer's is new, a reader's the current one.
    fn take(&mut self, name: &LockName, owner: Arc<str>, lease: Duration, now: Instant) -> u64 {
        let fence = self.fences.entry(name.hash.clone()).or_insert(0);
        if is_reader(&owner) {
            match self.locks.get_mut(&name.hash) {
                Some(Lock::Read(readers)) => {
                    readers.insert(owner, now + lease);
                }
                _ => {
                    self.locks.insert(
                        name.hash.clone(),
                        Lock::Read(HashMap::from([(owner, now + lease)])),
                    );
                }
            }
            return *fence;
        }
        *fence += 1;
        let fence = *fence;
        self.locks.insert(
            name.hash.clone(),
            Lock::Written {
                owner,
                expires: now + lease,
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
    pub(crate) fn new() -> Self {
        Self::default()
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
        let shared = is_reader(owner)
            && matches!(state.live(&name.hash, now), Some(Lock::Read(_)))
            && !state.writer_waits(&name.hash, now);
        if let Some(lock) = state.live(&name.hash, now).filter(|_| !shared) {
            if lock.extend(owner, now + lease) {
                let fence = state.fences.get(&name.hash).copied().unwrap_or(0);
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
                }),
            }
            return Acquired::Busy {
                ttl,
                queued: Some(super::Queued::Here),
            };
        }
        if queue.rejoin {
            state.leave_queue(&name.hash, owner);
        }
        let fence = state.take(name, owner.clone(), lease, now);
        Acquired::Fresh { fence }
    }

    fn release_now(&self, name: &LockName, owner: &Arc<str>) -> Released {
        let now = Instant::now();
        let mut state = self.state.lock().unwrap();
        match state.live(&name.hash, now) {
            Some(Lock::Read(readers)) if readers.contains_key(&**owner) => {
                readers.remove(&**owner);
                if !readers.is_empty() {
                    return Released::Freed;
                }
            }
            Some(lock) if lock.is_owner(owner) => {}
            Some(lock) => {
                // A queued writer giving up: readers that queued only
                // behind it join the readers now.
                let joining = matches!(lock, Lock::Read(_)) && !is_reader(owner);
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
            let fence = state.fences.get(&name.hash).copied().unwrap_or(0) + u64::from(!reader);
            let grant = Grant {
                fence,
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

    fn renew_now(&self, r: &Renewal) -> Renewed {
        let now = Instant::now();
        let mut state = self.state.lock().unwrap();
        match state.live(&r.name.hash, now) {
            Some(lock) if lock.is_owner(&r.owner) => {
                lock.extend(&r.owner, now + r.lease);
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
        let kept: Arc<str> = format!("{owner}!").into();
        match state.live(&name.hash, now) {
            Some(Lock::Written { owner: o, expires }) if o == owner => {
                *o = kept;
                *expires = (*expires).min(now + left);
                Released::Freed
            }
            Some(Lock::Read(readers)) => match readers.remove(&**owner) {
                Some(ends) => {
                    readers.insert(kept, ends.min(now + left));
                    Released::Freed
                }
                None => Released::NotOwner,
            },
            _ => Released::NotOwner,
        }
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
        let out = self.acquire_now(name, owner, lease, queue);
        Ok(out)
    }

    pub(crate) async fn release(
        &self,
        name: &LockName,
        owner: &Arc<str>,
    ) -> Result<Released, Fault> {
        let out = self.release_now(name, owner);
        Ok(out)
    }

    pub(crate) async fn keep(
        &self,
        name: &LockName,
        owner: &Arc<str>,
        left: Duration,
    ) -> Result<Released, Fault> {
        Ok(self.keep_now(name, owner, left))
    }

    pub(crate) async fn renew(&self, batch: Vec<Renewal>) -> Vec<Renewed> {
        let out = batch.iter().map(|r| self.renew_now(r)).collect();
        out
    }

    pub(crate) async fn subscribe(
        &self,
        name: &LockName,
        owner: &Arc<str>,
    ) -> Result<(Waiter, bool), Fault> {
        let channel = name.grant_channel(client_of(owner));
        let (waiter, _) = self.wakeups.join(&channel, Some(owner));
        self.wakeups.mark_ready(&channel);
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
        let mut state = self.state.lock().unwrap();
        let holds = state
            .live(&name.hash, Instant::now())
            .is_some_and(|l| l.is_owner(owner));
        let queued = holds
            || state
                .queues
                .get(&name.hash)
                .is_some_and(|q| q.iter().any(|w| w.owner == *owner));
        Ok(queued)
    }

    pub(crate) fn waiting(&self, name: &LockName) -> usize {
        self.wakeups.waiters_under(&name.grants())
    }
}
