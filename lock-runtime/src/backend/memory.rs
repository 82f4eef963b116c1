//! Locks in this process: the same protocol as Redis (one owner per
//! acquisition, lease expiry, fencing, wake-up on release) for
//! single-instance services and users' unit tests.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use super::{Acquired, Backend, BoxFuture, Released, Renewal, Renewed};
use crate::key::LockName;
use crate::wakeups::{Waiter, Wakeups};
use crate::LockError;

#[derive(Default)]
pub(crate) struct MemoryBackend {
    state: Arc<Mutex<State>>,
    wakeups: Arc<Wakeups>,
}

#[derive(Default)]
struct State {
    locks: HashMap<Arc<str>, Lock>,
    fences: HashMap<Arc<str>, u64>,
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

impl MemoryBackend {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    fn acquire_now(&self, name: &LockName, owner: &Arc<str>, lease: Duration) -> Acquired {
        let now = Instant::now();
        let mut state = self.state.lock().unwrap();
        if let Some(lock) = state.live(&name.hash, now) {
            if lock.owner == *owner {
                lock.expires = now + lease;
                let fence = state.fences.get(&name.fence).copied().unwrap_or(0);
                return Acquired::Repeated { fence };
            }
            return Acquired::Busy {
                ttl: Some(lock.expires - now),
            };
        }
        state.locks.insert(
            name.hash.clone(),
            Lock {
                owner: owner.clone(),
                expires: now + lease,
            },
        );
        let fence = state.fences.entry(name.fence.clone()).or_insert(0);
        *fence += 1;
        Acquired::Fresh { fence: *fence }
    }

    fn release_now(&self, name: &LockName, owner: &Arc<str>) -> Released {
        let now = Instant::now();
        let mut state = self.state.lock().unwrap();
        match state.live(&name.hash, now) {
            Some(lock) if lock.owner == *owner => {}
            _ => return Released::NotOwner,
        }
        state.locks.remove(&name.hash);
        drop(state);
        self.wakeups.notify(&name.channel);
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

impl Backend for MemoryBackend {
    fn acquire(
        &self,
        name: &LockName,
        owner: &Arc<str>,
        lease: Duration,
    ) -> BoxFuture<Result<Acquired, LockError>> {
        let out = self.acquire_now(name, owner, lease);
        Box::pin(async move { Ok(out) })
    }

    fn release(&self, name: &LockName, owner: &Arc<str>) -> BoxFuture<Result<Released, LockError>> {
        let out = self.release_now(name, owner);
        Box::pin(async move { Ok(out) })
    }

    fn renew(&self, batch: Vec<Renewal>) -> BoxFuture<Vec<Renewed>> {
        let out = batch.iter().map(|r| self.renew_now(r)).collect();
        Box::pin(async move { out })
    }

    fn subscribe(&self, name: &LockName) -> BoxFuture<Result<Waiter, LockError>> {
        let (waiter, _) = self.wakeups.join(&name.channel);
        self.wakeups.mark_ready(&name.channel);
        Box::pin(async move { Ok(waiter) })
    }

    fn waiting(&self, name: &LockName) -> usize {
        self.wakeups.waiters(&name.channel)
    }
}
