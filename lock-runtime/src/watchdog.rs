//! One task per client keeps every held lock alive.
//!
//! Each lock wants renewing every lease/3. When the earliest one is due, the
//! watchdog renews every lock that would fall due before the next tick, in
//! one batch (one pipelined round trip per Redis node), so a client holding
//! many locks sends one request per tick, not one per lock.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::backend::{Backend, Renewal, Renewed};
use crate::io::Io;

/// Identifies one lock held by one owner.
type EntryKey = (Arc<str>, Arc<str>);

type Entries = HashMap<EntryKey, Entry>;

pub(crate) struct Watchdog {
    shared: Arc<Shared>,
}

struct Shared {
    entries: Mutex<Entries>,
    /// When the task will next look at the entries (None: not scheduled).
    /// Written under the `entries` lock, so a new lock that falls due later
    /// than this needs no wake-up: with many locks held, taking one more
    /// costs no scan of the others.
    scheduled: Mutex<Option<Instant>>,
    wake: Notify,
    next_id: AtomicU64,
    started: std::sync::Once,
    /// The client is gone: the task ends.
    closed: AtomicBool,
}

struct Entry {
    id: u64,
    renewal: Renewal,
    /// Open holds (reentries) on this lock by this owner.
    holds: usize,
    next_due: Instant,
    /// The lease runs out here unless a renewal succeeds.
    deadline: Instant,
    lost: Arc<LostSignal>,
}

/// Set once, when the watchdog gives a lock up. A flag and a `Notify`
/// rather than a `watch` channel: it is allocated for every held lock, and
/// a `watch` channel is several times its size.
#[derive(Default)]
struct LostSignal {
    lost: AtomicBool,
    notify: Notify,
}

impl LostSignal {
    fn set(&self) {
        self.lost.store(true, Ordering::Release);
        self.notify.notify_waiters();
    }

    fn is_set(&self) -> bool {
        self.lost.load(Ordering::Acquire)
    }
}

/// A guard's link to its watchdog entry.
#[derive(Clone)]
pub(crate) struct Held {
    key: EntryKey,
    id: u64,
    lost: Arc<LostSignal>,
}

impl Held {
    pub(crate) fn is_lost(&self) -> bool {
        self.lost.is_set()
    }

    /// Resolves when the lock is lost; never, if it is released first.
    pub(crate) fn lost(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let signal = self.lost.clone();
        async move {
            loop {
                let notified = signal.notify.notified();
                tokio::pin!(notified);
                // Registered before the flag is read: a loss in between
                // still wakes this future.
                notified.as_mut().enable();
                if signal.is_set() {
                    return;
                }
                notified.await;
            }
        }
    }
}

/// What leaving a hold did.
pub(crate) struct Left {
    /// The watchdog had already declared the lock lost.
    pub(crate) was_lost: bool,
}

fn interval(lease: Duration) -> Duration {
    (lease / 3).max(Duration::from_millis(1))
}

impl Watchdog {
    pub(crate) fn new() -> Self {
        Watchdog {
            shared: Arc::new(Shared {
                entries: Mutex::new(Entries::default()),
                scheduled: Mutex::new(None),
                wake: Notify::new(),
                next_id: AtomicU64::new(1),
                started: std::sync::Once::new(),
                closed: AtomicBool::new(false),
            }),
        }
    }

    /// Start renewing (or count one more hold of) a lock just granted.
    /// `granted_at` is when the acquire was sent: the lease counts from there.
    pub(crate) fn hold(
        &self,
        io: &Io,
        backend: &Arc<dyn Backend>,
        renewal: Renewal,
        granted_at: Instant,
    ) -> Held {
        self.start(io, backend);
        let valid = renewal.lease.saturating_sub(backend.drift(renewal.lease));
        let key: EntryKey = (renewal.name.hash.clone(), renewal.owner.clone());
        let mut entries = self.shared.entries.lock().unwrap();
        let mut fresh = false;
        let entry = entries.entry(key.clone()).or_insert_with(|| {
            fresh = true;
            Entry {
                id: self.shared.next_id.fetch_add(1, Ordering::Relaxed),
                next_due: granted_at + interval(renewal.lease),
                deadline: granted_at + valid,
                holds: 0,
                lost: Arc::default(),
                renewal: renewal.clone(),
            }
        });
        entry.holds += 1;
        if renewal.lease > entry.renewal.lease {
            // A nested holder asked for a longer lease (Redis kept the longer).
            entry.renewal.lease = renewal.lease;
            entry.deadline = entry.deadline.max(granted_at + valid);
        }
        let held = Held {
            key,
            id: entry.id,
            lost: entry.lost.clone(),
        };
        let due = entry.next_due.min(entry.deadline);
        let wake =
            fresh && !matches!(*self.shared.scheduled.lock().unwrap(), Some(at) if at <= due);
        drop(entries);
        if wake {
            self.shared.wake.notify_one();
        }
        held
    }

