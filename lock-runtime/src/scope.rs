//! The holder identity of an annotated call chain.
//!
//! The outermost `#[distributed_lock]` call opens a task-local scope with a
//! fresh holder id; nested calls awaited in the same task find it and
//! re-enter. A spawned task starts without a scope, so it is a different
//! holder. Task-locals work the same under `block_on`, `#[tokio::main]`,
//! `#[tokio::test]` and in spawned tasks.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

tokio::task_local! {
    static SCOPE: Arc<Scope>;
}

/// Process-wide so that holder ids never repeat within one client id.
static NEXT_HOLDER: AtomicU64 = AtomicU64::new(1);

pub(crate) fn next_holder() -> u64 {
    NEXT_HOLDER.fetch_add(1, Ordering::Relaxed)
}

pub(crate) struct Scope {
    pub(crate) holder: u64,
    /// Locks taken in this scope, innermost last: (guard id, lock hash, fence).
    held: Mutex<Vec<(u64, Arc<str>, u64)>>,
}

impl Scope {
    pub(crate) fn push(&self, guard: u64, hash: Arc<str>, fence: u64) {
        self.held.lock().unwrap().push((guard, hash, fence));
    }

    pub(crate) fn pop(&self, guard: u64) {
        let mut held = self.held.lock().unwrap();
        if let Some(i) = held.iter().rposition(|(g, _, _)| *g == guard) {
            held.remove(i);
        }
    }

    pub(crate) fn holds(&self, hash: &str) -> bool {
        self.held
            .lock()
            .unwrap()
            .iter()
            .any(|(_, h, _)| &**h == hash)
    }

    fn innermost_fence(&self) -> Option<u64> {
        self.held.lock().unwrap().last().map(|(_, _, f)| *f)
    }
}

/// The scope of the annotated call this task is in, if any.
pub(crate) fn current() -> Option<Arc<Scope>> {
    SCOPE.try_with(Arc::clone).ok()
}

/// Run `fut` as a new holder.
pub(crate) async fn enter<F: Future>(fut: F) -> F::Output {
    let scope = Arc::new(Scope {
        holder: next_holder(),
        held: Mutex::new(Vec::new()),
    });
    SCOPE.scope(scope, fut).await
}

/// The fencing token of the innermost lock this task holds through an
/// annotated call, or `None` outside one.
///
/// Pass it to the resource you protect (see the crate docs on fencing) so a
/// holder that was paused past its lease cannot overwrite newer work.
pub fn current_fence() -> Option<u64> {
    current().and_then(|s| s.innermost_fence())
}
