//! One task per client keeps every held lock alive.
//!
//! Each lock wants renewing every lease/3. When the earliest one is due, the
//! watchdog renews every lock that would fall due before the next tick, in
//! one batch (one pipelined round trip per Redis node), so a client holding
//! many locks sends one request per tick, not one per lock.
//!
//! A round that waits for a slow answer blinds nothing: the holds it sent
//! wait for it (no longer than the earliest of their deadlines), while the
//! others, and holds taken meanwhile, go out in rounds of their own.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::stream::{FuturesUnordered, StreamExt};
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::backend::{Backend, Renewal, Renewed};
use crate::io::Io;
use crate::own_keys::OwnKeys;
use crate::protocol::{Renewing, Tick, Verdict};

/// Identifies one lock held by one owner: the lock's hash and the owner,
/// hashed by the owner alone (unique to the hold, and made by the client:
/// see `own_keys.rs`).
#[derive(Clone, PartialEq, Eq)]
struct EntryKey(Arc<str>, Arc<str>);

impl std::hash::Hash for EntryKey {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.1.hash(state);
    }
}

type Entries = HashMap<EntryKey, Entry, OwnKeys>;

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
    /// Numbers ticks from 1 (0: an entry no tick has sent yet).
    next_tick: AtomicU64,
    /// The task that renews (see [`Watchdog::start`]).
    task: Mutex<Task>,
    /// The client is gone or closed: the task ends.
    closed: AtomicBool,
    /// Told when the last entry leaves (see [`Watchdog::idle`]).
    emptied: Notify,
}

struct Entry {
    id: u64,
    /// What the next tick sends; its lease only grows (a nested holder may
    /// ask for a longer one).
    renewal: Renewal,
    /// When it falls due, when its lease runs out, its `max_hold`.
    timing: Renewing<Instant>,
    lost: Arc<LostSignal>,
    /// (tick number, place in that tick's batch): matches the tick's
    /// outcomes back without a lookup per lock, and says whether the round
    /// that sent it last is still out.
    slot: (u64, u32),
}

/// Which task renews, and where it runs. The in-memory client's task runs
/// on a caller's runtime: when that runtime shuts down (one
/// `#[tokio::test]` ends, the client lives on in the next), the task is
/// dropped with it and started again where the client is used.
#[derive(Default)]
struct Task {
    /// Numbers the tasks started; a task whose number is not the latest
    /// ends.
    generation: u64,
    running: bool,
    /// It has begun to run. One that has not may sit on a runtime that is
    /// going away: a hold taken meanwhile starts another.
    polled: bool,
    /// It runs where no caller's runtime was (the fallback thread): the
    /// next hold taken inside a runtime moves it there.
    stray: bool,
}

/// Set once, when the watchdog gives a lock up: why, and the waiters. An
/// atomic and a `Notify` rather than a `watch` channel: it is allocated for
/// every held lock, and a `watch` channel is several times its size.
struct LostSignal {
    /// 0 held, else an [`Ended`] as `u8`.
    ended: AtomicU8,
    /// `max_hold` in ms (0: none), for the error that reports it.
    max_hold_ms: AtomicU32,
    /// The hold's deadline, in ns after `since`: past it the hold is lost
    /// whatever the watchdog's timers are doing (a busy or paused thread
    /// sets the flag late; the clock tells the holder in time).
    deadline_ns: AtomicU64,
    since: Instant,
    notify: Notify,
}

/// Why the watchdog gave a hold up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ended {
    /// Redis no longer had it, or its lease ran out unrenewed.
    Lost = 1,
    /// It was held for its `max_hold`: renewals stopped on purpose.
    MaxHold = 2,
    /// The client was closed while it was held: released by the close.
    Closed = 3,
}

impl LostSignal {
    fn new(since: Instant, deadline: Instant) -> Self {
        let signal = LostSignal {
            ended: AtomicU8::new(0),
            max_hold_ms: AtomicU32::new(0),
            deadline_ns: AtomicU64::new(0),
            since,
            notify: Notify::new(),
        };
        signal.book(deadline);
        signal
    }

    /// The deadline moved (a renewal was answered).
    fn book(&self, deadline: Instant) {
        let ns = deadline.saturating_duration_since(self.since).as_nanos();
        self.deadline_ns
            .store(u64::try_from(ns).unwrap_or(u64::MAX), Ordering::Release);
    }

