//! A rate-limited call to a slow upstream: the payment provider allows a
//! merchant account at most [`LIMIT`] calls in flight and refuses any
//! above that (HTTP 429). Several instances of the shop call it at once;
//! a semaphore of [`LIMIT`] permits on the account keeps them, together,
//! within the limit — a request waits for a permit instead of being
//! refused.
//!
//! The binary (`src/bin/rate-limit.rs`) and the test
//! (`tests/rate_limit.rs`) share this copy.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use lock_runtime::{distributed_lock, LockClient, LockError};

/// The provider's limit of calls in flight per merchant account (the
/// `permits` of [`charge_limited`]).
pub const LIMIT: usize = 4;

/// The payment provider, in process: each call takes `latency`, and a call
/// that finds [`LIMIT`] others in flight is refused. It counts what it
/// saw.
#[derive(Debug, Default)]
pub struct Provider {
    latency: Duration,
    in_flight: AtomicUsize,
    most_in_flight: AtomicUsize,
    served: AtomicUsize,
    refused: AtomicUsize,
}

/// What a charge can end in.
#[derive(Debug)]
pub enum PayError {
    /// 429 from the provider: too many calls in flight.
    Refused,
    /// No permit within the wait (or Redis failed).
    Lock(LockError),
}

impl From<LockError> for PayError {
    fn from(e: LockError) -> Self {
        PayError::Lock(e)
    }
}

impl Provider {
    pub fn new(latency: Duration) -> Self {
        Provider {
            latency,
            ..Provider::default()
        }
    }

    /// One call to the provider: the charge's id, or a refusal.
    pub async fn charge(&self, order: u64) -> Result<u64, PayError> {
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.most_in_flight.fetch_max(now, Ordering::SeqCst);
        // A refusal comes back as slowly as a charge (the provider is
        // slow either way), and the call counts as in flight until then.
        tokio::time::sleep(self.latency).await;
        let out = if now > LIMIT {
            self.refused.fetch_add(1, Ordering::SeqCst);
            Err(PayError::Refused)
        } else {
            self.served.fetch_add(1, Ordering::SeqCst);
            Ok(order)
        };
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        out
    }
}

/// One instance of the shop: its own lock client, the shared provider.
#[derive(Clone)]
pub struct Instance {
    pub locks: LockClient,
    pub provider: Arc<Provider>,
}

/// A charge under one of the account's 4 permits (= [`LIMIT`]; `permits`
/// is a literal, checked at compile time): at most 4 calls in flight
/// across every instance, the others wait in line for a permit.
#[distributed_lock(key = "payments:{merchant}", permits = 4, lease = "10s", wait = "30s", client = app.locks)]
pub async fn charge_limited(app: &Instance, merchant: &str, order: u64) -> Result<u64, PayError> {
    app.provider.charge(order).await
}

/// The same call without the semaphore.
pub async fn charge_unlimited(app: &Instance, order: u64) -> Result<u64, PayError> {
    app.provider.charge(order).await
}

/// What a run saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Report {
    pub calls: usize,
    pub served: usize,
    pub refused: usize,
    /// The most calls the provider had in flight at once.
    pub most_in_flight: usize,
}

/// `calls` charges for one merchant, all started at once, spread over one
/// instance per client; with or without the semaphore.
pub async fn run(
    clients: &[LockClient],
    calls: usize,
    latency: Duration,
    limited: bool,
) -> Result<Report, LockError> {
    let provider = Arc::new(Provider::new(latency));
    let mut tasks = Vec::new();
    for order in 0..calls {
        let app = Instance {
            locks: clients[order % clients.len()].clone(),
            provider: provider.clone(),
        };
        tasks.push(tokio::spawn(async move {
            if limited {
                charge_limited(&app, "acme", order as u64).await
            } else {
                charge_unlimited(&app, order as u64).await
            }
        }));
    }
    for t in tasks {
        match t.await.expect("a charge panicked") {
            Ok(_) | Err(PayError::Refused) => {}
            Err(PayError::Lock(e)) => return Err(e),
        }
    }
    Ok(Report {
        calls,
        served: provider.served.load(Ordering::SeqCst),
        refused: provider.refused.load(Ordering::SeqCst),
        most_in_flight: provider.most_in_flight.load(Ordering::SeqCst),
    })
}
