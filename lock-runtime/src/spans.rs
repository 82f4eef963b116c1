//! Tracing spans whose level says what happened.
//!
//! A span's level is fixed when it is made, and whether a request will
//! wait, or a hold be lost, is known only later. So each span starts at
//! DEBUG, and the moment something worth INFO happens (a request starts to
//! wait, a hold is lost) an INFO span of the same name and fields takes
//! over, following from the first: the rest of the work runs in it. At
//! INFO, a trace then shows exactly the waits and the losses; at DEBUG,
//! every acquisition and hold.

use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tracing::field::{Empty, Value};
use tracing::Span;

/// A DEBUG span, and the INFO span that took over from it, if one did.
pub(crate) struct Phases {
    first: Span,
    then: Option<Span>,
    /// The request's mode (`key::Mode::label`) and wait, for the INFO span.
    mode: &'static str,
    wait: Duration,
}

impl Phases {
    fn new(first: Span) -> Self {
        Phases {
            first,
            then: None,
            mode: "",
            wait: Duration::ZERO,
        }
    }

    /// The span the work runs in now.
    fn current(&self) -> &Span {
        self.then.as_ref().unwrap_or(&self.first)
    }

    fn record(&self, field: &str, value: impl Value + Copy) {
        self.first.record(field, value);
        if let Some(then) = &self.then {
            then.record(field, value);
        }
    }

    /// From now on, `make()`'s INFO span (once).
    fn promote(&mut self, make: impl FnOnce() -> Span) {
        if self.then.is_none() {
            let then = make();
            then.follows_from(&self.first);
            self.then = Some(then);
        }
    }
}

/// The `lock.acquire` span of a request, at DEBUG.
pub(crate) fn acquire(key: &str, lock: &'static str, mode: &'static str, wait: Duration) -> Phases {
    let mut phases = Phases::new(tracing::debug_span!(
        "lock.acquire",
        key = %key,
        lock = %lock,
        mode = mode,
        wait_ms = wait.as_millis() as u64,
        outcome = Empty,
        fence = Empty,
    ));
    (phases.mode, phases.wait) = (mode, wait);
    phases
}

fn acquire_info(key: &str, lock: &'static str, mode: &'static str, wait: Duration) -> Span {
    tracing::info_span!(
        "lock.acquire",
        key = %key,
        lock = %lock,
        mode = mode,
        wait_ms = wait.as_millis() as u64,
        outcome = Empty,
        fence = Empty,
    )
}

tokio::task_local! {
    /// The spans of the request being acquired in this task.
    static ACQUIRE: RefCell<Phases>;
}

/// Run a request's acquisition in its `lock.acquire` span(s). (Not an
/// `async fn`, which would hold `fut` twice.)
pub(crate) fn acquiring<F: Future>(phases: Phases, fut: F) -> impl Future<Output = F::Output> {
    ACQUIRE.scope(RefCell::new(phases), InCurrent { fut })
}

/// The request being acquired starts to wait: INFO from here on.
pub(crate) fn waiting(key: &str, lock: &'static str, wait: Duration) {
    let _ = ACQUIRE.try_with(|p| {
        let mut p = p.borrow_mut();
        let mode = p.mode;
        p.promote(|| acquire_info(key, lock, mode, wait))
    });
}

/// Record the request's outcome on its span(s); `notable` (a loss)
/// promotes the span if it was not yet.
pub(crate) fn acquired(
    key: &str,
    lock: &'static str,
    outcome: &'static str,
    fence: Option<u64>,
    notable: bool,
) {
    let _ = ACQUIRE.try_with(|p| {
        let mut p = p.borrow_mut();
        if notable {
            let (mode, wait) = (p.mode, p.wait);
            p.promote(|| acquire_info(key, lock, mode, wait));
        }
        p.record("outcome", outcome);
        if let Some(fence) = fence {
            p.record("fence", fence);
        }
    });
}

pin_project_lite::pin_project! {
    /// Polls `fut` inside the current span of the task-local phases.
    struct InCurrent<F> {
        #[pin]
        fut: F,
    }
}

impl<F: Future> Future for InCurrent<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.project();
        let span = ACQUIRE
            .try_with(|p| p.borrow().current().clone())
            .unwrap_or_else(|_| Span::none());
        let _entered = span.enter();
        this.fut.poll(cx)
    }
}

/// The `lock.hold` span of a body, at DEBUG.
pub(crate) fn hold(key: &str, lock: &'static str, fence: u64) -> Phases {
    Phases::new(tracing::debug_span!(
        "lock.hold",
        key = %key,
        lock = %lock,
        fence,
        lost = Empty,
    ))
}

pin_project_lite::pin_project! {
    /// A body polled in its `lock.hold` span, which [`Held::lost`]
    /// promotes to INFO.
    pub(crate) struct Held<F> {
        #[pin]
        fut: F,
        phases: Phases,
    }
}

impl<F> Held<F> {
    pub(crate) fn new(fut: F, phases: Phases) -> Self {
        Held { fut, phases }
    }

    /// The lock was lost: the rest of the body (if it goes on) runs in an
    /// INFO `lock.hold` span, `lost = true`.
    pub(crate) fn lost(self: Pin<&mut Self>, key: &str, lock: &'static str, fence: u64) {
        let phases = self.project().phases;
        phases.promote(|| {
            tracing::info_span!(
                "lock.hold",
                key = %key,
                lock = %lock,
                fence,
                lost = Empty,
            )
        });
        phases.record("lost", true);
    }

    /// Run `f` inside the body's current span.
    pub(crate) fn in_span<T>(self: Pin<&mut Self>, f: impl FnOnce() -> T) -> T {
        self.project().phases.current().in_scope(f)
    }
}

impl<F: Future> Future for Held<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.project();
        let _entered = this.phases.current().enter();
        this.fut.poll(cx)
    }
}
