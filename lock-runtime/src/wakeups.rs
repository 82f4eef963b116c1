//! The waiters of one client, by channel: one subscription per lock
//! however many tasks wait on it.
//!
//! A queued waiter is handed the lock by the holder's release: the grant
//! message names its owner id and lands in that request's mailbox
//! (`claims.rs`), whatever the request is doing then. Nobody else is
//! woken; the waiter already holds the lock.
//!
//! Waiters that do not queue (Redlock) are woken instead: a release
//! message wakes one waiter of the client, not all of them, since only one
//! can take the lock. A wake-up that lands while nobody is parked is kept
//! for the next waiter to park; one whose waiter goes away before its
//! attempt finished is passed on.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

use crate::claims::{self, Grant, Mailbox};
use crate::key::LockName;

/// Called with a channel nobody waits on any more.
pub(crate) type OnIdle = Arc<dyn Fn(Arc<str>) + Send + Sync>;

/// Why a parked waiter woke.
#[derive(Debug)]
pub(crate) enum Woken {
    /// The lock is this waiter's.
    Granted(Grant),
    /// Try again: released (waiters that do not queue), or a message may
    /// have been missed (reconnect, failover).
    Retry,
}

#[derive(Default)]
pub(crate) struct Wakeups {
    slots: Mutex<HashMap<Arc<str>, Slot>>,
    on_idle: Option<OnIdle>,
    /// Releases are no longer published where this registry listens.
    retired: AtomicBool,
}

struct Slot {
    wake: Arc<Notify>,
    waiters: usize,
    /// Waiters parked for a release: queued, listening, and past the
    /// check that no release slipped by meanwhile.
    parked: usize,
    /// The backend confirmed it listens on this channel.
    ready: bool,
    /// SUBSCRIBEs sent whose confirmation has not come back: a
    /// confirmation is not a resubscription after a reconnect.
    confirming: u32,
    /// The server ended this subscription by itself (a Redis Cluster slot
    /// moved to another node): its waiters must subscribe again.
    dropped: bool,
}

impl Wakeups {
    pub(crate) fn new(on_idle: Option<OnIdle>) -> Self {
        Wakeups {
            on_idle,
            ..Wakeups::default()
        }
    }

    /// Register a waiter (with `owner`, a request that may be handed the
    /// lock: its grants land in that request's mailbox); says whether the
    /// channel still needs subscribing.
    pub(crate) fn join(
        self: &Arc<Self>,
        channel: &Arc<str>,
        owner: Option<&Arc<str>>,
    ) -> (Waiter, bool) {
        let mut slots = self.slots.lock().unwrap();
        let slot = slots.entry(channel.clone()).or_insert_with(|| Slot {
            wake: Arc::new(Notify::new()),
            waiters: 0,
            parked: 0,
            ready: false,
            confirming: 0,
            dropped: false,
        });
        slot.waiters += 1;
        let waiter = Waiter {
            wake: slot.wake.clone(),
            mailbox: owner.and_then(|o| claims::mailbox(o)),
            channel: channel.clone(),
            registry: self.clone(),
            woken: false,
            parked: false,
        };
        (waiter, !slot.ready)
    }

    /// A SUBSCRIBE is about to be sent on `channel`; until the returned
    /// guard is [`Subscribing::confirmed`], a failure or a cancellation
    /// takes the expectation back.
    pub(crate) fn subscribing<'a>(&'a self, channel: &'a str) -> Subscribing<'a> {
        if let Some(slot) = self.slots.lock().unwrap().get_mut(channel) {
            slot.confirming += 1;
        }
        Subscribing {
            registry: self,
            channel,
            done: false,
        }
    }

    pub(crate) fn mark_ready(&self, channel: &str) {
        if let Some(slot) = self.slots.lock().unwrap().get_mut(channel) {
            slot.ready = true;
            slot.dropped = false;
        }
    }

    /// The server ended the subscription to `channel` by itself (its slot
    /// moved to another node of a Redis Cluster): grants published from
    /// now on reach nobody here, and releases skip these waiters. Every
    /// waiter there subscribes again, where the slot now is, and checks
    /// whether it was passed over meanwhile.
    #[cfg(feature = "cluster")]
    pub(crate) fn dropped_by_server(&self, channel: &str) {
        if let Some(slot) = self.slots.lock().unwrap().get_mut(channel) {
            slot.ready = false;
            slot.dropped = true;
            slot.wake.notify_waiters();
            slot.wake.notify_one();
        }
    }

    /// Drop the slot if nobody waits; says whether it did.
    pub(crate) fn remove_if_idle(&self, channel: &str) -> bool {
        let mut slots = self.slots.lock().unwrap();
        match slots.get(channel) {
            Some(slot) if slot.waiters == 0 => {
                slots.remove(channel);
                true
            }
            _ => false,
        }
    }

    #[cfg(feature = "cluster")]
    pub(crate) fn waiters(&self, channel: &str) -> usize {
        self.slots
            .lock()
            .unwrap()
            .get(channel)
            .map_or(0, |s| s.waiters)
    }

