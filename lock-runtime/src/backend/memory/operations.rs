//! What an operator does to locks in this process: read one, clear one by
//! its holders' own releases, list them.

use std::sync::Arc;

use tokio::time::Instant;

use super::{Lock, MemoryBackend};
use crate::backend::fault::Fault;
use crate::backend::{Released, Seen};
use crate::glob;
use crate::key::LockName;

impl MemoryBackend {
    pub(crate) async fn inspect(&self, name: &LockName) -> Result<Seen, Fault> {
        let now = Instant::now();
        let mut state = self.shared.state.lock().unwrap();
        let (holders, ttl, fence) = match state.live(&name.hash, now) {
            Some(Lock::Written {
                owner,
                expires,
                fence,
            }) => (vec![owner.to_string()], Some(*expires - now), Some(*fence)),
            Some(Lock::Read { readers, fence }) => {
                // Longest lease last, as Redis lists them.
                let mut readers: Vec<_> = readers.iter().map(|(o, ends)| (*ends, o)).collect();
                readers.sort();
                let ttl = readers.last().map(|(ends, _)| *ends - now);
                let holders = readers.into_iter().map(|(_, o)| o.to_string()).collect();
                (holders, ttl, Some(*fence))
            }
            Some(Lock::Permits(permits)) => {
                // Longest lease last; the highest token is the hold's.
                let mut held: Vec<_> = permits.iter().map(|(o, p)| (p.ends, o, p.fence)).collect();
                held.sort();
                let ttl = held.last().map(|(ends, _, _)| *ends - now);
                let fence = held.iter().map(|(_, _, f)| *f).max().filter(|f| *f > 0);
                let holders = held.into_iter().map(|(_, o, _)| o.to_string()).collect();
                (holders, ttl, fence)
            }
            // (Tokens come from one counter for the whole backend: a free
            // key keeps none of its own.)
            None => (Vec::new(), None, None),
        };
        let waiters = state
            .queues
            .get(&name.hash)
            .map_or(0, |q| q.iter().filter(|w| w.until > now).count());
        Ok(Seen {
            holders,
            ttl,
            waiters,
            fence,
        })
    }

    /// Each holder's own release: this backend keeps no record of who
    /// handed a lock over, so a forced release is just that.
    pub(crate) async fn force_release(&self, name: &LockName) -> Result<Vec<String>, Fault> {
        let mut removed = Vec::new();
        for holder in self.inspect(name).await?.holders {
            let owner: Arc<str> = holder.as_str().into();
            if self.shared.release_now(name, &owner) == Released::Freed {
                removed.push(holder);
            }
        }
        Ok(removed)
    }

    /// `holder`'s own release, if it still holds.
    pub(crate) async fn force_release_if(
        &self,
        name: &LockName,
        holder: &str,
    ) -> Result<bool, Fault> {
        if !self.inspect(name).await?.holds(holder) {
            return Ok(false);
        }
        let owner: Arc<str> = holder.into();
        Ok(self.shared.release_now(name, &owner) == Released::Freed)
    }

    /// The names of held or awaited locks that match `pattern`.
    pub(crate) async fn scan(&self, pattern: &str) -> Result<Vec<String>, Fault> {
        let state = self.shared.state.lock().unwrap();
        Ok(state
            .locks
            .keys()
            .chain(state.queues.keys())
            .filter(|n| glob::matches(pattern, n))
            .map(|n| n.to_string())
            .collect())
    }
}
