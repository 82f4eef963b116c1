//! Lock figures for the `metrics` facade (cargo feature `metrics`). Every
//! series carries the label `lock`: the attribute's key template or the
//! name given by hand, never the formatted key. Without the feature these
//! are empty and cost nothing.

use std::borrow::Cow;
use std::collections::HashSet;
use std::sync::{LazyLock, Mutex};
use std::time::Duration;

/// A lock's name for metrics and spans, as a `&'static str`: labels then
/// cost no allocation per lock operation. Names given at run time are
/// kept once each for the life of the process; they are labels, so there
/// are few of them.
pub(crate) fn intern(name: Cow<'static, str>) -> &'static str {
    static NAMES: LazyLock<Mutex<HashSet<&'static str>>> = LazyLock::new(Mutex::default);
    match name {
        Cow::Borrowed(name) => name,
        Cow::Owned(name) => {
            let mut names = NAMES.lock().unwrap();
            match names.get(name.as_str()) {
                Some(known) => known,
                None => {
                    let leaked: &'static str = Box::leak(name.into_boxed_str());
                    names.insert(leaked);
                    leaked
                }
            }
        }
    }
}

/// Every metric's name, kind and meaning.
#[cfg(feature = "metrics")]
pub(crate) const METRICS: [(&str, &str, &str); 6] = [
    (
        ACQUIRED,
        "counter",
        "Fresh lock acquisitions (not reentries), by lock template.",
    ),
    (
        BUSY,
        "counter",
        "Lock requests that gave up busy (Timeout, or skipped), by lock template.",
    ),
    (
        LOST,
        "counter",
        "Holds lost while held (lease ran out unrenewed, deleted, or max_hold reached), by lock template.",
    ),
    (
        ACQUIRE_SECONDS,
        "histogram",
        "Seconds from a lock request to the guard in hand, waiting included, by lock template.",
    ),
    (
        HELD_SECONDS,
        "histogram",
        "Seconds from acquisition to release, by lock template.",
    ),
    (
        HELD_LOCKS,
        "gauge",
        "Locks this process holds now (fresh acquisitions not yet released), by lock template.",
    ),
];

/// What the `metrics` macros would pass along (target and module: this
/// module, level INFO).
#[cfg(feature = "metrics")]
static META: metrics::Metadata<'static> =
    metrics::Metadata::new(module_path!(), metrics::Level::INFO, Some(module_path!()));

/// The key of series `name` for lock `lock` held in `mode`, as
/// `name!(name, "lock" => lock, "mode" => mode)` makes it but without
/// allocating: each pair of labels is made once, and kept for the process
/// (label values are a bounded set: see [`intern`]; modes are constants).
#[cfg(feature = "metrics")]
fn key(name: &'static str, lock: &'static str, mode: &'static str) -> metrics::Key {
    metrics::Key::from_static_parts(name, labels(lock, mode))
}

/// `[("lock", lock), ("mode", mode)]`, made once per pair.
#[cfg(feature = "metrics")]
fn labels(lock: &'static str, mode: &'static str) -> &'static [metrics::Label] {
    use std::cell::Cell;
    use std::collections::HashMap;
    type Labels = &'static [metrics::Label];
    type Pair = (&'static str, &'static str);
    thread_local! {
        /// The last labels this thread used: most code locks under one.
        static LAST: Cell<Option<(Pair, Labels)>> = const { Cell::new(None) };
    }
    static ALL: LazyLock<Mutex<HashMap<Pair, Labels>>> = LazyLock::new(Mutex::default);
    if let Some(((last, last_mode), labels)) = LAST.with(Cell::get) {
        if std::ptr::eq(last, lock) && last_mode == mode {
            return labels;
        }
    }
    let labels: Labels = *ALL.lock().unwrap().entry((lock, mode)).or_insert_with(|| {
        Box::leak(Box::new([
            metrics::Label::from_static_parts("lock", lock),
            metrics::Label::from_static_parts("mode", mode),
        ]))
    });
    LAST.with(|l| l.set(Some(((lock, mode), labels))));
    labels
}

#[cfg(feature = "metrics")]
const ACQUIRED: &str = "distributed_lock_acquired_total";
#[cfg(feature = "metrics")]
const BUSY: &str = "distributed_lock_busy_total";
#[cfg(feature = "metrics")]
const LOST: &str = "distributed_lock_lost_total";
#[cfg(feature = "metrics")]
const ACQUIRE_SECONDS: &str = "distributed_lock_acquire_seconds";
#[cfg(feature = "metrics")]
const HELD_SECONDS: &str = "distributed_lock_held_seconds";
#[cfg(feature = "metrics")]
const HELD_LOCKS: &str = "distributed_lock_held_locks";

/// Describe every metric to the installed recorder (units, help text).
/// Called whenever a client is built: install the recorder before that.
pub(crate) fn describe() {
    #[cfg(feature = "metrics")]
    for (name, kind, help) in METRICS {
        match kind {
            "counter" => metrics::describe_counter!(name, metrics::Unit::Count, help),
            "histogram" => metrics::describe_histogram!(name, metrics::Unit::Seconds, help),
            _ => metrics::describe_gauge!(name, metrics::Unit::Count, help),
        }
    }
}

/// A fresh hold began (`+1`) or ended (`-1`): the gauge of locks held.
pub(crate) fn holding(lock: &'static str, mode: &'static str, delta: f64) {
    #[cfg(feature = "metrics")]
    metrics::with_recorder(|r| r.register_gauge(&key(HELD_LOCKS, lock, mode), &META))
        .increment(delta);
    #[cfg(not(feature = "metrics"))]
    let _ = (lock, mode, delta);
}

/// A fresh acquisition (not a reentry), `waited` after it was asked for.
pub(crate) fn acquired(lock: &'static str, mode: &'static str, waited: Duration) {
    #[cfg(feature = "metrics")]
    {
        metrics::with_recorder(|r| r.register_counter(&key(ACQUIRED, lock, mode), &META))
            .increment(1);
        metrics::with_recorder(|r| r.register_histogram(&key(ACQUIRE_SECONDS, lock, mode), &META))
            .record(waited.as_secs_f64());
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (lock, mode, waited);
}

/// A request that gave up busy: `Timeout`, or skipped
/// (`on_busy = "skip"`, `try_acquire` returning `None`).
pub(crate) fn busy(lock: &'static str, mode: &'static str) {
    #[cfg(feature = "metrics")]
    metrics::with_recorder(|r| r.register_counter(&key(BUSY, lock, mode), &META)).increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = (lock, mode);
}

/// A hold lost while held (expired unrenewed, deleted, or `max_hold`).
pub(crate) fn lost(lock: &'static str, mode: &'static str) {
    #[cfg(feature = "metrics")]
    metrics::with_recorder(|r| r.register_counter(&key(LOST, lock, mode), &META)).increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = (lock, mode);
}

/// A hold ended (released or dropped) `held` after it was acquired.
pub(crate) fn held(lock: &'static str, mode: &'static str, held: Duration) {
    #[cfg(feature = "metrics")]
    metrics::with_recorder(|r| r.register_histogram(&key(HELD_SECONDS, lock, mode), &META))
        .record(held.as_secs_f64());
    #[cfg(not(feature = "metrics"))]
    let _ = (lock, mode, held);
}
