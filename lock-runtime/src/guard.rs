use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::backend::Released;
use crate::key::LockName;
use crate::scope::Scope;
use crate::watchdog::Held;
use crate::{LockClient, LockError};

static NEXT_GUARD: AtomicU64 = AtomicU64::new(1);

/// A held lock. The watchdog keeps it alive until it is released.
///
/// [`release`](LockGuard::release) it to learn whether it was held to the
/// end; dropping it releases in the background.
#[must_use = "dropping the guard releases the lock at once"]
pub struct LockGuard {
    client: LockClient,
    name: LockName,
    owner: Arc<str>,
    fence: u64,
    held: Held,
    scope: Option<(Arc<Scope>, u64)>,
    done: bool,
}

impl LockGuard {
    pub(crate) fn new(
        client: LockClient,
        name: LockName,
        owner: Arc<str>,
        fence: u64,
        held: Held,
        scope: Option<Arc<Scope>>,
    ) -> Self {
        let scope = scope.map(|s| {
            let id = NEXT_GUARD.fetch_add(1, Ordering::Relaxed);
            s.push(id, name.hash.clone(), fence);
            (s, id)
        });
        LockGuard {
            client,
            name,
            owner,
            fence,
            held,
            scope,
            done: false,
        }
    }

    /// The fencing token: strictly increasing per key across all clients.
    /// Send it with every write to the protected resource and have the
    /// resource reject tokens lower than the highest it has seen.
    pub fn fence(&self) -> u64 {
        self.fence
    }

    /// The key as the user gave it.
    pub fn key(&self) -> &str {
        &self.name.key
    }

    /// The holder id written into the lock hash.
    pub fn holder(&self) -> &str {
        &self.owner
    }

    /// Whether the watchdog found the lock lost.
    pub fn is_lost(&self) -> bool {
        self.held.is_lost()
    }

    /// Resolves when the lock is lost (never, if it is released first).
    /// Race work against it to stop as soon as exclusivity is gone.
    pub fn lost(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        self.held.lost()
    }

    /// Release and report whether the lock was still ours:
    /// `Err(Lost)` if it expired or was deleted while held.
    pub async fn release(mut self) -> Result<(), LockError> {
        self.done = true;
        let was_lost = self.leave();
        let backend = self.client.inner.backend.clone();
        let (name, owner) = (self.name.clone(), self.owner.clone());
        let out = self
            .client
            .inner
            .io
            .run(async move { backend.release(&name, &owner).await })
            .await;
        match out {
            Ok(Released::NotOwner) => Err(self.lost_error()),
            Ok(_) if was_lost => Err(self.lost_error()),
            Ok(r) => {
                tracing::debug!(key = %self.name.key, freed = (r == Released::Freed), "lock released");
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    fn lost_error(&self) -> LockError {
        LockError::Lost {
            key: self.name.key.to_string(),
        }
    }

    /// Stop renewing (the last hold) and leave the scope; says whether the
    /// watchdog had found the lock lost.
    fn leave(&mut self) -> bool {
        if let Some((scope, id)) = self.scope.take() {
            scope.pop(id);
        }
        self.client.inner.watchdog.leave(&self.held).was_lost
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        self.leave();
        let backend = self.client.inner.backend.clone();
        let (name, owner) = (self.name.clone(), self.owner.clone());
        // Keep the client alive until the release is through.
        let client = self.client.clone();
        self.client.inner.io.spawn(async move {
            match backend.release(&name, &owner).await {
                Ok(Released::NotOwner) => tracing::debug!(key = %name.key, "lock dropped after it was lost"),
                Ok(_) => tracing::debug!(key = %name.key, "lock released in the background"),
                Err(e) => tracing::warn!(key = %name.key, error = %e, "background release failed; the lock expires with its lease"),
            }
            drop(client);
        });
    }
}

impl std::fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockGuard")
            .field("key", &self.name.key)
            .field("fence", &self.fence)
            .field("holder", &self.owner)
            .finish()
    }
}
