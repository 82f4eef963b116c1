//! Where a client's work runs.
//!
//! What must outlive a caller (the watchdog, background releases, the
//! undo of an attempt whose caller went away, orphan-grant timers,
//! Sentinel's refresher, subscriptions) lives on a small runtime that
//! belongs to the client, not to whichever runtime created it. A client
//! made in one `#[tokio::test]` keeps working in the next, and work handed
//! to it runs to its end.
//!
//! A caller's own operations run in the caller's task ([`Io::here`]), and
//! on one Redis (or Sentinel's primary, or each Redlock node) they go over a
//! connection of the caller's runtime, driven by that runtime: the reply
//! wakes the caller on its own thread. [`Route`] tells the backend, while
//! an operation is polled, whose connection to use.
//!
//! The in-memory client has no connections: its work runs on the caller's
//! runtime, with that runtime's clock, so `tokio::time::pause()` and
//! `advance` drive its leases, waits and renewals. Work handed to a runtime
//! that is shutting down (the previous `#[tokio::test]`'s) moves to one
//! process-wide fallback thread, as does work spawned outside any runtime.

use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::sync::LazyLock;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::runtime::{Handle, Id, RuntimeFlavor};
use tokio::sync::oneshot;

use crate::LockError;

pub(crate) enum Io {
    /// A runtime on a thread of the client's own.
    Own {
        handle: Handle,
        stop: Option<oneshot::Sender<()>>,
    },
    /// The runtime of whoever calls (the in-memory client).
    Caller,
}

impl Io {
    pub(crate) fn start() -> Result<Io, LockError> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| LockError::other(format!("cannot build the lock I/O runtime: {e}")))?;
        let handle = rt.handle().clone();
        let (stop, stopped) = oneshot::channel::<()>();
        std::thread::Builder::new()
            .name("lock-runtime-io".into())
            .spawn(move || {
                rt.block_on(async {
                    let _ = stopped.await;
                });
                // Background releases hold the client, so by now none is
                // pending; what is left (idle connections) just stops.
                rt.shutdown_background();
            })
            .map_err(|e| LockError::other(format!("cannot start the lock I/O thread: {e}")))?;
        Ok(Io::Own {
            handle,
            stop: Some(stop),
        })
    }

    /// Background work on the caller's runtime (the in-memory client).
    pub(crate) fn caller() -> Io {
        Io::Caller
    }

    /// The runtime background work goes to now.
    pub(crate) fn handle(&self) -> Handle {
        match self {
            Io::Own { handle, .. } => handle.clone(),
            Io::Caller => Handle::try_current().unwrap_or_else(|_| fallback().clone()),
        }
    }

    /// Whether work runs on the caller's runtime.
    pub(crate) fn is_caller(&self) -> bool {
        matches!(self, Io::Caller)
    }

    /// Run `fut` on the I/O runtime and wait for it from any runtime.
    pub(crate) async fn run<T: Send + 'static>(
        &self,
        fut: impl Future<Output = Result<T, LockError>> + Send + 'static,
    ) -> Result<T, LockError> {
        let Io::Own { handle, .. } = self else {
            return fut.await;
        };
        match handle.spawn(fut).await {
            Ok(out) => out,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(_) => Err(LockError::shutdown()),
        }
    }

    /// Poll `fut` in the caller's task with the I/O runtime as the current
    /// runtime: the caller's own threads do the work, while whatever `fut`
    /// spawns or times (a connection to a new primary, a subscription, a
    /// timeout) lives on the I/O runtime, which outlives every caller. The
    /// caller's runtime, taken before the I/O runtime is entered, is the
    /// [`Route`] its commands take.
    pub(crate) fn here<F: Future>(&self, fut: F) -> Here<'_, F> {
        Here {
            io: match self {
                Io::Own { handle, .. } => Some(handle),
                Io::Caller => None,
            },
            route: None,
            started: false,
            fut,
        }
    }

    /// The runtime this code runs on, unless it is the I/O runtime (or
    /// there is none, or the client has no runtime of its own): what an
    /// operation sent from here goes over, and so what its undo must
    /// follow.
    pub(crate) fn caller_runtime(&self) -> Option<Id> {
        let Io::Own { handle, .. } = self else {
            return None;
        };
        caller_of(handle).map(|h| h.id())
    }

    /// Fire and forget `fut`, which takes back what a task of runtime
    /// `from` sent (see [`Route::Behind`]).
    pub(crate) fn spawn_behind(
        &self,
        from: Option<Id>,
        fut: impl Future<Output = ()> + Send + 'static,
    ) {
        self.spawn(Routed {
            route: from.map(Route::Behind),
            fut,
        });
    }

    /// Fire and forget.
    pub(crate) fn spawn(&self, fut: impl Future<Output = ()> + Send + 'static) {
        match self {
            Io::Own { handle, .. } => {
                handle.spawn(fut);
            }
            Io::Caller => spawn_here(fut),
        }
    }

    /// A timer on the clock of the runtime that background work uses,
    /// usable from any runtime.
    pub(crate) fn sleep(&self, d: Duration) -> tokio::time::Sleep {
        match self {
            Io::Own { handle, .. } => {
                let _rt = handle.enter();
                tokio::time::sleep(d)
            }
            Io::Caller if Handle::try_current().is_ok() => tokio::time::sleep(d),
            Io::Caller => {
                let _rt = fallback().enter();
                tokio::time::sleep(d)
            }
        }
    }
}

