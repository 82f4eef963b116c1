//! What this client ended on a primary (releases, undos, keeps), kept for
//! as long as a replica's copy of what they ended could still matter.
//!
//! Replication is asynchronous, and the client follows a promotion only
//! once a sentinel names the new primary: a planned failover leaves the
//! old primary answering as a primary for seconds after the replica was
//! promoted. What the client ended there in between never reaches the new
//! primary, which still has those holds and queue entries as they were
//! at the promotion. With nobody left to release them, a hold would block
//! its key for the rest of its lease, and a queue entry of a request long
//! over could be handed the lock for a whole new one.
//!
//! So each primary keeps what was ended on it for the longest lease or
//! queue stay this client has asked for (a copy lapses by then), and when
//! the client follows a failover, all of it is sent again to the new
//! primary. Every script is idempotent for one owner id and owner ids are
//! never reused: a second release finds nothing of a live holder's.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use crate::key::LockName;

/// At most this many entries per primary: past it the oldest go (their
/// copies, if any, lapse by their lease).
const MAX_ENTRIES: usize = 1 << 17;

/// How an owner's hold or queue entry was ended.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Ended {
    /// Released, or taken back (undo).
    Released,
    /// Released with `min_hold` left: taken until then.
    Kept { until: Instant },
}

#[derive(Debug, Clone)]
pub(crate) struct Entry {
    pub(crate) name: LockName,
    pub(crate) owner: std::sync::Arc<str>,
    pub(crate) how: Ended,
    at: Instant,
}

#[derive(Default)]
struct Inner {
    /// The client left this primary: what is ended now must go to the
    /// new one.
    left: bool,
    entries: VecDeque<Entry>,
}

/// One primary's journal.
#[derive(Default)]
pub(crate) struct Journal(Mutex<Inner>);

impl Journal {
    /// Note that `owner`'s hold or queue entry of `name` was ended here;
    /// entries older than `keep_for` go. `false`: the client has left
    /// this primary (its journal was replayed already), so the caller
    /// must end it on the current one too.
    pub(crate) fn note(
        &self,
        name: &LockName,
        owner: &std::sync::Arc<str>,
        how: Ended,
        keep_for: Duration,
    ) -> bool {
        let now = Instant::now();
        let mut inner = self.0.lock().unwrap();
        if inner.left {
            return false;
        }
        while inner.entries.front().is_some_and(|e| e.at + keep_for < now)
            || inner.entries.len() >= MAX_ENTRIES
        {
            inner.entries.pop_front();
        }
        inner.entries.push_back(Entry {
            name: name.clone(),
            owner: owner.clone(),
            how,
            at: now,
        });
        true
    }

    /// The client leaves this primary: what was ended here within
    /// `keep_for`, to be sent again to the next.
    pub(crate) fn leave(&self, keep_for: Duration) -> Vec<Entry> {
        let now = Instant::now();
        let mut inner = self.0.lock().unwrap();
        inner.left = true;
        std::mem::take(&mut inner.entries)
            .into_iter()
            .filter(|e| e.at + keep_for >= now)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn entries_last_as_long_as_a_copy_could_and_a_left_primary_takes_none() {
        let j = Journal::default();
        let name = LockName::new("", "k").unwrap();
        let keep_for = Duration::from_secs(30);
        assert!(j.note(&name, &"a:1".into(), Ended::Released, keep_for));
        tokio::time::advance(Duration::from_secs(20)).await;
        assert!(j.note(&name, &"a:2".into(), Ended::Released, keep_for));
        tokio::time::advance(Duration::from_secs(15)).await;
        let left = j.leave(keep_for);
        assert_eq!(left.len(), 1);
        assert_eq!(&*left[0].owner, "a:2");
        assert!(!j.note(&name, &"a:3".into(), Ended::Released, keep_for));
        assert!(j.leave(keep_for).is_empty());
    }
}
