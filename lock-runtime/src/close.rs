//! Shutting a client down: what a service calls as it stops, so that the
//! locks it holds go to the next instance at once instead of after a lease.

use std::time::Duration;

use crate::LockClient;

impl LockClient {
    /// Close the client, for a graceful shutdown: call it after the
    /// server stopped taking requests, before the process exits.
    ///
    /// From the call on, new acquisitions (also requests still waiting)
    /// end with [`LockError::Closed`](crate::LockError::Closed); a body
    /// that already holds a lock may still re-enter it. Bodies holding
    /// locks get up to `grace` to finish and release as usual. Then every
    /// hold the client still has is released at once (the next waiter of
    /// each, in any process, is served within a round trip) and the
    /// watchdog stops. A body still running then has lost its lock: it is
    /// told so as by any loss (`on_lost = "abort"` stops it with
    /// [`LockError::Lost`](crate::LockError::Lost); `"continue"` lets it
    /// run on without the lock), and its guard's `release()` says `Lost`.
    /// A body's own release counts as part of its grace: the close returns
    /// once it has reached Redis. Releases still under way after the grace
    /// (also in the background, from dropped guards) are waited for too, at
    /// most one operation timeout more.
    ///
    /// Clones share the closed state. The close runs once, in the
    /// background: a second call, concurrent or later, and a call made
    /// after an earlier one was cancelled, all return when that one close
    /// is through (with the first call's grace). A hold
    /// cut this way is released even if it has a `min_hold` left: its
    /// work did not finish, and another instance may redo it.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), lock_runtime::LockError> {
    /// use lock_runtime::{LockClient, LockError};
    /// use std::time::Duration;
    ///
    /// let client = LockClient::memory();
    /// let held = client.lock("order:42").await?;
    /// client.close(Duration::ZERO).await; // no grace: released now
    /// assert!(matches!(held.release().await, Err(LockError::Lost { .. })));
    /// assert!(matches!(client.lock("order:43").await, Err(LockError::Closed)));
    /// # Ok(()) }
    /// ```
    pub async fn close(&self, grace: Duration) {
        let shutdown = &self.inner.shutdown;
        shutdown.close();
        // Run once, as a task of the client's own: a second call, or one
        // made while the first is cancelled, waits for the same releases.
        if let Some(closing) = shutdown.start_close() {
            let client = self.clone();
            self.inner.io.spawn(async move {
                client.close_once(grace).await;
                drop(closing);
            });
        }
        shutdown.close_finished().await;
    }

    async fn close_once(&self, grace: Duration) {
        let inner = &self.inner;
        // Bodies finish and their guards' releases land (a guard counts its
        // release before its hold leaves the watchdog).
        let finished = async {
            inner.watchdog.idle().await;
            inner.shutdown.releases_done().await;
        };
        tokio::select! {
            () = finished => {}
            () = self.sleep(grace) => {}
        }
        let left = inner.watchdog.close();
        if !left.is_empty() {
            tracing::warn!(
                locks = left.len(),
                grace_ms = grace.as_millis() as u64,
                "closing the lock client: locks still held after the grace period are released; their bodies are told the lock is lost"
            );
        }
        let backend = &inner.backend;
        let releases = left.iter().map(|(r, until)| {
            inner
                .io
                .here(backend.release(&r.name, &r.owner, Some(*until)))
        });
        let outcomes = futures_util::future::join_all(releases).await;
        for ((r, _), out) in left.iter().zip(outcomes) {
            if let Err(e) = out {
                tracing::warn!(key = %r.name.key, error = %e, "closing the lock client: a release failed; the lock expires with its lease");
            }
        }
        tokio::select! {
            () = inner.shutdown.releases_done() => {}
            () = self.sleep(inner.config.op_timeout) => {}
        }
    }

    /// Whether [`close`](Self::close) was called on this client or a clone.
    pub fn is_closed(&self) -> bool {
        self.inner.shutdown.is_closed()
    }
}
