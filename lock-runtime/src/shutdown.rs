//! Whether a client was closed ([`LockClient::close`](crate::LockClient::close)):
//! a flag its requests check, a signal the ones under way wait on, and a
//! count of the releases still running in the background, which a close
//! waits for before the process may exit.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::sync::Notify;

#[derive(Default)]
pub(crate) struct Shutdown {
    closed: AtomicBool,
    notify: Notify,
    /// Background releases (and undos) not yet through.
    background: AtomicUsize,
    background_done: Notify,
}

impl Shutdown {
    /// From now on the client takes no new lock; requests under way end.
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        self.notify.notify_waiters();
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    /// Resolves once the client is closed.
    pub(crate) async fn closed(&self) {
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            // Registered before the flag is read: a close in between
            // still wakes this future.
            notified.as_mut().enable();
            if self.is_closed() {
                return;
            }
            notified.await;
        }
    }

    /// Count a background release until the returned token is dropped.
    pub(crate) fn background(self: &Arc<Self>) -> Background {
        self.background.fetch_add(1, Ordering::SeqCst);
        Background(self.clone())
    }

    /// Resolves once no background release is running.
    pub(crate) async fn background_idle(&self) {
        loop {
            let notified = self.background_done.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.background.load(Ordering::SeqCst) == 0 {
                return;
            }
            notified.await;
        }
    }
}

/// A background release under way (see [`Shutdown::background`]).
pub(crate) struct Background(Arc<Shutdown>);

impl Drop for Background {
    fn drop(&mut self) {
        if self.0.background.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.background_done.notify_waiters();
        }
    }
}
