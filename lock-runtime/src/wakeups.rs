//! Per-channel wake-ups shared by all waiters of one client: one
//! subscription per lock however many tasks wait on it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::watch;

/// Called with a channel nobody waits on any more.
pub(crate) type OnIdle = Arc<dyn Fn(Arc<str>) + Send + Sync>;

#[derive(Default)]
pub(crate) struct Wakeups {
    slots: Mutex<HashMap<Arc<str>, Slot>>,
    on_idle: Option<OnIdle>,
}

struct Slot {
    tx: watch::Sender<u64>,
    waiters: usize,
    /// The backend confirmed it listens on this channel.
    ready: bool,
}

impl Wakeups {
    pub(crate) fn new(on_idle: Option<OnIdle>) -> Self {
        Wakeups {
            slots: Mutex::default(),
            on_idle,
        }
    }

    /// Register a waiter; says whether the channel still needs subscribing.
    pub(crate) fn join(self: &Arc<Self>, channel: &Arc<str>) -> (Waiter, bool) {
        let mut slots = self.slots.lock().unwrap();
        let slot = slots.entry(channel.clone()).or_insert_with(|| Slot {
            tx: watch::channel(0).0,
            waiters: 0,
            ready: false,
        });
        slot.waiters += 1;
        let waiter = Waiter {
            rx: slot.tx.subscribe(),
            channel: channel.clone(),
            registry: self.clone(),
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
            slot.tx.send_modify(|n| *n += 1);
        }
    }

    /// Wake everyone: messages may have been missed (reconnect).
    pub(crate) fn notify_all(&self) {
        for slot in self.slots.lock().unwrap().values() {
            slot.tx.send_modify(|n| *n += 1);
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
    rx: watch::Receiver<u64>,
    channel: Arc<str>,
    registry: Arc<Wakeups>,
}

impl Waiter {
    /// Resolves on the next release message after the previous call (or
    /// after `join`).
    pub(crate) async fn released(&mut self) {
        // The sender lives in the registry slot, which outlives its waiters.
        let _ = self.rx.changed().await;
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
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
}
