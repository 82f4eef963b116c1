//! Redlock release wake-ups from whichever of several nodes answers.
//!
//! A Redlock release reaches every node (and publishes on each, also where
//! the lock is absent), so one subscription per lock, on any live node,
//! hears it. Redlock waiters do not queue: each node would serve its own
//! queue's head, and no majority would agree on who is next. A node that dies while
//! listened to wakes its waiters (they retry), and the waiters' fallback
//! retry covers any message lost on the way.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::runtime::Handle;

use super::node::NodeSettings;
use super::pubsub::Subscriber;
use super::BoxFuture;
use crate::key::LockName;
use crate::wakeups::Waiter;
use crate::LockError;

pub(crate) struct AnySubscriber {
    subs: Arc<[(String, Subscriber)]>,
    /// Where the last subscription succeeded: tried first next time.
    preferred: Arc<AtomicUsize>,
    /// Longest one node may take to confirm a subscription.
    timeout: Duration,
}

impl AnySubscriber {
    pub(crate) fn new(
        urls: &[String],
        settings: NodeSettings,
        io: Handle,
        timeout: Duration,
    ) -> Result<Self, LockError> {
        let subs = urls
            .iter()
            .map(|u| Ok((u.clone(), Subscriber::new(u, settings.clone(), io.clone())?)))
            .collect::<Result<Vec<_>, LockError>>()?;
        Ok(AnySubscriber {
            subs: subs.into(),
            preferred: Arc::new(AtomicUsize::new(0)),
            timeout,
        })
    }

    pub(crate) fn waiting(&self, name: &LockName) -> usize {
        self.subs.iter().map(|(_, s)| s.waiting(name)).sum()
    }

    /// Subscribe on the first node that confirms, starting with the one
    /// that worked last time.
    pub(crate) fn subscribe(
        &self,
        name: &LockName,
    ) -> BoxFuture<Result<(Waiter, bool), LockError>> {
        let (subs, preferred, timeout) = (self.subs.clone(), self.preferred.clone(), self.timeout);
        let name = name.clone();
        Box::pin(async move {
            let start = preferred.load(Ordering::Relaxed);
            let mut failures = Vec::new();
            for i in (0..subs.len()).map(|k| (start + k) % subs.len()) {
                let (url, sub) = &subs[i];
                match tokio::time::timeout(timeout, sub.subscribe(&name, None)).await {
                    Ok(Ok(waiter)) => {
                        preferred.store(i, Ordering::Relaxed);
                        return Ok(waiter);
                    }
                    Ok(Err(e)) => failures.push(format!("{url}: {e}")),
                    Err(_) => failures.push(format!("{url}: no answer within {timeout:?}")),
                }
            }
            Err(LockError::other(format!(
                "subscribing to lock releases failed on every node: {}",
                failures.join("; ")
            )))
        })
    }
}