    /// The deadline (`None`: none, the hold was released).
    fn deadline(&self) -> Option<Instant> {
        let ns = self.deadline_ns.load(Ordering::Acquire);
        (ns != u64::MAX)
            .then(|| self.since.checked_add(Duration::from_nanos(ns)))
            .flatten()
    }

    /// Released: no deadline any more, the clock says nothing about it.
    fn released(&self) {
        self.deadline_ns.store(u64::MAX, Ordering::Release);
    }

    /// Past the deadline by the clock: the lock may be someone else's.
    fn past_deadline(&self) -> bool {
        let now = Instant::now()
            .saturating_duration_since(self.since)
            .as_nanos();
        u64::try_from(now).unwrap_or(u64::MAX) >= self.deadline_ns.load(Ordering::Acquire)
    }

    fn set(&self) {
        self.end(Ended::Lost);
    }

    /// Its deadline passed by the clock: lost, or, where that deadline is
    /// its `max_hold`, ended there on purpose (the watchdog's own tick for
    /// it may come a moment later).
    fn lapse(&self) {
        let cap_ns = u64::from(self.max_hold_ms.load(Ordering::Relaxed)) * 1_000_000;
        let now = Instant::now()
            .saturating_duration_since(self.since)
            .as_nanos();
        let capped = cap_ns > 0 && u64::try_from(now).unwrap_or(u64::MAX) >= cap_ns;
        self.end(if capped { Ended::MaxHold } else { Ended::Lost });
    }

    fn end(&self, why: Ended) {
        let _ = self
            .ended
            .compare_exchange(0, why as u8, Ordering::AcqRel, Ordering::Acquire);
        self.notify.notify_waiters();
    }

    fn is_set(&self) -> bool {
        self.ended.load(Ordering::Acquire) != 0
    }

    fn why(&self) -> Option<Ended> {
        match self.ended.load(Ordering::Acquire) {
            0 => None,
            2 => Some(Ended::MaxHold),
            3 => Some(Ended::Closed),
            _ => Some(Ended::Lost),
        }
    }
}

/// The entries' key: the lock's hash and its owner.
fn entry_key((hash, owner): (&Arc<str>, &Arc<str>)) -> EntryKey {
    EntryKey(hash.clone(), owner.clone())
}

/// A guard's link to its watchdog entry. The entry's key (the lock's
/// hash and owner) is not repeated here: the hold that keeps this has both.
#[derive(Clone)]
pub(crate) struct Held {
    id: u64,
    lost: Arc<LostSignal>,
}

impl Held {
    pub(crate) fn is_lost(&self) -> bool {
        if self.lost.is_set() {
            return true;
        }
        // Its deadline passed and the watchdog has not said so yet (its
        // timer is late): lost now, as the watchdog will find.
        if self.lost.past_deadline() {
            self.lost.lapse();
            return true;
        }
        false
    }

    /// Why the hold ended, if the watchdog ended it; with `max_hold` when
    /// it was held that long.
    pub(crate) fn ended(&self) -> Option<(Ended, Option<Duration>)> {
        let why = self.lost.why()?;
        let ms = self.lost.max_hold_ms.load(Ordering::Relaxed);
        Some((why, (ms > 0).then(|| Duration::from_millis(u64::from(ms)))))
    }

    /// Resolves when the lock is lost; never, if it is released first.
    /// Like [`is_lost`](Self::is_lost), by the clock too: at its deadline,
    /// whether or not the watchdog's round has ended (an abort must not
    /// wait for it). `timer`: the runtime whose clock the deadlines are on.
    pub(crate) fn lost(
        &self,
        timer: &tokio::runtime::Handle,
    ) -> impl std::future::Future<Output = ()> + Send + 'static {
        let signal = self.lost.clone();
        let timer = timer.clone();
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
                if signal.past_deadline() {
                    signal.lapse();
                    return;
                }
                match signal.deadline() {
                    Some(deadline) => {
                        // Boxed: waited on once per renewal at most, and it
                        // keeps the body's future small.
                        let at = {
                            let _rt = timer.enter();
                            Box::pin(tokio::time::sleep_until(deadline))
                        };
                        tokio::select! {
                            () = notified => {}
                            () = at => {}
                        }
                    }
                    None => notified.await,
                }
            }
        }
    }
}

