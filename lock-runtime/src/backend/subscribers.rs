//! Redlock release wake-ups from whichever of several nodes answers.
//!
//! A Redlock release reaches every node (and publishes on each, also where
//! the lock is absent), so one subscription per lock, on any live node,
//! hears it. Redlock waiters do not queue: each node would serve its own
//! queue's head, and no majority would agree on who is next. A node that dies while
//! listened to wakes its waiters (they retry), and the waiters' fallback
//! retry covers any message lost on the way.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::runtime::Handle;

use super::endpoint;
use super::fault::Fault;
use super::node::NodeSettings;
use super::pubsub::Subscriber;
use crate::key::LockName;
use crate::wakeups::Waiter;

pub(crate) struct AnySubscriber {
    subs: Vec<(String, Subscriber)>,
    /// Where the last subscription succeeded: tried first next time.
    preferred: AtomicUsize,
    /// Longest one node may take to confirm a subscription.
    timeout: Duration,
}

impl AnySubscriber {
    pub(crate) fn new(
        urls: &[String],
        settings: NodeSettings,
        io: Handle,
        timeout: Duration,
    ) -> Result<Self, Fault> {
        let subs = urls
            .iter()
            .map(|u| {
                Ok((
                    endpoint::redact(u),
                    Subscriber::new(u, settings.clone(), io.clone())?,
                ))
            })
            .collect::<Result<Vec<_>, Fault>>()?;
        Ok(AnySubscriber {
            subs,
            preferred: AtomicUsize::new(0),
            timeout,
        })
    }

    pub(crate) fn waiting(&self, name: &LockName) -> usize {
        self.subs.iter().map(|(_, s)| s.waiting(name)).sum()
    }

    /// Subscribe on the first node that confirms, starting with the one
    /// that worked last time.
    pub(crate) async fn subscribe(&self, name: &LockName) -> Result<(Waiter, bool), Fault> {
        let (subs, timeout) = (&self.subs, self.timeout);
        let start = self.preferred.load(Ordering::Relaxed);
        let mut failures = Vec::new();
        for i in (0..subs.len()).map(|k| (start + k) % subs.len()) {
            let (url, sub) = &subs[i];
            match tokio::time::timeout(timeout, sub.subscribe(name, None)).await {
                Ok(Ok(waiter)) => {
                    self.preferred.store(i, Ordering::Relaxed);
                    return Ok(waiter);
                }
                Ok(Err(e)) => failures.push(format!("{url}: {e}")),
                Err(_) => failures.push(format!("{url}: no answer within {timeout:?}")),
            }
        }
        Err(Fault::other(format!(
            "subscribing to lock releases failed on every node: {}",
            failures.join("; ")
        )))
    }
}
