//! The waiters of one client, by channel: one subscription per lock
//! however many tasks wait on it.
//!
//! A queued waiter is handed the lock by the holder's release: the grant
//! message names its owner id and lands in that waiter's mailbox. Nobody
//! else is woken; the waiter already holds the lock. A grant that arrives
//! before its waiter registered (the release came between the waiter's
//! attempt and its registration) is kept for it a moment. A waiter that
//! gave up sends a release for its owner id itself, which takes it out of
//! the queue or passes the lock on; a grant that nobody claims within
//! [`ORPHAN_AFTER`] anyway (that release failed, or the queue kept an entry
//! of an attempt whose answer was lost) is released by its client, so the
//! lock never waits out a lease for nobody.
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

use std::time::{Duration, Instant};

/// Called with a channel nobody waits on any more.
pub(crate) type OnIdle = Arc<dyn Fn(Arc<str>) + Send + Sync>;

/// A lock handed over by a release.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Grant {
    pub(crate) fence: u64,
    /// When the release handed it over: its lease counts from there.
    pub(crate) at: Stamp,
}

/// When a hand-off happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stamp {
    /// On the Redis server's clock, in ms; and when its message arrived
    /// here (the hand-off was no later than that).
    ServerMs(u64, tokio::time::Instant),
    /// On this process's clock.
    Local(tokio::time::Instant),
}

/// Why a parked waiter woke.
#[derive(Debug)]
pub(crate) enum Woken {
    /// The lock is this waiter's.
    Granted(Grant),
    /// Try again: released (waiters that do not queue), or a message may
    /// have been missed (reconnect, failover).
    Retry,
}

/// How long a grant nobody claimed is kept for a waiter about to register
/// before it is released.
pub(crate) const ORPHAN_AFTER: Duration = Duration::from_secs(1);

/// How long an owner that got its lock by asking again is remembered, for
/// a grant message of the same hand-off that may still come.
const SETTLED_FOR: Duration = Duration::from_secs(60);

#[derive(Default)]
pub(crate) struct Wakeups {
    slots: Mutex<HashMap<Arc<str>, Slot>>,
    /// Grants that arrived before their waiter registered, by owner id.
    unclaimed: Mutex<HashMap<Arc<str>, (Grant, Instant)>>,
    /// Owners holding a lock that a grant message may still name.
    settled: Mutex<HashMap<Arc<str>, Instant>>,
    on_idle: Option<OnIdle>,
    /// Releases are no longer published where this registry listens.
    retired: AtomicBool,
}

struct Slot {
    wake: Arc<Notify>,
    waiters: usize,
    /// The backend confirmed it listens on this channel.
    ready: bool,
    /// SUBSCRIBEs sent whose confirmation has not come back: a
    /// confirmation is not a resubscription after a reconnect.
    confirming: u32,
    /// Queued waiters by owner id.
    mailboxes: HashMap<Arc<str>, Arc<Mailbox>>,
}

#[derive(Default)]
struct Mailbox {
    grant: Mutex<Option<Grant>>,
    arrived: Notify,
}

impl Wakeups {
    pub(crate) fn new(on_idle: Option<OnIdle>) -> Self {
        Wakeups {
            on_idle,
            ..Wakeups::default()
        }
    }