/// What leaving a hold did.
pub(crate) struct Left {
    /// The watchdog had already declared the lock lost.
    pub(crate) was_lost: bool,
    /// When the lock expires by itself now that renewals stopped (`None`:
    /// the watchdog no longer had it).
    pub(crate) deadline: Option<Instant>,
}

impl Entry {
    /// When the task must next look at this entry.
    fn due(&self) -> Instant {
        self.timing.due()
    }
}

impl Watchdog {
    pub(crate) fn new() -> Self {
        Watchdog {
            shared: Arc::new(Shared {
                entries: Mutex::new(Entries::default()),
                scheduled: Mutex::new(None),
                wake: Notify::new(),
                next_id: AtomicU64::new(1),
                next_tick: AtomicU64::new(1),
                task: Mutex::default(),
                closed: AtomicBool::new(false),
                emptied: Notify::new(),
            }),
        }
    }

    /// Start renewing a lock just granted. `granted_at` is when the acquire
    /// was first sent: the lease counts from there.
    pub(crate) fn hold(
        &self,
        io: &Io,
        backend: &Arc<Backend>,
        renewal: Renewal,
        granted_at: Instant,
        until: Option<Instant>,
    ) -> Held {
        self.start(io, backend);
        let drift = backend.drift(renewal.lease);
        self.insert(renewal, granted_at, drift, until)
    }

    fn insert(
        &self,
        renewal: Renewal,
        granted_at: Instant,
        drift: Duration,
        until: Option<Instant>,
    ) -> Held {
        let key = EntryKey(renewal.name.hash.clone(), renewal.owner.clone());
        let timing = Renewing::start(granted_at, renewal.lease, drift, until);
        let lost = LostSignal::new(granted_at, timing.deadline);
        if let Some(u) = until {
            let max_hold = u.saturating_duration_since(granted_at).as_millis();
            lost.max_hold_ms.store(
                u32::try_from(max_hold).unwrap_or(u32::MAX),
                Ordering::Relaxed,
            );
        }
        let entry = Entry {
            id: self.shared.next_id.fetch_add(1, Ordering::Relaxed),
            timing,
            lost: Arc::new(lost),
            renewal,
            slot: (0, 0),
        };
        let held = Held {
            id: entry.id,
            lost: entry.lost.clone(),
        };
        let due = entry.due();
        let mut entries = self.shared.entries.lock().unwrap();
        // Owner ids are unique per acquisition: an entry under the same
        // key is a stale one, and its holder is told it lost the lock
        // rather than silently sharing this grant.
        if let Some(old) = entries.insert(key, entry) {
            old.lost.set();
        }
        let wake = !matches!(*self.shared.scheduled.lock().unwrap(), Some(at) if at <= due);
        drop(entries);
        if wake {
            self.shared.wake.notify_one();
        }
        held
    }

    /// A nested holder asked for a longer lease: later renewals send it.
    /// (What Redis has now stays until the next tick; the lease only matters
    /// once renewals stop.)
    pub(crate) fn raise_lease(
        &self,
        held: &Held,
        key: (&Arc<str>, &Arc<str>),
        lease: std::time::Duration,
    ) {
        let mut entries = self.shared.entries.lock().unwrap();
        if let Some(entry) = entries.get_mut(&entry_key(key)) {
            if entry.id == held.id && lease > entry.renewal.lease {
                entry.renewal.lease = lease;
            }
        }
    }

    /// Stop renewing, before the caller sends its release, so no renewal
    /// is ever issued after it.
    pub(crate) fn leave(&self, held: &Held, key: (&Arc<str>, &Arc<str>)) -> Left {
        let mut entries = self.shared.entries.lock().unwrap();
        let was_lost = held.is_lost();
        let key = entry_key(key);
        let mut deadline = None;
        // One lookup (the key is hashed once).
        if let std::collections::hash_map::Entry::Occupied(e) = entries.entry(key) {
            if e.get().id == held.id {
                deadline = Some(e.remove().timing.deadline);
                // A `lost()` still awaited is not woken by the clock now.
                held.lost.released();
                if entries.is_empty() {
                    self.shared.emptied.notify_waiters();
                }
            }
        }
        Left { was_lost, deadline }
    }

    /// Resolves once no lock is being renewed.
    pub(crate) async fn idle(&self) {
        loop {
            let notified = self.shared.emptied.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.shared.entries.lock().unwrap().is_empty() {
                return;
            }
            notified.await;
        }
    }

