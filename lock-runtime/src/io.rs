//! The client's own I/O thread.
//!
//! Connections, the watchdog, wake-ups and background releases live on a
//! small runtime that belongs to the client, not to whichever runtime created
//! it. A client made in one `#[tokio::test]` keeps working in the next, and
//! work handed to it (a release after a drop, an acquire whose caller went
//! away) runs to its end.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::runtime::Handle;
use tokio::sync::oneshot;

use crate::LockError;

pub(crate) struct Io {
    handle: Handle,
    stop: Option<oneshot::Sender<()>>,
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
        Ok(Io {
            handle,
            stop: Some(stop),
        })
    }

    pub(crate) fn handle(&self) -> &Handle {
        &self.handle
    }

    /// Run `fut` on the I/O runtime and wait for it from any runtime.
    pub(crate) async fn run<T: Send + 'static>(
        &self,
        fut: impl Future<Output = Result<T, LockError>> + Send + 'static,
    ) -> Result<T, LockError> {
        match self.handle.spawn(fut).await {
            Ok(out) => out,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(_) => Err(LockError::shutdown()),
        }
    }

    /// Poll `fut` in the caller's task with the I/O runtime as the current
    /// runtime: the caller's own threads do the work (no hop to the I/O
    /// thread and back), while whatever `fut` spawns or times (a reconnect,
    /// a timeout) lives on the I/O runtime, which outlives every caller.
    pub(crate) fn here<F: Future>(&self, fut: F) -> Here<'_, F> {
        Here {
            io: &self.handle,
            fut,
        }
    }

    /// Fire and forget.
    pub(crate) fn spawn(&self, fut: impl Future<Output = ()> + Send + 'static) {
        self.handle.spawn(fut);
    }
}

pin_project_lite::pin_project! {
    /// See [`Io::here`].
    pub(crate) struct Here<'a, F> {
        io: &'a Handle,
        #[pin]
        fut: F,
    }
}

impl<F: Future> Future for Here<'_, F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.project();
        let _rt = this.io.enter();
        this.fut.poll(cx)
    }
}

impl Drop for Io {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}
