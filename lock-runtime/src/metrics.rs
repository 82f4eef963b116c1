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

/// A fresh acquisition (not a reentry), `waited` after it was asked for.
pub(crate) fn acquired(lock: &'static str, waited: Duration) {
    #[cfg(feature = "metrics")]
    {
        let label = [("lock", lock)];
        metrics::counter!("distributed_lock_acquired_total", &label).increment(1);
        metrics::histogram!("distributed_lock_acquire_seconds", &label)
            .record(waited.as_secs_f64());
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (lock, waited);
}

/// A request that gave up busy: `Timeout`, or skipped
/// (`on_busy = "skip"`, `try_acquire` returning `None`).
pub(crate) fn busy(lock: &'static str) {
    #[cfg(feature = "metrics")]
    metrics::counter!("distributed_lock_busy_total", "lock" => lock).increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = lock;
}

/// A hold lost while held (expired unrenewed, deleted, or `max_hold`).
pub(crate) fn lost(lock: &'static str) {
    #[cfg(feature = "metrics")]
    metrics::counter!("distributed_lock_lost_total", "lock" => lock).increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = lock;
}

/// A hold ended (released or dropped) `held` after it was acquired.
pub(crate) fn held(lock: &'static str, held: Duration) {
    #[cfg(feature = "metrics")]
    metrics::histogram!("distributed_lock_held_seconds", "lock" => lock).record(held.as_secs_f64());
    #[cfg(not(feature = "metrics"))]
    let _ = (lock, held);
}