    /// Stop for good (the client is closed): every lock still renewed is
    /// given up, its holder told it is lost, and returned to be released.
    /// The task ends, and a hold taken after this is not renewed.
    /// Each with its deadline: what Redis still gives it, the bound of its
    /// release (a Cluster slot on the move is waited out until then).
    pub(crate) fn close(&self) -> Vec<(Renewal, Instant)> {
        self.shared.closed.store(true, Ordering::Release);
        let entries = std::mem::take(&mut *self.shared.entries.lock().unwrap());
        self.shared.wake.notify_one();
        self.shared.emptied.notify_waiters();
        entries
            .into_values()
            .map(|e| {
                e.lost.end(Ended::Closed);
                (e.renewal, e.timing.deadline)
            })
            .collect()
    }

    /// Whether `owner`'s lock under `hash` is being renewed.
    pub(crate) fn holds(&self, hash: &Arc<str>, owner: &Arc<str>) -> bool {
        let key = EntryKey(hash.clone(), owner.clone());
        self.shared.entries.lock().unwrap().contains_key(&key)
    }

    /// How many locks are being renewed (for tests and metrics).
    pub(crate) fn len(&self) -> usize {
        self.shared.entries.lock().unwrap().len()
    }

    /// Make sure a task renews: the first hold starts it. On the caller's
    /// runtime (the in-memory client) it is started again when the runtime
    /// it ran on has gone away, and moved from the fallback thread into
    /// the caller's runtime once there is one.
    fn start(&self, io: &Io, backend: &Arc<Backend>) {
        let here = io.is_caller() && tokio::runtime::Handle::try_current().is_ok();
        let mut task = self.shared.task.lock().unwrap();
        if task.running && task.polled && !(task.stray && here) {
            return;
        }
        task.generation += 1;
        task.running = true;
        task.polled = false;
        task.stray = io.is_caller() && !here;
        let generation = task.generation;
        drop(task);
        // A task being replaced sees the new generation and ends.
        self.shared.wake.notify_waiters();
        io.spawn(run(self.shared.clone(), backend.clone(), generation));
    }
}

/// Marks the task stopped when it ends or is dropped with its runtime; if
/// locks are still held then, a new task takes over at once (on the
/// fallback thread, until a hold moves it to a caller's runtime).
struct Running {
    shared: Arc<Shared>,
    backend: Arc<Backend>,
    generation: u64,
}

impl Drop for Running {
    fn drop(&mut self) {
        let mut task = self.shared.task.lock().unwrap();
        if task.generation != self.generation {
            return;
        }
        task.running = false;
        let orphaned = !self.shared.closed.load(Ordering::Acquire)
            && !self.shared.entries.lock().unwrap().is_empty();
        if orphaned {
            task.generation += 1;
            task.running = true;
            task.polled = false;
            task.stray = true;
            let generation = task.generation;
            drop(task);
            Io::caller().spawn(run(self.shared.clone(), self.backend.clone(), generation));
        }
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.shared.closed.store(true, Ordering::Release);
        self.shared.wake.notify_one();
    }
}

async fn run(shared: Arc<Shared>, backend: Arc<Backend>, generation: u64) {
    let _running = Running {
        shared: shared.clone(),
        backend: backend.clone(),
        generation,
    };
    {
        let mut task = shared.task.lock().unwrap();
        if task.generation == generation {
            task.polled = true;
            // On the fallback thread (moved there when the runtime it was
            // spawned on shut down before it ran): a hold taken in a
            // runtime brings it back to one.
            task.stray |= crate::io::on_fallback();
        }
    }
    // Rounds out at once: one that waits for a slow answer does not keep
    // the others, nor holds taken meanwhile, from being renewed, or from
    // being declared lost at their deadlines. Their tick numbers: a hold
    // whose last round is among them waits for it. They belong to this
    // task: if it is dropped, so are they, and the next task sends their
    // holds again.
    let mut rounds = FuturesUnordered::new();
    let mut out: Vec<u64> = Vec::new();
    loop {
        let notified = shared.wake.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        if shared.closed.load(Ordering::Acquire)
            || shared.task.lock().unwrap().generation != generation
        {
            return;
        }
        let next = {
            let entries = shared.entries.lock().unwrap();
            let next = entries
                .values()
                .filter(|e| !out.contains(&e.slot.0))
                .map(Entry::due)
                .min();
            *shared.scheduled.lock().unwrap() = next;
            next
        };
        let sleep = tokio::time::sleep_until(next.unwrap_or_else(Instant::now));
        tokio::select! {
            () = sleep, if next.is_some() => {
                if let Some(round) = Round::start(&shared, &out) {
                    out.push(round.tick_no);
                    let (shared, backend) = (shared.clone(), backend.clone());
                    rounds.push(async move { round.finish(&shared, &backend).await });
                }
            }
            Some(tick_no) = rounds.next(), if !rounds.is_empty() => {
                out.retain(|&t| t != tick_no);
            }
            () = notified => {}
        }
    }
}

