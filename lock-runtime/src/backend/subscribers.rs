//! Release wake-ups from whichever of several nodes answers.
//!
//! A release reaches every node that may hold the lock (Redlock releases on
//! all of them; a Redis Cluster broadcasts PUBLISH to every node), so one
//! subscription per lock, on any live node, hears it. A node that dies while
//! listened to wakes its waiters (they retry), and the waiters' fallback
//! retry covers any message lost on the way.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::runtime::Handle;

use super::redis::{NodeSettings, Subscriber};
use super::BoxFuture;
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

    pub(crate) fn waiting(&self, channel: &str) -> usize {
        self.subs.iter().map(|(_, s)| s.waiting(channel)).sum()
    }

    /// Subscribe on the first node that confirms, starting with the one
    /// that worked last time.
    pub(crate) fn subscribe(&self, channel: &Arc<str>) -> BoxFuture<Result<Waiter, LockError>> {
        let (subs, preferred, timeout) = (self.subs.clone(), self.preferred.clone(), self.timeout);
        let channel = channel.clone();
        Box::pin(async move {
            let start = preferred.load(Ordering::Relaxed);
            let mut failures = Vec::new();
            for i in (0..subs.len()).map(|k| (start + k) % subs.len()) {
                let (url, sub) = &subs[i];
                match tokio::time::timeout(timeout, sub.subscribe(&channel)).await {
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
