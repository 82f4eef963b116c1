//! Looking at locks and clearing them: what an operator needs when a
//! lock is stuck (and what `lockctl` runs).

use std::collections::BTreeSet;

use crate::backend::Seen;
use crate::key::{is_reader, LockName, Mode};
use crate::{glob, LockClient, LockError, LockInfo, LockMode};

/// Locks read at once while listing.
const LIST_BATCH: usize = 64;

impl LockClient {
    /// Who holds `key`, for how much longer, and how many wait behind
    /// them; `None` if nobody holds it or waits for it. Changes nothing.
    ///
    /// On Redlock this is what a majority of the nodes says; on a Cluster
    /// the key's slot; behind Sentinel the primary.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), lock_runtime::LockError> {
    /// let client = lock_runtime::LockClient::memory();
    /// assert_eq!(client.inspect("order:42").await?, None);
    /// let guard = client.lock("order:42").await?;
    /// let info = client.inspect("order:42").await?.expect("held");
    /// assert_eq!(info.holders, [guard.holder()]);
    /// assert!(info.ttl.is_some() && info.waiters == 0);
    /// # Ok(()) }
    /// ```
    pub async fn inspect(&self, key: impl Into<String>) -> Result<Option<LockInfo>, LockError> {
        let name = LockName::new(&self.inner.config.prefix, &key.into())?;
        let seen = self
            .inner
            .io
            .here(self.inner.backend.inspect(&name))
            .await?;
        Ok(info(&name, seen))
    }

    /// Clear `key` for a holder that is stuck: its hold ends as if its
    /// lease had run out, and the next waiter in the queue gets the lock at
    /// once, with a fresh token (the hand-off a release does), instead of
    /// waiting out the lease. `true` if a hold was removed. Logged at WARN
    /// with each holder id removed. A read-held key loses all its readers.
    ///
    /// The old holder learns at its next renewal that Redis answers (at
    /// most a third of its lease later; if its renewals go unanswered, at
    /// its deadline): its body is stopped or warned as its `on_lost` says,
    /// and its own release answers [`LockError::Lost`] without touching the
    /// new holder. Until then it may still be running: fencing tokens are
    /// what keep its late writes out of the store.
    ///
    /// Each hold is ended by its holder id, so a holder that changed since
    /// the key was read, or a call sent again after a lost reply, leaves the
    /// new holder alone. On Redlock the holders are cleared on every node.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), lock_runtime::LockError> {
    /// use lock_runtime::{LockClient, LockError};
    ///
    /// let client = LockClient::memory();
    /// let stuck = client.lock("order:42").await?;
    /// assert!(client.force_release("order:42").await?);
    /// assert!(!client.force_release("order:42").await?); // nothing held now
    /// assert!(matches!(stuck.release().await, Err(LockError::Lost { .. })));
    /// # Ok(()) }
    /// ```
    pub async fn force_release(&self, key: impl Into<String>) -> Result<bool, LockError> {
        let name = LockName::new(&self.inner.config.prefix, &key.into())?;
        let removed = self
            .inner
            .io
            .here(self.inner.backend.force_release(&name))
            .await?;
        for holder in &removed {
            tracing::warn!(
                key = %name.key,
                holder = %holder,
                "lock force-released: the next waiter is served; the holder finds out at its next renewal"
            );
        }
        Ok(!removed.is_empty())
    }