/// One renewal round: the holds it sends, which no other round sends
/// until it returns.
struct Round {
    tick_no: u64,
    batch: Vec<Renewal>,
    /// Its holds' earliest deadline: the round waits no longer.
    earliest_deadline: Option<Instant>,
}

/// Start a round and wait for it (the task keeps several out at once).
#[cfg(test)]
async fn tick(shared: &Shared, backend: &Backend) {
    if let Some(round) = Round::start(shared, &[]) {
        round.finish(shared, backend).await;
    }
}

impl Round {
    /// The holds due now that none of the rounds `out` sent (`None`:
    /// there are none); holds past their `max_hold` end here.
    fn start(shared: &Shared, out: &[u64]) -> Option<Round> {
        let now = Instant::now();
        // Each entry sent remembers its place in this round's batch, so the
        // outcomes are matched back without a lookup per lock (with 100k
        // locks held, lookups were most of the watchdog's time).
        let tick_no = shared.next_tick.fetch_add(1, Ordering::Relaxed);
        let mut entries = shared.entries.lock().unwrap();
        let mut batch = Vec::new();
        let mut earliest = None::<Instant>;
        let mut ended = Vec::new();
        for (key, e) in entries.iter_mut() {
            if out.contains(&e.slot.0) {
                continue;
            }
            match e.timing.tick(now, e.renewal.lease) {
                // `max_hold` reached: renewals stop, and the hold is over.
                Tick::MaxHold => {
                    tracing::warn!(key = %e.renewal.name.key, "lock held for its max_hold: renewals stop and the hold ends");
                    e.lost.end(Ended::MaxHold);
                    ended.push(key.clone());
                }
                // Everything that would fall due before its next tick goes now.
                Tick::Renew(lease) => {
                    e.slot = (tick_no, batch.len() as u32);
                    let mut renewal = e.renewal.clone();
                    renewal.lease = lease;
                    batch.push(renewal);
                    let deadline = e.timing.deadline;
                    earliest = Some(earliest.map_or(deadline, |d: Instant| d.min(deadline)));
                }
                Tick::NotYet => {}
            }
        }
        for key in ended {
            entries.remove(&key);
        }
        if entries.is_empty() {
            shared.emptied.notify_waiters();
        }
        (!batch.is_empty()).then_some(Round {
            tick_no,
            batch,
            earliest_deadline: earliest,
        })
    }

