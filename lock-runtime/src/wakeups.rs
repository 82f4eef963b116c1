//! Per-channel wake-ups shared by all waiters of one client: one
//! subscription per lock however many tasks wait on it.
//!
//! A release message wakes one waiter of the client, not all of them: only
//! one can take the lock, and waking the rest would send Redis a burst of
//! attempts that are bound to fail. A woken waiter that takes the lock wakes
//! the next one when it releases; one that loses to another client waits for
//! the next message. A wake-up that lands while nobody is parked is kept for
//! the next waiter to park, so a release during an attempt is not lost; one
//! whose waiter goes away before its attempt finished is passed on.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

/// Called with a channel nobody waits on any more.
pub(crate) type OnIdle = Arc<dyn Fn(Arc<str>) + Send + Sync>;

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
    /// The backend confirmed it listens on this channel.
    ready: bool,
}

impl Wakeups {
    pub(crate) fn new(on_idle: Option<OnIdle>) -> Self {
        Wakeups {
            slots: Mutex::default(),
            on_idle,
            retired: AtomicBool::new(false),
        }
    }

    /// Register a waiter; says whether the channel still needs subscribing.
    pub(crate) fn join(self: &Arc<Self>, channel: &Arc<str>) -> (Waiter, bool) {
        let mut slots = self.slots.lock().unwrap();
        let slot = slots.entry(channel.clone()).or_insert_with(|| Slot {
            wake: Arc::new(Notify::new()),
            waiters: 0,
            ready: false,
        });
        slot.waiters += 1;
        let waiter = Waiter {
            wake: slot.wake.clone(),
            channel: channel.clone(),
            registry: self.clone(),
            woken: false,
        };
        (waiter, !slot.ready)
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

    pub(crate) fn notify(&self, channel: &str) {
        if let Some(slot) = self.slots.lock().unwrap().get(channel) {
            slot.wake.notify_one();
        }
    }

    /// The channel was subscribed again after a reconnect: wake one waiter
    /// if it was already listened on (not for a first subscription, whose
    /// waiter tries again anyway).
    pub(crate) fn resubscribed(&self, channel: &str) {
        if let Some(slot) = self.slots.lock().unwrap().get(channel) {
            if slot.ready {
                slot.wake.notify_one();
            }
        }
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

    fn leave(&self, channel: &Arc<str>) {
        let idle = {
            let mut slots = self.slots.lock().unwrap();
            match slots.get_mut(channel) {
                Some(slot) => {
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

/// One task waiting for a lock's release.
pub(crate) struct Waiter {
    wake: Arc<Notify>,
    channel: Arc<str>,
    registry: Arc<Wakeups>,
    /// Picked by a release and not yet [`consumed`](Waiter::consumed).
    woken: bool,
}

impl Waiter {
    /// Resolves when a release message picks this waiter. A pick that is
    /// dropped unpolled passes to the next waiter (`Notify` does that), and
    /// so does one whose waiter is dropped before it is consumed.
    pub(crate) async fn released(&mut self) {
        self.wake.notified().await;
        self.woken = true;
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
        self.registry.leave(&self.channel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_release_after_join_is_seen() {
        let reg = Arc::new(Wakeups::new(None));
        let ch: Arc<str> = "c".into();
        let (mut w, needs_sub) = reg.join(&ch);
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
        let (mut a, _) = reg.join(&ch);
        let (mut b, _) = reg.join(&ch);
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
        let reg = Arc::new(Wakeups::new(None));
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
        let reg = Arc::new(Wakeups::new(None));
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
}
