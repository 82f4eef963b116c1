//! Locks in this process: the same protocol as Redis (one owner per
//! acquisition, lease expiry, fencing, a queue of waiters served in order
//! by the release) for single-instance services and users' unit tests.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use super::fault::Fault;
use super::{Acquired, Queue, Released, Renewal, Renewed};
use crate::key::client_of;
use crate::key::LockName;
use crate::wakeups::{Grant, Stamp, Waiter, Wakeups};

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

struct Lock {
    owner: Arc<str>,
    expires: Instant,
}

impl State {
    /// The live lock under `hash`, dropping it if its lease ran out.
    fn live(&mut self, hash: &str, now: Instant) -> Option<&mut Lock> {
        if self.locks.get(hash).is_some_and(|l| l.expires <= now) {
            self.locks.remove(hash);
        }
        self.locks.get_mut(hash)
    }
}

impl State {
    /// Make `owner` the holder; returns its token.
    fn take(&mut self, name: &LockName, owner: Arc<str>, lease: Duration, now: Instant) -> u64 {
        self.locks.insert(
            name.hash.clone(),
            Lock {
                owner,
                expires: now + lease,
            },
        );
        let fence = self.fences.entry(name.hash.clone()).or_insert(0);
        *fence += 1;
        *fence
    }

    fn leave_queue(&mut self, hash: &str, owner: &str) {
        if let Some(q) = self.queues.get_mut(hash) {
            q.retain(|w| &*w.owner != owner);
            if q.is_empty() {
                self.queues.remove(hash);
            }
        }
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
        if let Some(lock) = state.live(&name.hash, now) {
            if lock.owner == *owner {
                lock.expires = now + lease;
                let fence = state.fences.get(&name.hash).copied().unwrap_or(0);
                return Acquired::Repeated { fence };
            }
            let ttl = Some(lock.expires - now);
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
            Some(lock) if lock.owner == *owner => {}
            _ => {
                state.leave_queue(&name.hash, owner);
                return Released::NotOwner;
            }
        }
        state.locks.remove(&name.hash);
        // Serve the first waiter still waiting whose client takes the
        // grant; the rest stay queued.
        while let Some(next) = state
            .queues
            .get_mut(&name.hash)
            .and_then(VecDeque::pop_front)
        {
            if next.until <= now {
                continue;
            }
            let fence = state.fences.get(&name.hash).copied().unwrap_or(0) + 1;
            let channel = name.grant_channel(client_of(&next.owner));
            let grant = Grant {
                fence,
                at: Stamp::Local(now),
            };
            if self.wakeups.deliver(&channel, &next.owner, grant) {
                state.take(name, next.owner, next.lease, now);
                break;
            }
        }
        if state.queues.get(&name.hash).is_some_and(VecDeque::is_empty) {
            state.queues.remove(&name.hash);
        }
        Released::Freed
    }

    fn renew_now(&self, r: &Renewal) -> Renewed {
        let now = Instant::now();
        let mut state = self.state.lock().unwrap();
        match state.live(&r.name.hash, now) {
            Some(lock) if lock.owner == r.owner => {
                lock.expires = now + r.lease;
                Renewed::Yes
            }
            _ => Renewed::NotOwner,
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
            .is_some_and(|l| l.owner == *owner);
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
