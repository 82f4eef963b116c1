//! Lock figures for the `metrics` facade (cargo feature `metrics`). Every
//! series carries the label `lock`: the attribute's key template or the
//! name given by hand, never the formatted key. Without the feature these
//! are empty and cost nothing.

use std::time::Duration;

/// A fresh acquisition (not a reentry), `waited` after it was asked for.
pub(crate) fn acquired(lock: &str, waited: Duration) {
    #[cfg(feature = "metrics")]
    {
        let label = [("lock", lock.to_owned())];
        metrics::counter!("distributed_lock_acquired_total", &label).increment(1);
        metrics::histogram!("distributed_lock_acquire_seconds", &label)
            .record(waited.as_secs_f64());
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (lock, waited);
}

/// A request that gave up busy: `Timeout`, or skipped
/// (`on_busy = "skip"`, `try_acquire` returning `None`).
pub(crate) fn busy(lock: &str) {
    #[cfg(feature = "metrics")]
    metrics::counter!("distributed_lock_busy_total", "lock" => lock.to_owned()).increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = lock;
}

/// A hold lost while held (expired unrenewed, deleted, or `max_hold`).
pub(crate) fn lost(lock: &str) {
    #[cfg(feature = "metrics")]
    metrics::counter!("distributed_lock_lost_total", "lock" => lock.to_owned()).increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = lock;
}

/// A hold ended (released or dropped) `held` after it was acquired.
pub(crate) fn held(lock: &str, held: Duration) {
    #[cfg(feature = "metrics")]
    metrics::histogram!("distributed_lock_held_seconds", "lock" => lock.to_owned())
        .record(held.as_secs_f64());
    #[cfg(not(feature = "metrics"))]
    let _ = (lock, held);
}
