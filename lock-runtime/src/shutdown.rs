//! Whether a client was closed ([`LockClient::close`](crate::LockClient::close)):
//! a flag its requests check, a signal the ones under way wait on, a count
//! of the releases still on their way to Redis (a guard's own, and those in
//! the background), which a close waits for before the process may exit,
//! and the close itself, which runs once however many callers ask for it.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::sync::Notify;

#[derive(Default)]
pub(crate) struct Shutdown {
    closed: AtomicBool,
    notify: Notify,
    /// Releases (and undos) not yet through.
    releasing: AtomicUsize,
    releases_done: Notify,
    /// The close has been started (by the first caller).
    closing: AtomicBool,
    /// The close is through: every caller may return.
    finished: AtomicBool,
    finish: Notify,
}

/// Resolves once `flag` is set; `notify` is told when it is.
async fn until(flag: &AtomicBool, notify: &Notify) {
    loop {
        let notified = notify.notified();
        tokio::pin!(notified);
        // Registered before the flag is read: a change in between still
        // wakes this future.
        notified.as_mut().enable();
        if flag.load(Ordering::SeqCst) {
            return;
        }
        notified.await;
    }
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
        until(&self.closed, &self.notify).await;
    }

    /// Count a release until the returned token is dropped. A guard takes
    /// it before its hold leaves the watchdog, so that a close never sees
    /// the watchdog idle while the release is still to be sent.
    pub(crate) fn releasing(self: &Arc<Self>) -> Releasing {
        self.releasing.fetch_add(1, Ordering::SeqCst);
        Releasing(self.clone())
    }

    /// Resolves once no release is under way.
    pub(crate) async fn releases_done(&self) {
        loop {
            let notified = self.releases_done.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.releasing.load(Ordering::SeqCst) == 0 {
                return;
            }
            notified.await;
        }
    }

    /// Whether this caller is the first to close: it runs the close, and
    /// drops the returned token when the close is through (or dropped).
    pub(crate) fn start_close(self: &Arc<Self>) -> Option<Closing> {
        (!self.closing.swap(true, Ordering::SeqCst)).then(|| Closing(self.clone()))
    }

    /// Resolves once the close that [`start_close`](Self::start_close)
    /// started is through.
    pub(crate) async fn close_finished(&self) {
        until(&self.finished, &self.finish).await;
    }
}

/// A release under way (see [`Shutdown::releasing`]).
pub(crate) struct Releasing(Arc<Shutdown>);

impl Drop for Releasing {
    fn drop(&mut self) {
        if self.0.releasing.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.releases_done.notify_waiters();
        }
    }
}

/// The one close of a client, running (see [`Shutdown::start_close`]).
pub(crate) struct Closing(Arc<Shutdown>);

impl Drop for Closing {
    fn drop(&mut self) {
        self.0.finished.store(true, Ordering::SeqCst);
        self.0.finish.notify_waiters();
    }
}