    /// End one hold. The last hold stops renewals before the caller sends
    /// its release, so no renewal is ever issued after it.
    pub(crate) fn leave(&self, held: &Held) -> Left {
        let mut entries = self.shared.entries.lock().unwrap();
        let was_lost = held.is_lost();
        if let Some(entry) = entries.get_mut(&held.key) {
            if entry.id == held.id {
                entry.holds -= 1;
                if entry.holds == 0 {
                    entries.remove(&held.key);
                }
            }
        }
        Left { was_lost }
    }

    /// How many locks are being renewed (for tests and metrics).
    pub(crate) fn len(&self) -> usize {
        self.shared.entries.lock().unwrap().len()
    }

    fn start(&self, io: &Io, backend: &Arc<dyn Backend>) {
        self.shared.started.call_once(|| {
            io.spawn(run(self.shared.clone(), backend.clone()));
        });
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.shared.closed.store(true, Ordering::Release);
        self.shared.wake.notify_one();
    }
}

async fn run(shared: Arc<Shared>, backend: Arc<dyn Backend>) {
    loop {
        let notified = shared.wake.notified();
        if shared.closed.load(Ordering::Acquire) {
            return;
        }
        let next = {
            let entries = shared.entries.lock().unwrap();
            let next = entries.values().map(|e| e.next_due.min(e.deadline)).min();
            *shared.scheduled.lock().unwrap() = next;
            next
        };
        match next {
            Some(at) => tokio::select! {
                _ = tokio::time::sleep_until(at) => tick(&shared, &*backend).await,
                _ = notified => {}
            },
            None => notified.await,
        }
    }
}

async fn tick(shared: &Shared, backend: &dyn Backend) {
    let now = Instant::now();
    // Entry ids in batch order. Ids grow with each new entry, so the
    // outcomes are matched back by binary search over the sorted ids rather
    // than one hash lookup per lock: with 100k locks held that lookup was
    // most of the watchdog's time.
    let (ids, batch, earliest_deadline): (Vec<u64>, Vec<Renewal>, Option<Instant>) = {
        let entries = shared.entries.lock().unwrap();
        let mut ids = Vec::with_capacity(entries.len());
        let mut batch = Vec::with_capacity(entries.len());
        let mut earliest = None::<Instant>;
        for e in entries.values() {
            // Everything that would fall due before its next tick goes now.
            if e.next_due <= now + interval(e.renewal.lease) || e.deadline <= now {
                ids.push(e.id);
                batch.push(e.renewal.clone());
                earliest = Some(earliest.map_or(e.deadline, |d: Instant| d.min(e.deadline)));
            }
        }
        (ids, batch, earliest)
    };
    if batch.is_empty() {
        return;
    }
    let sent_at = Instant::now();
    // Never wait past the point where a lock must be declared lost.
    let limit = earliest_deadline
        .map(|d| d.saturating_duration_since(sent_at))
        .unwrap_or_default()
        .max(Duration::from_millis(5));
    // No answer in time leaves every outcome missing: handled as a failure.
    let mut outcomes: Vec<Renewed> = tokio::time::timeout(limit, backend.renew(batch))
        .await
        .unwrap_or_default();
    let mut by_id: Vec<(u64, usize)> = ids.into_iter().enumerate().map(|(i, id)| (id, i)).collect();
    by_id.sort_unstable();
    let now = Instant::now();
    let mut entries = shared.entries.lock().unwrap();
    let mut gone = Vec::new();
    for (key, entry) in entries.iter_mut() {
        let Ok(at) = by_id.binary_search_by_key(&entry.id, |&(id, _)| id) else {
            // Not in this batch, or taken since the batch was built.
            continue;
        };
        let i = by_id[at].1;
        let iv = interval(entry.renewal.lease);
        let outcome = outcomes
            .get_mut(i)
            .map(|o| std::mem::replace(o, Renewed::Yes));
        match outcome {
            Some(Renewed::Yes) => {
                let lease = entry.renewal.lease;
                entry.deadline = sent_at + lease.saturating_sub(backend.drift(lease));
                entry.next_due = sent_at + iv;
            }
            Some(Renewed::NotOwner) => {
                tracing::warn!(key = %entry.renewal.name.key, "lock lost: Redis no longer has it for this holder");
                entry.lost.set();
                gone.push(key.clone());
            }
            failed => {
                if now >= entry.deadline {
                    tracing::warn!(key = %entry.renewal.name.key, "lock lost: lease ran out while renewals failed");
                    entry.lost.set();
                    gone.push(key.clone());
                } else {
                    if let Some(Renewed::Failed(e)) = failed {
                        tracing::debug!(key = %entry.renewal.name.key, error = %e, "lock renewal failed; retrying");
                    } else {
                        tracing::debug!(key = %entry.renewal.name.key, "lock renewal got no answer in time; retrying");
                    }
                    let left = entry.deadline - now;
                    entry.next_due = now + (left / 4).clamp(Duration::from_millis(10), iv);
                }
            }
        }
    }
    for key in gone {
        entries.remove(&key);
    }
}