    /// Send the batch and book what came back (or did not, by the earliest
    /// deadline). Returns the round's tick number.
    async fn finish(self, shared: &Shared, backend: &Backend) -> u64 {
        let Round {
            tick_no,
            batch,
            earliest_deadline,
        } = self;
        let sent_at = Instant::now();
        // Never wait past the point where a lock must be declared lost.
        let limit = earliest_deadline
            .map(|d| d.saturating_duration_since(sent_at))
            .unwrap_or_default()
            .max(Duration::from_millis(5));
        // Deadlines are booked from the lease this round sends, whatever the
        // entry asks for by the time the answer comes.
        let leases: Vec<Duration> = batch.iter().map(|r| r.lease).collect();
        // No answer in time leaves every outcome missing: handled as a failure.
        let mut outcomes: Vec<Renewed> = tokio::time::timeout(limit, backend.renew(batch))
            .await
            .unwrap_or_default();
        let now = Instant::now();
        let mut entries = shared.entries.lock().unwrap();
        let mut gone = Vec::new();
        for (key, entry) in entries.iter_mut() {
            if entry.slot.0 != tick_no {
                // Not in this round, or taken since the round was built.
                continue;
            }
            let i = entry.slot.1 as usize;
            let sent = leases[i];
            let outcome = outcomes
                .get_mut(i)
                .map(|o| std::mem::replace(o, Renewed::Yes));
            let verdict = match &outcome {
                Some(Renewed::Yes) => Verdict::Renewed,
                Some(Renewed::NotOwner) => Verdict::NotOwner,
                _ => Verdict::NoAnswer,
            };
            // A holder already told (its deadline passed by the clock)
            // stays lost, whatever a late answer says.
            let told = entry.lost.is_set();
            let lost = entry.timing.answered(
                verdict,
                (sent_at, sent),
                entry.renewal.lease,
                backend.drift(sent),
                now,
            ) || told;
            entry.lost.book(entry.timing.deadline);
            match (&outcome, lost) {
                (Some(Renewed::NotOwner), _) => {
                    tracing::warn!(key = %entry.renewal.name.key, "lock lost: Redis no longer has it for this holder");
                }
                (_, true) => {
                    tracing::warn!(key = %entry.renewal.name.key, "lock lost: lease ran out while renewals failed");
                }
                (Some(Renewed::Failed(e)), false) => {
                    tracing::debug!(key = %entry.renewal.name.key, error = %e, "lock renewal failed; retrying");
                }
                (None, false) => {
                    tracing::debug!(key = %entry.renewal.name.key, "lock renewal got no answer in time; retrying");
                }
                (Some(Renewed::Yes), false) => {}
            }
            if lost {
                entry.lost.set();
                gone.push(key.clone());
            }
        }
        for key in gone {
            entries.remove(&key);
        }
        if entries.is_empty() {
            shared.emptied.notify_waiters();
        }
        tick_no
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::fake::BoxFuture;
    use crate::key::LockName;
    use tokio::runtime::Handle;

    /// A holder asks past its deadline while the watchdog's timer has not
    /// run (a busy or paused I/O thread): the clock says lost, and it stays
    /// so. Before, `is_lost()` read only the flag the timer sets, and said
    /// "held" after Redis could have given the lock to someone else.
    #[tokio::test(start_paused = true)]
    async fn a_hold_past_its_deadline_is_lost_before_the_watchdog_says_so() {
        let start = Instant::now();
        let held = Held {
            id: 1,
            lost: Arc::new(LostSignal::new(start, start + Duration::from_secs(1))),
        };
        tokio::time::advance(Duration::from_millis(999)).await;
        assert!(!held.is_lost(), "lost before its deadline");
        // A renewal answered: the deadline moves, and the hold is held.
        held.lost.book(start + Duration::from_secs(2));
        tokio::time::advance(Duration::from_millis(500)).await;
        assert!(!held.is_lost(), "a booked renewal did not count");
        tokio::time::advance(Duration::from_millis(501)).await;
        assert!(held.is_lost(), "held past its deadline");
        // Told once, told for good: a late renewal's answer books nothing
        // back.
        held.lost.book(start + Duration::from_secs(10));
        assert!(held.is_lost());
        assert_eq!(held.ended().map(|(why, _)| why), Some(Ended::Lost));
        // And the `lost()` future resolves.
        tokio::time::timeout(Duration::from_millis(1), held.lost(&Handle::current()))
            .await
            .expect("lost() did not resolve");
    }

    /// Renewals fail at once and the watchdog's round has not ended (its
    /// timer is late, or it waits for another answer): `lost()`, which an
    /// `on_lost = "abort"` body is raced against, resolves at the deadline
    /// by the clock, as `is_lost()` says. Before, it waited for the
    /// watchdog to set the flag, a round's end after the deadline: a window
    /// with two bodies running.
    #[tokio::test(start_paused = true)]
    async fn lost_resolves_at_the_deadline_by_the_clock() {
        let start = Instant::now();
        let held = Held {
            id: 1,
            lost: Arc::new(LostSignal::new(start, start + Duration::from_secs(1))),
        };
        let lost = tokio::spawn(held.lost(&Handle::current()));
        tokio::time::advance(Duration::from_millis(600)).await;
        // A renewal answered: the deadline moves on, and the future with it.
        held.lost.book(start + Duration::from_secs(2));
        let told = tokio::time::timeout(Duration::from_secs(10), lost).await;
        assert!(told.is_ok(), "lost() did not resolve by the deadline");
        assert_eq!(Instant::now() - start, Duration::from_secs(2));
        assert!(held.is_lost());
        // A hold released before its deadline is never lost by the clock.
        let released = Held {
            id: 2,
            lost: Arc::new(LostSignal::new(
                start,
                Instant::now() + Duration::from_secs(1),
            )),
        };
        released.lost.released();
        let quiet =
            tokio::time::timeout(Duration::from_secs(5), released.lost(&Handle::current())).await;
        assert!(quiet.is_err(), "a released hold was told it was lost");
    }

    /// Answers a renewal only when told to.
    #[derive(Default)]
    struct Gate {
        sent: Notify,
        go: Arc<Notify>,
    }

    impl crate::backend::fake::Fake for Gate {
        fn renew(&self, batch: Vec<Renewal>) -> BoxFuture<Vec<Renewed>> {
            self.sent.notify_one();
            let (n, go) = (batch.len(), self.go.clone());
            Box::pin(async move {
                go.notified().await;
                (0..n).map(|_| Renewed::Yes).collect()
            })
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_tick_books_the_lease_it_sent_not_one_raised_meanwhile() {
        let dog = Watchdog::new();
        let gate = Arc::new(Gate::default());
        let backend = Arc::new(Backend::Fake(gate.clone()));
        let (short, long) = (Duration::from_secs(3), Duration::from_secs(30));
        let renewal = Renewal {
            name: LockName::new("lock:", "k").unwrap(),
            owner: "o".into(),
            lease: short,
        };
        let held = dog.insert(renewal.clone(), Instant::now(), Duration::ZERO, None);
        tokio::time::advance(crate::protocol::interval(short)).await;
        let (shared, b) = (dog.shared.clone(), backend.clone());
        let ticking = tokio::spawn(async move { tick(&shared, &b).await });
        gate.sent.notified().await;
        let sent_at = Instant::now();
        // A nested holder asks for a longer lease while the tick is out.
        dog.raise_lease(&held, (&renewal.name.hash, &renewal.owner), long);
        gate.go.notify_one();
        ticking.await.unwrap();
        let entries = dog.shared.entries.lock().unwrap();
        let entry = entries.values().next().unwrap();
        assert_eq!(
            entry.timing.deadline,
            sent_at + short,
            "the deadline must follow the lease that was sent"
        );
        assert_eq!(
            entry.renewal.lease, long,
            "the next tick sends the longer lease"
        );
        assert_eq!(
            entry.timing.next_due,
            sent_at + crate::protocol::interval(short)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_round_out_does_not_keep_a_new_hold_from_being_declared_lost_at_its_deadline() {
        let dog = Watchdog::new();
        let gate = Arc::new(Gate::default());
        let backend = Arc::new(Backend::Fake(gate.clone()));
        let renewal = |key: &str, lease: u64| Renewal {
            name: LockName::new("lock:", key).unwrap(),
            owner: format!("o:{key}").into(),
            lease: Duration::from_secs(lease),
        };
        let _long = dog.insert(renewal("long", 30), Instant::now(), Duration::ZERO, None);
        tokio::spawn(run(dog.shared.clone(), backend, 0));
        // The long hold's round goes out and is never answered (a slow
        // connection): it waits until that hold's deadline, 30 s away.
        gate.sent.notified().await;
        let granted = Instant::now();
        let short = dog.insert(renewal("short", 1), granted, Duration::ZERO, None);
        let told =
            tokio::time::timeout(Duration::from_secs(5), short.lost(&Handle::current())).await;
        assert!(
            told.is_ok(),
            "a 1 s hold taken while a round was out was not declared lost 5 s later"
        );
        assert_eq!(
            Instant::now() - granted,
            Duration::from_secs(1),
            "declared lost at its deadline"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_round_dropped_with_its_task_leaves_its_holds_to_the_next_task() {
        let dog = Watchdog::new();
        let gate = Arc::new(Gate::default());
        let backend = Arc::new(Backend::Fake(gate.clone()));
        let renewal = Renewal {
            name: LockName::new("lock:", "k").unwrap(),
            owner: "o".into(),
            lease: Duration::from_secs(3),
        };
        let held = dog.insert(renewal, Instant::now(), Duration::ZERO, None);
        let first = tokio::spawn(run(dog.shared.clone(), backend, 0));
        gate.sent.notified().await;
        // The task goes (its runtime shut down, say) with the round out;
        // the task that takes over must send the hold again.
        first.abort();
        let _ = first.await;
        let sent = tokio::time::timeout(Duration::from_millis(900), gate.sent.notified()).await;
        assert!(
            sent.is_ok(),
            "the hold of the dropped round was never sent again"
        );
        assert!(!held.is_lost());
    }
}
