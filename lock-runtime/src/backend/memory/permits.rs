//! Semaphores in this process: what `permit.lua`, `release_permit.lua`,
//! `renew_permits.lua` and `keep_permit.lua` do on Redis
//! (`docs/SEMAPHORES.md`), on tokio's clock. A request is admitted while
//! fewer than its own `permits` (from its owner id) hold the key and no
//! live waiter is queued before it; a returned permit goes to the head of
//! the queue, strictly in order.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::{Lock, Queued, Shared, State};
use crate::backend::{Acquired, Queue, Released};
use crate::claims::{self, Grant, Stamp};
use crate::key::{LockName, Mode};

/// One permit holder.
#[derive(Debug, Clone, Copy)]
pub(super) struct Permit {
    /// When its lease ends.
    pub(super) ends: Instant,
    /// Its token; 0 without one (`fence(false)`).
    pub(super) fence: u64,
    /// When it was taken, in the order of every permit of the backend.
    pub(super) taken: u64,
}

/// End the permit taken first (`MemoryControl::expire`).
pub(super) fn end_oldest(permits: &mut HashMap<Arc<str>, Permit>) {
    let oldest = permits
        .iter()
        .min_by_key(|(_, p)| p.taken)
        .map(|(owner, _)| owner.clone());
    if let Some(owner) = oldest {
        permits.remove(&owner);
    }
}

impl State {
    /// Live permit holders of `hash`: `None` if a lock holds it.
    fn permits_held(&mut self, hash: &str, now: Instant) -> Option<usize> {
        match self.live(hash, now) {
            Some(Lock::Permits(permits)) => Some(permits.len()),
            Some(_) => None,
            None => Some(0),
        }
    }

    /// Give `owner` a permit of `name`; its token (0 without `fence`).
    fn take_permit(
        &mut self,
        name: &LockName,
        owner: Arc<str>,
        lease: Duration,
        fence: bool,
        now: Instant,
    ) -> u64 {
        let fence = if fence {
            // From the one counter locks take theirs from: unique and
            // increasing per key across permits and locks.
            self.last_token += 1;
            self.last_token
        } else {
            0
        };
        self.permits_taken += 1;
        let permit = Permit {
            ends: now + lease,
            fence,
            taken: self.permits_taken,
        };
        self.expire_at(now + lease, &name.hash);
        match self.locks.get_mut(&name.hash) {
            Some(Lock::Permits(permits)) => {
                permits.insert(owner, permit);
            }
            _ => {
                self.locks.insert(
                    name.hash.clone(),
                    Lock::Permits(HashMap::from([(owner, permit)])),
                );
            }
        }
        fence
    }

    /// Live waiters queued before `owner` (all live ones if it is not
    /// queued).
    fn queued_before(&self, hash: &str, owner: &str, now: Instant) -> usize {
        self.queues.get(hash).map_or(0, |q| {
            q.iter()
                .take_while(|w| &*w.owner != owner)
                .filter(|w| w.until > now)
                .count()
        })
    }
}