/// The thread that takes the in-memory client's background work when no
/// runtime is there to run it. Started on first use, for the process.
fn fallback() -> &'static Handle {
    static FALLBACK: LazyLock<Handle> = LazyLock::new(|| {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("cannot build the lock fallback runtime");
        let handle = rt.handle().clone();
        std::thread::Builder::new()
            .name(FALLBACK_THREAD.into())
            .spawn(move || rt.block_on(std::future::pending::<()>()))
            .expect("cannot start the lock fallback thread");
        handle
    });
    &FALLBACK
}

const FALLBACK_THREAD: &str = "lock-runtime-fallback";

/// Whether this code runs on the fallback thread.
pub(crate) fn on_fallback() -> bool {
    std::thread::current().name() == Some(FALLBACK_THREAD)
}

/// Spawn on the current runtime; if there is none, or it is shutting down
/// and drops the task before its first poll, on the fallback thread.
fn spawn_here(fut: impl Future<Output = ()> + Send + 'static) {
    let task = Rescued {
        fut: Some(Box::pin(fut)),
        started: false,
    };
    match Handle::try_current() {
        Ok(handle) => {
            handle.spawn(task);
        }
        Err(_) => {
            fallback().spawn(task);
        }
    }
}

type Task = Pin<Box<dyn Future<Output = ()> + Send>>;

/// A task that, dropped before it was first polled (its runtime shut
/// down), moves to the fallback thread instead of vanishing: a background
/// release must not be lost with the test runtime that spawned it. Once
/// polled, its timers belong to its runtime, and it is not moved.
struct Rescued {
    fut: Option<Task>,
    started: bool,
}

impl Future for Rescued {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        self.started = true;
        let Some(fut) = self.fut.as_mut() else {
            return Poll::Ready(());
        };
        let out = fut.as_mut().poll(cx);
        if out.is_ready() {
            self.fut = None;
        }
        out
    }
}

impl Drop for Rescued {
    fn drop(&mut self) {
        if let (Some(fut), false) = (self.fut.take(), self.started) {
            fallback().spawn(fut);
        }
    }
}

/// Which connection the commands of an operation go over, while it is
/// polled (see [`route`]).
pub(crate) enum Route {
    /// Sent from a task of this runtime: over the connection this runtime
    /// drives, opened on first use.
    Caller(Handle),
    /// Taking back what a task of the runtime with this id sent: behind
    /// it, on the same connection, or once that connection can carry
    /// nothing more (see `backend/runtimes.rs`).
    Behind(Id),
}

/// The runtime whose connection a caller here is best served by: its own,
/// if its replies can wake it on its own thread, which is so on a
/// current-thread runtime and in a task of a multi-thread one. A future
/// that a multi-thread runtime's `block_on` polls is off that runtime's
/// worker threads: any reply crosses threads to reach it, and the I/O
/// thread's connection (`None`), on a thread of its own, serves it sooner.
fn caller_of(io: &Handle) -> Option<Handle> {
    let here = Handle::try_current().ok()?;
    let driven_here = match here.runtime_flavor() {
        RuntimeFlavor::CurrentThread => true,
        _ => tokio::task::try_id().is_some(),
    };
    (driven_here && here.id() != io.id()).then_some(here)
}

thread_local! {
    /// The route of the operation being polled on this thread.
    static ROUTE: Cell<Option<Route>> = const { Cell::new(None) };
}

/// Look at the route of the operation being polled (`None`: background
/// work, or a caller outside any runtime: the I/O runtime's connection).
pub(crate) fn route<T>(f: impl FnOnce(Option<&Route>) -> T) -> T {
    ROUTE.with(|cell| {
        let route = cell.take();
        let out = f(route.as_ref());
        cell.set(route);
        out
    })
}

/// Put `route` in place while `poll` runs, and take it back after.
fn polled_with<T>(route: &mut Option<Route>, poll: impl FnOnce() -> T) -> T {
    /// Puts the outer route back also when `poll` panics.
    struct Back<'a> {
        route: &'a mut Option<Route>,
        outer: Option<Route>,
    }
    impl Drop for Back<'_> {
        fn drop(&mut self) {
            *self.route = ROUTE.with(|cell| cell.replace(self.outer.take()));
        }
    }
    let outer = ROUTE.with(|cell| cell.replace(route.take()));
    let _back = Back { route, outer };
    poll()
}

pin_project_lite::pin_project! {
    /// See [`Io::here`].
    pub(crate) struct Here<'a, F> {
        io: Option<&'a Handle>,
        route: Option<Route>,
        started: bool,
        #[pin]
        fut: F,
    }
}

impl<F: Future> Future for Here<'_, F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.project();
        let Some(io) = *this.io else {
            return this.fut.poll(cx);
        };
        if !*this.started {
            // Before the I/O runtime is entered: the caller's own.
            *this.started = true;
            *this.route = caller_of(io).map(Route::Caller);
        }
        let _rt = io.enter();
        let fut = this.fut;
        polled_with(this.route, || fut.poll(cx))
    }
}

pin_project_lite::pin_project! {
    /// A future polled with a [`Route`] in place.
    struct Routed<F> {
        route: Option<Route>,
        #[pin]
        fut: F,
    }
}

impl<F: Future> Future for Routed<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.project();
        let fut = this.fut;
        polled_with(this.route, || fut.poll(cx))
    }
}

impl Drop for Io {
    fn drop(&mut self) {
        if let Io::Own { stop, .. } = self {
            if let Some(stop) = stop.take() {
                let _ = stop.send(());
            }
        }
    }
}

/// The protocol's decisions (`protocol/`) run on tokio's clock here: paused
/// and advanced with it in tests, as every timer of the client is.
impl crate::protocol::Moment for tokio::time::Instant {
    fn checked_after(self, d: Duration) -> Option<Self> {
        self.checked_add(d)
    }

    fn since(self, earlier: Self) -> Duration {
        self.saturating_duration_since(earlier)
    }
}