    /// Clear `holder`'s hold of `key`, and only if it still holds it: the
    /// compare-and-clear an operator wants after looking with
    /// [`inspect`](Self::inspect) (`holder` is one of its `holders`). A
    /// healthy holder that took the lock over in between is left alone,
    /// where [`force_release`](Self::force_release) would clear it too.
    /// `true` if the hold was removed; otherwise as `force_release` does
    /// it: the next waiter is served at once, and a read-held key keeps its
    /// other readers.
    ///
    /// The old holder learns at its next renewal that is answered (a third
    /// of its lease later at most); if Redis does not answer its renewals,
    /// at its deadline, as for any hold it cannot renew.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), lock_runtime::LockError> {
    /// let client = lock_runtime::LockClient::memory();
    /// let first = client.lock("order:42").await?;
    /// let seen = client.inspect("order:42").await?.expect("held").holders[0].clone();
    /// first.release().await?;
    /// let next = client.lock("order:42").await?; // took over meanwhile
    /// assert!(!client.force_release_if("order:42", &seen).await?);
    /// assert!(client.force_release_if("order:42", next.holder()).await?);
    /// # Ok(()) }
    /// ```
    pub async fn force_release_if(
        &self,
        key: impl Into<String>,
        holder: &str,
    ) -> Result<bool, LockError> {
        let name = LockName::new(&self.inner.config.prefix, &key.into())?;
        let removed = self
            .inner
            .io
            .here(self.inner.backend.force_release_if(&name, holder))
            .await?;
        if removed {
            tracing::warn!(
                key = %name.key,
                holder = %holder,
                "lock force-released: the next waiter is served; the holder finds out at its next renewal"
            );
        }
        Ok(removed)
    }

    /// Every lock held or awaited whose key matches `pattern`, a Redis glob
    /// (`*`, `?`, `[a-z]`, `\` to escape), sorted by key. Keys are found
    /// with `SCAN` (never `KEYS`), on every primary of a Cluster and every
    /// node of Redlock, then read one by one as [`inspect`](Self::inspect)
    /// does: a lock that changed meanwhile shows as it was when read. A
    /// key whose only trace is its fence counter is not listed.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), lock_runtime::LockError> {
    /// let client = lock_runtime::LockClient::memory();
    /// let _a = client.lock("order:1").await?;
    /// let _b = client.lock("order:2").await?;
    /// let _c = client.lock("user:1").await?;
    /// let keys: Vec<String> = client.locks("order:*").await?.into_iter().map(|l| l.key).collect();
    /// assert_eq!(keys, ["order:1", "order:2"]);
    /// # Ok(()) }
    /// ```
    pub async fn locks(&self, pattern: &str) -> Result<Vec<LockInfo>, LockError> {
        let prefix = &self.inner.config.prefix;
        let pattern = if pattern.is_empty() { "*" } else { pattern };
        // Every name of a key matching `pattern` matches this (and a few
        // names of other keys that hold `}`: the check below drops them).
        let names = format!("{}{{{pattern}}}*", glob::escape(prefix));
        let found = self.inner.io.here(self.inner.backend.scan(&names)).await?;
        let keys: BTreeSet<String> = found
            .iter()
            .filter_map(|n| LockName::key_of(prefix, n))
            .filter(|k| glob::matches(pattern, k))
            .collect();
        let keys: Vec<String> = keys.into_iter().collect();
        let mut out = Vec::new();
        for batch in keys.chunks(LIST_BATCH) {
            let read = futures_util::future::join_all(batch.iter().map(|k| self.inspect(k))).await;
            for info in read {
                out.extend(info?);
            }
        }
        Ok(out)
    }
}

/// A lock as an operator sees it; `None` if nobody holds it or waits.
fn info(name: &LockName, seen: Seen) -> Option<LockInfo> {
    if seen.holders.is_empty() && seen.waiters == 0 {
        return None;
    }
    let permits = seen
        .holders
        .iter()
        .filter_map(|h| Mode::of(h).permits())
        .max();
    let mode = if let Some(permits) = permits {
        LockMode::Semaphore { permits }
    } else if seen.holders.first().is_some_and(|h| is_reader(h)) {
        LockMode::Read
    } else {
        LockMode::Write
    };
    Some(LockInfo {
        key: name.key.to_string(),
        mode,
        ttl: seen.ttl.filter(|_| !seen.holders.is_empty()),
        holders: seen.holders,
        waiters: seen.waiters,
        fence: seen.fence,
    })
}