impl Shared {
    /// `permit.lua`: serve the queue's heads, then admit `owner` if a
    /// permit is still free and no live waiter stays before it; else say
    /// busy (and queue it, if it waits).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn acquire_permit(
        &self,
        state: &mut State,
        name: &LockName,
        owner: &Arc<str>,
        permits: u32,
        lease: Duration,
        queue: Queue,
        now: Instant,
    ) -> Acquired {
        match state.live(&name.hash, now) {
            Some(Lock::Permits(held)) => {
                if let Some(p) = held.get_mut(&**owner) {
                    // An earlier send ran, or a release handed it over:
                    // the lease is set again.
                    p.ends = now + lease;
                    let fence = p.fence;
                    state.expire_at(now + lease, &name.hash);
                    return Acquired::Repeated { fence };
                }
            }
            Some(lock) => {
                // A lock: busy, and a permit does not queue behind it.
                let ttl = Some(lock.expires() - now);
                return Acquired::Busy { ttl, queued: None };
            }
            None => {}
        }
        self.serve_heads(state, name, now, Some(owner));
        let held = state.permits_held(&name.hash, now).unwrap_or(0);
        if held < permits as usize && state.queued_before(&name.hash, owner, now) == 0 {
            state.leave_queue(&name.hash, owner);
            let fence = state.take_permit(name, owner.clone(), lease, queue.fence, now);
            return Acquired::Fresh { fence };
        }
        // When the first live lease ends: a waiter asks again then, if no
        // release has handed it a permit.
        let ttl = match state.locks.get(&name.hash) {
            Some(Lock::Permits(held)) => held.values().map(|p| p.ends - now).min(),
            _ => None,
        };
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
        Acquired::Busy {
            ttl,
            queued: Some(crate::backend::Queued::Here),
        }
    }

    /// `release_permit.lua`: the owner's permit goes back (or, if it holds
    /// none, it leaves the queue), and the queue is served.
    pub(super) fn release_permit(
        &self,
        state: &mut State,
        name: &LockName,
        owner: &Arc<str>,
        now: Instant,
    ) -> Released {
        let released = match state.live(&name.hash, now) {
            Some(Lock::Permits(held)) => {
                let gone = held.remove(&**owner).is_some();
                if held.is_empty() {
                    state.locks.remove(&name.hash);
                }
                gone
            }
            // A lock: not this owner's.
            Some(_) => return Released::NotOwner,
            None => false,
        };
        if !released {
            // A waiter giving up: those behind it may be admitted now.
            state.leave_queue(&name.hash, owner);
        }
        self.serve_permits(state, name, now);
        if released {
            Released::Freed
        } else {
            Released::NotOwner
        }
    }

    /// Hand free permits to the queue's heads in order: a head past its
    /// stay is dropped, one whose client no longer listens is skipped, and
    /// one whose own `permits` do not admit the holders stops the serving
    /// (strictly first come, first served).
    pub(super) fn serve_permits(&self, state: &mut State, name: &LockName, now: Instant) {
        self.serve_heads(state, name, now, None);
    }

    /// [`serve_permits`](Self::serve_permits), stopping at `asking` (a
    /// request that is at the head is admitted by its own call, not
    /// granted).
    fn serve_heads(
        &self,
        state: &mut State,
        name: &LockName,
        now: Instant,
        asking: Option<&Arc<str>>,
    ) {
        while let Some(head) = state.queues.get(&name.hash).and_then(VecDeque::front) {
            if asking.is_some_and(|o| *o == head.owner) {
                break;
            }
            if head.until <= now {
                state.queues.get_mut(&name.hash).map(VecDeque::pop_front);
                continue;
            }
            // A lock's waiter heads the queue: not for a permit to serve.
            let Mode::Permit(permits) = Mode::of(&head.owner) else {
                break;
            };
            match state.permits_held(&name.hash, now) {
                Some(held) if held < permits as usize => {}
                _ => break,
            }
            let Some(next) = state
                .queues
                .get_mut(&name.hash)
                .and_then(VecDeque::pop_front)
            else {
                break;
            };
            let grant = Grant {
                fence: if next.fence { state.last_token + 1 } else { 0 },
                at: Stamp::Local(now),
            };
            if claims::deliver(&next.owner, grant) {
                state.take_permit(name, next.owner, next.lease, next.fence, now);
            }
        }
        if state.queues.get(&name.hash).is_some_and(VecDeque::is_empty) {
            state.queues.remove(&name.hash);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::backend::Backend;
    use crate::{LockClient, LockError, LockMode};

    /// What the backend keeps once every lease and stay (at most 600 s in
    /// these tests) has run out: nothing, if no one holds or waits.
    async fn entries(client: &LockClient) -> usize {
        tokio::time::advance(Duration::from_secs(601)).await;
        match &*client.inner.backend {
            Backend::Memory(m) => m.entries(),
            _ => unreachable!(),
        }
    }

    async fn waiting(client: &LockClient, key: &str) -> usize {
        client.inspect(key).await.unwrap().map_or(0, |i| i.waiters)
    }

    #[tokio::test(start_paused = true)]
    async fn at_most_n_hold_and_a_returned_permit_goes_to_the_first_waiter() {
        let client = LockClient::memory();
        let a = client.semaphore("render", 2).await.unwrap();
        let b = client.semaphore("render", 2).await.unwrap();
        assert!(b.fence() > a.fence(), "tokens rise per key");
        let busy = client.semaphore("render", 2).wait(Duration::ZERO).await;
        assert!(matches!(busy, Err(LockError::Timeout { .. })), "{busy:?}");
        let wait = |n| {
            let client = client.clone();
            tokio::spawn(async move {
                let guard = client
                    .semaphore("render", 2)
                    .wait(Duration::from_secs(600))
                    .await
                    .unwrap();
                (n, guard)
            })
        };
        let first = wait(1);
        while waiting(&client, "render").await < 1 {
            tokio::task::yield_now().await;
        }
        let second = wait(2);
        while waiting(&client, "render").await < 2 {
            tokio::task::yield_now().await;
        }
        let info = client.inspect("render").await.unwrap().unwrap();
        assert_eq!(info.mode, LockMode::Semaphore { permits: 2 });
        assert_eq!(info.holders.len(), 2);
        assert_eq!(info.fence, Some(b.fence()));

        a.release().await.unwrap();
        let (n, c) = first.await.unwrap();
        assert_eq!(n, 1, "in the order they queued");
        assert!(c.fence() > b.fence());
        let info = client.inspect("render").await.unwrap().unwrap();
        assert_eq!(info.holders.len(), 2, "{info:?}");
        assert_eq!(info.waiters, 1);
        assert!(!second.is_finished());
        c.release().await.unwrap();
        let (_, d) = second.await.unwrap();
        d.release().await.unwrap();
        b.release().await.unwrap();
        assert_eq!(client.inspect("render").await.unwrap(), None);
        assert_eq!(
            entries(&client).await,
            0,
            "nothing stays once no one holds or waits"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn memory_stays_bounded_however_many_semaphores_are_used() {
        let client = LockClient::memory();
        for i in 0..2_000 {
            let key = format!("render:{i}");
            let a = client.semaphore(&key, 2).await.unwrap();
            let b = client.semaphore(&key, 2).await.unwrap();
            a.release().await.unwrap();
            b.release().await.unwrap();
            // Left to its min_hold: kept until then.
            let kept = client.semaphore(format!("import:{i}"), 3);
            let kept = kept.min_hold(Duration::from_secs(60)).await.unwrap();
            kept.release().await.unwrap();
        }
        assert_eq!(client.locks("render:*").await.unwrap(), []);
        assert_eq!(client.locks("import:*").await.unwrap().len(), 2_000);
        assert_eq!(entries(&client).await, 0, "nothing is kept for free keys");
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiter_of_a_smaller_semaphore_holds_back_those_behind_it() {
        // Two versions disagree on N: 3 hold under N = 3; a request with
        // N = 2 waits at the head, and a later N = 3 request does not pass it.
        let client = LockClient::memory();
        let a = client.semaphore("import", 3).await.unwrap();
        let b = client.semaphore("import", 3).await.unwrap();
        let small = {
            let client = client.clone();
            tokio::spawn(async move {
                client
                    .semaphore("import", 2)
                    .wait(Duration::from_secs(600))
                    .await
            })
        };
        while waiting(&client, "import").await < 1 {
            tokio::task::yield_now().await;
        }
        let behind = client.semaphore("import", 3).wait(Duration::ZERO).await;
        assert!(
            matches!(behind, Err(LockError::Timeout { .. })),
            "{behind:?}"
        );
        a.release().await.unwrap();
        let small = small.await.unwrap().unwrap();
        let info = client.inspect("import").await.unwrap().unwrap();
        assert_eq!(
            info.mode,
            LockMode::Semaphore { permits: 3 },
            "the largest N held"
        );
        assert_eq!(info.holders.len(), 2);
        // Now N = 3 admits a third holder.
        let third = client
            .semaphore("import", 3)
            .wait(Duration::ZERO)
            .await
            .unwrap();
        for g in [b, small, third] {
            g.release().await.unwrap();
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_lock_and_a_semaphore_of_one_key_exclude_each_other() {
        let client = LockClient::memory();
        let lock = client.lock("k").await.unwrap();
        let permit = client.semaphore("k", 4).wait(Duration::from_secs(1)).await;
        assert!(
            matches!(permit, Err(LockError::Timeout { .. })),
            "{permit:?}"
        );
        assert_eq!(
            waiting(&client, "k").await,
            0,
            "a permit does not queue behind a lock"
        );
        lock.release().await.unwrap();
        let permit = client.semaphore("k", 4).await.unwrap();
        for busy in [client.lock("k"), client.read_lock("k")] {
            let busy = busy.wait(Duration::from_secs(1)).await;
            assert!(matches!(busy, Err(LockError::Timeout { .. })), "{busy:?}");
        }
        assert_eq!(waiting(&client, "k").await, 0);
        permit.release().await.unwrap();
        client
            .lock("k")
            .wait(Duration::ZERO)
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
        assert_eq!(entries(&client).await, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_cancelled_waiter_leaves_nothing_and_lets_the_next_one_in() {
        let client = LockClient::memory();
        let held = client.semaphore("s", 1).await.unwrap();
        let cancelled = {
            let client = client.clone();
            tokio::spawn(async move {
                client
                    .semaphore("s", 1)
                    .wait(Duration::from_secs(600))
                    .await
            })
        };
        while waiting(&client, "s").await < 1 {
            tokio::task::yield_now().await;
        }
        let next = {
            let client = client.clone();
            tokio::spawn(async move {
                client
                    .semaphore("s", 1)
                    .wait(Duration::from_secs(600))
                    .await
            })
        };
        while waiting(&client, "s").await < 2 {
            tokio::task::yield_now().await;
        }
        cancelled.abort();
        assert!(cancelled.await.unwrap_err().is_cancelled());
        held.release().await.unwrap();
        let next = next.await.unwrap().unwrap();
        let info = client.inspect("s").await.unwrap().unwrap();
        assert_eq!((info.holders.len(), info.waiters), (1, 0), "{info:?}");
        next.release().await.unwrap();
        assert_eq!(
            client.inspect("s").await.unwrap(),
            None,
            "the cancelled waiter left"
        );
        assert_eq!(entries(&client).await, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn min_hold_keeps_the_permit_counted_until_then() {
        let client = LockClient::memory();
        let kept = client
            .semaphore("job", 1)
            .min_hold(Duration::from_secs(10))
            .await
            .unwrap();
        let holder = kept.holder().to_owned();
        kept.release().await.unwrap();
        let info = client.inspect("job").await.unwrap().unwrap();
        assert_eq!(info.holders, [format!("{holder}!")]);
        let busy = client
            .semaphore("job", 1)
            .wait(Duration::from_secs(5))
            .await;
        assert!(matches!(busy, Err(LockError::Timeout { .. })), "{busy:?}");
        tokio::time::advance(Duration::from_secs(6)).await;
        client
            .semaphore("job", 1)
            .wait(Duration::ZERO)
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn force_release_frees_every_permit_and_force_release_if_one() {
        let client = LockClient::memory();
        let a = client.semaphore("pdf", 3).await.unwrap();
        let b = client.semaphore("pdf", 3).await.unwrap();
        assert!(client.force_release_if("pdf", a.holder()).await.unwrap());
        assert!(!client.force_release_if("pdf", a.holder()).await.unwrap());
        let info = client.inspect("pdf").await.unwrap().unwrap();
        assert_eq!(info.holders, [b.holder()]);
        let c = client.semaphore("pdf", 3).await.unwrap();
        assert!(client.force_release("pdf").await.unwrap());
        assert_eq!(client.inspect("pdf").await.unwrap(), None);
        for g in [a, b, c] {
            assert!(matches!(g.release().await, Err(LockError::Lost { .. })));
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_dead_holders_permit_lapses_one_lease_later() {
        let (client, control) = LockClient::builder()
            .lease(Duration::from_secs(3))
            .memory_with_control()
            .unwrap();
        let guard = client.semaphore("s", 1).await.unwrap();
        // Renewals fail from now on: as if the holder's process had died.
        control.fail_next(usize::MAX);
        let lost = guard.lost();
        tokio::time::advance(Duration::from_secs(4)).await;
        lost.await;
        control.fail_next(0);
        let next = client.semaphore("s", 1).wait(Duration::ZERO).await.unwrap();
        assert!(next.fence() > guard.fence());
    }
}