    /// Waiters of `name` parked for a release, on its release channel or on
    /// any of its grant channels (see [`Waiter::released`]): what a release
    /// now reaches.
    pub(crate) fn waiting(&self, name: &LockName) -> usize {
        let (channel, grants) = (name.channel(), name.grants());
        self.slots
            .lock()
            .unwrap()
            .iter()
            .filter(|(c, _)| **c == channel || c.starts_with(&grants))
            .map(|(_, s)| s.parked)
            .sum()
    }

    /// A grant message heard on the grant `channel` of a lock.
    pub(crate) fn granted(&self, channel: &str, owner: &str, grant: Grant) {
        claims::granted(channel, owner, grant);
    }

    pub(crate) fn notify(&self, channel: &str) {
        if let Some(slot) = self.slots.lock().unwrap().get(channel) {
            slot.wake.notify_one();
        }
    }

    /// The channel was subscribed again after a reconnect: wake one waiter
    /// if it was already listened on (not for a first subscription, whose
    /// waiter checks anyway).
    pub(crate) fn resubscribed(&self, channel: &str) {
        if let Some(slot) = self.slots.lock().unwrap().get_mut(channel) {
            if slot.confirming > 0 {
                slot.confirming -= 1;
            } else {
                // Subscribed again after a reconnect. Grants published
                // meanwhile reached nobody, and their waiters were skipped:
                // every waiter here checks.
                slot.ready = true;
                slot.wake.notify_waiters();
                slot.wake.notify_one();
            }
        }
    }

    /// The subscription connection dropped: until it is back, releases
    /// reach nobody here. New waiters subscribe (and check) afresh, and
    /// everyone waiting asks again.
    pub(crate) fn disconnected(&self) {
        for slot in self.slots.lock().unwrap().values_mut() {
            slot.ready = false;
        }
        self.notify_all();
    }

    /// The one connection that listened on every channel ended, and
    /// nothing opens it again by itself (PostgreSQL's listening session):
    /// every waiter asks again and listens afresh, as after a Cluster
    /// slot's move, rather than wait on a session that is gone.
    #[cfg(feature = "postgres")]
    pub(crate) fn listener_gone(&self) {
        for slot in self.slots.lock().unwrap().values_mut() {
            slot.ready = false;
            slot.dropped = true;
        }
        self.notify_all();
    }

    /// Stop being where waiters listen: wake them all to go elsewhere.
    pub(crate) fn retire(&self) {
        self.retired.store(true, Ordering::Release);
        self.notify_all();
    }

    /// Wake everyone: messages may have been missed (reconnect).
    pub(crate) fn notify_all(&self) {
        for slot in self.slots.lock().unwrap().values() {
            slot.wake.notify_waiters();
            slot.wake.notify_one();
        }
    }

    fn leave(&self, channel: &Arc<str>, parked: bool) {
        let idle = {
            let mut slots = self.slots.lock().unwrap();
            match slots.get_mut(channel) {
                Some(slot) => {
                    slot.waiters -= 1;
                    slot.parked -= usize::from(parked);
                    slot.waiters == 0
                }
                None => false,
            }
        };
        if idle {
            match &self.on_idle {
                Some(on_idle) => on_idle(channel.clone()),
                None => {
                    self.remove_if_idle(channel);
                }
            }
        }
    }
}

/// A SUBSCRIBE in flight (see [`Wakeups::subscribing`]).
pub(crate) struct Subscribing<'a> {
    registry: &'a Wakeups,
    channel: &'a str,
    done: bool,
}

impl Subscribing<'_> {
    /// Redis confirmed: the channel is listened on.
    pub(crate) fn confirmed(mut self) {
        self.done = true;
        self.registry.mark_ready(self.channel);
    }
}

impl Drop for Subscribing<'_> {
    fn drop(&mut self) {
        if !self.done {
            if let Some(slot) = self.registry.slots.lock().unwrap().get_mut(self.channel) {
                slot.confirming = slot.confirming.saturating_sub(1);
            }
        }
    }
}

/// One task waiting for a lock.
pub(crate) struct Waiter {
    wake: Arc<Notify>,
    /// Queued waiters: where the request's grant lands.
    mailbox: Option<Arc<Mailbox>>,
    channel: Arc<str>,
    registry: Arc<Wakeups>,
    /// Picked by a wake-up and not yet [`consumed`](Waiter::consumed).
    woken: bool,
    /// Counted in its slot's `parked`.
    parked: bool,
}