    /// Register a waiter (with `owner`, one that may be handed the lock);
    /// says whether the channel still needs subscribing.
    pub(crate) fn join(
        self: &Arc<Self>,
        channel: &Arc<str>,
        owner: Option<&Arc<str>>,
    ) -> (Waiter, bool) {
        let mut slots = self.slots.lock().unwrap();
        let slot = slots.entry(channel.clone()).or_insert_with(|| Slot {
            wake: Arc::new(Notify::new()),
            waiters: 0,
            ready: false,
            confirming: 0,
            mailboxes: HashMap::new(),
        });
        slot.waiters += 1;
        let mailbox = owner.map(|o| {
            let m = Arc::new(Mailbox::default());
            if let Some((g, _)) = self.unclaimed.lock().unwrap().remove(o) {
                *m.grant.lock().unwrap() = Some(g);
                m.arrived.notify_one();
            }
            slot.mailboxes.insert(o.clone(), m.clone());
            (o.clone(), m)
        });
        let waiter = Waiter {
            wake: slot.wake.clone(),
            mailbox,
            channel: channel.clone(),
            registry: self.clone(),
            woken: false,
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

    pub(crate) fn waiters(&self, channel: &str) -> usize {
        self.slots
            .lock()
            .unwrap()
            .get(channel)
            .map_or(0, |s| s.waiters)
    }

    /// All waiters of this registry whose channel starts with `prefix`.
    pub(crate) fn waiters_under(&self, prefix: &str) -> usize {
        self.slots
            .lock()
            .unwrap()
            .iter()
            .filter(|(c, _)| c.starts_with(prefix))
            .map(|(_, s)| s.waiters)
            .sum()
    }

    /// Hand `grant` to the waiter queued as `owner`; false if there is
    /// none.
    pub(crate) fn deliver(&self, channel: &str, owner: &str, grant: Grant) -> bool {
        let slots = self.slots.lock().unwrap();
        let Some(m) = slots.get(channel).and_then(|s| s.mailboxes.get(owner)) else {
            return false;
        };
        *m.grant.lock().unwrap() = Some(grant);
        m.arrived.notify_one();
        true
    }

    /// A grant message from Redis: to its waiter, else kept for it a
    /// moment, else released.
    pub(crate) fn granted(self: &Arc<Self>, channel: &str, owner: &str, grant: Grant) {
        if self.deliver(channel, owner, grant) {
            return;
        }
        if self.settled.lock().unwrap().remove(owner).is_some() {
            // Its owner asked again and holds the lock already.
            return;
        }
        let owner: Arc<str> = owner.into();
        self.unclaimed
            .lock()
            .unwrap()
            .insert(owner.clone(), (grant, Instant::now()));
        crate::client::unclaimed_grant(self.clone(), channel, owner);
    }

    /// The grant kept for `owner`, if nobody claimed it since.
    pub(crate) fn take_unclaimed(&self, owner: &str) -> bool {
        self.unclaimed.lock().unwrap().remove(owner).is_some()
    }

    /// `owner` holds its lock through an attempt of its own: a grant
    /// message for it that comes later is no orphan.
    pub(crate) fn settle(&self, owner: &Arc<str>) {
        let now = Instant::now();
        let mut settled = self.settled.lock().unwrap();
        settled.retain(|_, at| now.duration_since(*at) < SETTLED_FOR);
        settled.insert(owner.clone(), now);
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

    fn leave(&self, channel: &Arc<str>, owner: Option<&Arc<str>>) {
        let idle = {
            let mut slots = self.slots.lock().unwrap();
            match slots.get_mut(channel) {
                Some(slot) => {
                    if let Some(o) = owner {
                        slot.mailboxes.remove(o);
                    }
                    slot.waiters -= 1;
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
    /// Queued waiters: the owner id and where its grant lands.
    mailbox: Option<(Arc<str>, Arc<Mailbox>)>,
    channel: Arc<str>,
    registry: Arc<Wakeups>,
    /// Picked by a wake-up and not yet [`consumed`](Waiter::consumed).
    woken: bool,
}

impl Waiter {
    /// Resolves with a grant, or when a wake-up picks this waiter. A pick
    /// that is dropped unpolled passes to the next waiter (`Notify` does
    /// that), and so does one whose waiter is dropped before it is
    /// consumed.
    pub(crate) async fn released(&mut self) -> Woken {
        let Some((_, mailbox)) = &self.mailbox else {
            self.wake.notified().await;
            self.woken = true;
            return Woken::Retry;
        };
        let mailbox = mailbox.clone();
        loop {
            if let Some(g) = mailbox.grant.lock().unwrap().take() {
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

    /// This waiter's owner holds the lock through an attempt of its own
    /// (answered `Repeated` after a hand-off): a grant message for it that
    /// is still on its way must not be released as an orphan.
    pub(crate) fn settle(&self) {
        if let Some((owner, m)) = &self.mailbox {
            if m.grant.lock().unwrap().take().is_none() {
                self.registry.settle(owner);
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
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        if self.woken {
            // Cancelled between its wake-up and its attempt: another waiter
            // of this client may take the lock instead.
            self.registry.notify(&self.channel);
        }
        let owner = self.mailbox.as_ref().map(|(o, _)| o);
        self.registry.leave(&self.channel, owner);
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
    async fn a_grant_reaches_its_owner_only() {
        use std::time::Duration;
        let reg = registry();
        let ch: Arc<str> = "lock:{k}:granted:c1".into();
        let (a_owner, b_owner): (Arc<str>, Arc<str>) = ("c1:1".into(), "c1:2".into());
        let (mut a, _) = reg.join(&ch, Some(&a_owner));
        let (mut b, _) = reg.join(&ch, Some(&b_owner));
        let grant = Grant {
            fence: 7,
            at: Stamp::ServerMs(1, tokio::time::Instant::now()),
        };
        assert!(reg.deliver(&ch, "c1:2", grant));
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
        assert!(!reg.deliver(&ch, "c1:9", grant), "a grant found a stranger");
    }

    #[tokio::test]
    async fn a_grant_before_its_waiter_registered_is_kept_for_it() {
        use std::time::Duration;
        let reg = registry();
        let ch: Arc<str> = "lock:{k}:granted:c1".into();
        let grant = Grant {
            fence: 3,
            at: Stamp::ServerMs(1, tokio::time::Instant::now()),
        };
        reg.granted(&ch, "c1:1", grant);
        let owner: Arc<str> = "c1:1".into();
        let (mut w, _) = reg.join(&ch, Some(&owner));
        match tokio::time::timeout(Duration::from_secs(5), w.released()).await {
            Ok(Woken::Granted(g)) => assert_eq!(g, grant),
            other => panic!("the early grant was lost: {other:?}"),
        }
        assert!(reg.unclaimed.lock().unwrap().is_empty());
    }
}