impl Waiter {
    /// Resolves with a grant, or when a wake-up picks this waiter. A pick
    /// that is dropped unpolled passes to the next waiter (`Notify` does
    /// that), and so does one whose waiter is dropped before it is
    /// consumed.
    ///
    /// The request calls this once it has queued, listens, and has checked
    /// that no release slipped by before it listened: from here on the
    /// waiter is counted as waiting (`waiting_here`), and a release reaches
    /// it.
    pub(crate) async fn released(&mut self) -> Woken {
        self.park();
        let Some(mailbox) = &self.mailbox else {
            self.wake.notified().await;
            self.woken = true;
            return Woken::Retry;
        };
        let mailbox = mailbox.clone();
        loop {
            if let Some(g) = mailbox.take() {
                return Woken::Granted(g);
            }
            tokio::select! {
                biased;
                _ = mailbox.arrived.notified() => {}
                _ = self.wake.notified() => {
                    self.woken = true;
                    return Woken::Retry;
                }
            }
        }
    }

    fn park(&mut self) {
        if !self.parked {
            self.parked = true;
            if let Some(slot) = self.registry.slots.lock().unwrap().get_mut(&self.channel) {
                slot.parked += 1;
            }
        }
    }

    /// The attempt that followed the wake-up got its answer: the wake-up
    /// served its purpose.
    pub(crate) fn consumed(&mut self) {
        self.woken = false;
    }

    /// Releases are no longer published where this waiter listens.
    pub(crate) fn is_stale(&self) -> bool {
        self.registry.retired.load(Ordering::Acquire)
            || self
                .registry
                .slots
                .lock()
                .unwrap()
                .get(&self.channel)
                .is_some_and(|s| s.dropped)
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        if self.woken {
            // Cancelled between its wake-up and its attempt: another waiter
            // of this client may take the lock instead.
            self.registry.notify(&self.channel);
        }
        self.registry.leave(&self.channel, self.parked);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn registry() -> Arc<Wakeups> {
        Arc::new(Wakeups::default())
    }

    #[tokio::test]
    async fn a_release_after_join_is_seen() {
        let reg = registry();
        let ch: Arc<str> = "c".into();
        let (mut w, needs_sub) = reg.join(&ch, None);
        assert!(needs_sub);
        reg.notify("c");
        tokio::time::timeout(std::time::Duration::from_secs(5), w.released())
            .await
            .expect("wake-up was lost");
        drop(w);
        assert!(reg.slots.lock().unwrap().is_empty());
    }

    /// Two waiters of one channel and one release: (the woken one, the
    /// other).
    async fn one_of_two_woken(reg: &Arc<Wakeups>) -> (Waiter, Waiter) {
        let ch: Arc<str> = "c".into();
        let (mut a, _) = reg.join(&ch, None);
        let (mut b, _) = reg.join(&ch, None);
        reg.notify("c");
        let a_first = tokio::select! {
            _ = a.released() => true,
            _ = b.released() => false,
        };
        if a_first {
            (a, b)
        } else {
            (b, a)
        }
    }

    #[tokio::test]
    async fn a_waiter_dropped_after_its_wake_up_passes_it_on() {
        use std::time::Duration;
        let reg = registry();
        let (woken, mut other) = one_of_two_woken(&reg).await;
        // The woken waiter's caller is cancelled before its attempt.
        drop(woken);
        tokio::time::timeout(Duration::from_secs(5), other.released())
            .await
            .expect("the wake-up of a cancelled waiter was swallowed");
    }

    #[tokio::test]
    async fn one_release_wakes_one_waiter() {
        use std::time::Duration;
        let reg = registry();
        let (_woken, mut other) = one_of_two_woken(&reg).await;
        let other = &mut other;
        assert!(
            tokio::time::timeout(Duration::from_millis(50), other.released())
                .await
                .is_err(),
            "one message woke two waiters"
        );
        reg.notify("c");
        tokio::time::timeout(Duration::from_secs(5), other.released())
            .await
            .expect("the second release did not wake the other waiter");
    }

    #[tokio::test]
    async fn a_grant_wakes_the_waiter_of_its_request_only() {
        use std::time::Duration;
        let reg = registry();
        let id: Arc<str> = "wake-t1".into();
        let claims = crate::claims::Claims::register(&id, Box::new(|_, _| {}));
        let ch: Arc<str> = "lock:{k}:granted:wake-t1".into();
        let (a_owner, b_owner): (Arc<str>, Arc<str>) = ("wake-t1:1".into(), "wake-t1:2".into());
        let (_a_claim, b_claim) = (claims.open(&a_owner), claims.open(&b_owner));
        let (mut a, _) = reg.join(&ch, Some(&a_owner));
        let grant = Grant {
            fence: 7,
            at: crate::claims::Stamp::ServerMs(1, tokio::time::Instant::now()),
        };
        // Heard before b registered a waiter: kept in b's request.
        reg.granted(&ch, "wake-t1:2", grant);
        let (mut b, _) = reg.join(&ch, Some(&b_owner));
        match tokio::time::timeout(Duration::from_secs(5), b.released()).await {
            Ok(Woken::Granted(g)) => assert_eq!(g, grant),
            other => panic!("the owner was not handed its grant: {other:?}"),
        }
        assert!(
            tokio::time::timeout(Duration::from_millis(50), a.released())
                .await
                .is_err(),
            "a grant woke a waiter it did not name"
        );
        drop(b_claim);
    }
}
