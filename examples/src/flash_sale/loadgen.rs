//! The crowd: concurrent buyers, round-robin over the instances.
//!
//! Every user wants one item. Some double-click (two requests at once, to
//! two instances); a buyer that gets 503 (lock busy) retries after a short
//! random pause. In-flight requests are capped by a semaphore.

use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use super::service::{ErrorBody, OrderRequest};

/// The shape of the load.
#[derive(Debug, Clone)]
pub struct LoadConfig {
    /// Distinct buyers.
    pub users: usize,
    /// Items on sale; each user picks one at random.
    pub items: Vec<String>,
    /// Share of users who send their order twice at the same time.
    pub double_rate: f64,
    /// Requests in flight at most.
    pub concurrency: usize,
    /// Retries of a request answered 503.
    pub retries: u32,
    /// Seed of the random choices (same seed, same crowd).
    pub seed: u64,
}

/// What one response said.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// 201.
    Created,
    /// 409 `sold_out`.
    SoldOut,
    /// 409 `already_bought`.
    AlreadyBought,
    /// 503 `lock_busy`.
    LockBusy,
    /// Any other status, or no response.
    Other,
}

/// Counts and latencies of one load run.
#[derive(Debug, Clone, Default)]
pub struct LoadResult {
    /// HTTP requests sent (retries included).
    pub requests: u64,
    /// 201 answers.
    pub created: u64,
    /// 409 `sold_out` answers.
    pub sold_out: u64,
    /// 409 `already_bought` answers.
    pub already_bought: u64,
    /// 503 `lock_busy` answers.
    pub lock_busy: u64,
    /// Anything else: other statuses, transport errors.
    pub other: u64,
    /// Latency of every request, sorted.
    pub latencies: Vec<Duration>,
    /// Wall time of the whole run.
    pub elapsed: Duration,
}

impl LoadResult {
    /// The latency below which `q` (0..=1) of the requests finished.
    pub fn percentile(&self, q: f64) -> Duration {
        if self.latencies.is_empty() {
            return Duration::ZERO;
        }
        let rank = (q * self.latencies.len() as f64).ceil() as usize;
        self.latencies[rank.clamp(1, self.latencies.len()) - 1]
    }
}

#[derive(Default)]
struct Counters {
    /// Orders whose last answer came back (a retried order counts once).
    finished: AtomicU64,
    /// Answers, retries included.
    done: AtomicU64,
    created: AtomicU64,
    sold_out: AtomicU64,
    already_bought: AtomicU64,
    lock_busy: AtomicU64,
    other: AtomicU64,
}

impl Counters {
    fn add(&self, outcome: Outcome) {
        self.done.fetch_add(1, Ordering::Relaxed);
        let c = match outcome {
            Outcome::Created => &self.created,
            Outcome::SoldOut => &self.sold_out,
            Outcome::AlreadyBought => &self.already_bought,
            Outcome::LockBusy => &self.lock_busy,
            Outcome::Other => &self.other,
        };
        c.fetch_add(1, Ordering::Relaxed);
    }

    fn line(&self, label: &str, planned: usize, started: Instant) -> String {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        format!(
            "  [{label}] {:>5}/{planned} orders  201:{:<5} 409 sold out:{:<5} 409 twice:{:<4} 503:{:<4} err:{:<3} {:.1} s",
            get(&self.finished),
            get(&self.created),
            get(&self.sold_out),
            get(&self.already_bought),
            get(&self.lock_busy),
            get(&self.other),
            started.elapsed().as_secs_f64()
        )
    }
}

/// Run the crowd against `targets` (base URLs like `http://127.0.0.1:3000`).
/// With `progress`, a live line on stderr (when stderr is a terminal).
pub async fn run(
    targets: &[String],
    config: &LoadConfig,
    label: &str,
    progress: bool,
) -> LoadResult {
    assert!(!targets.is_empty(), "no instance to send load to");
    assert!(!config.items.is_empty(), "no item on sale");
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(config.concurrency)
        .timeout(Duration::from_secs(60))
        .build()
        .expect("HTTP client");
    let mut rng = fastrand::Rng::with_seed(config.seed);
    // (user, item) per request "click"; double-clicks are adjacent so they
    // are in flight together.
    let mut clicks = Vec::with_capacity(config.users * 2);
    for u in 0..config.users {
        let user = format!("user-{u:05}");
        let item = config.items[rng.usize(..config.items.len())].clone();
        let n = if rng.f64() < config.double_rate { 2 } else { 1 };
        for _ in 0..n {
            clicks.push(OrderRequest {
                user: user.clone(),
                item: item.clone(),
            });
        }
    }
    let planned = clicks.len();
    let targets: Arc<[String]> = targets.into();
    let counters = Arc::new(Counters::default());
    let next = Arc::new(AtomicUsize::new(0));
    let permits = Arc::new(Semaphore::new(config.concurrency.max(1)));
    let started = Instant::now();

    let show = progress && std::io::stderr().is_terminal();
    // Join sets abort their tasks when dropped: a run cancelled (ctrl-c)
    // stops sending at once.
    let mut ticker = JoinSet::new();
    if show {
        let counters = counters.clone();
        let label = label.to_owned();
        ticker.spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(200)).await;
                let line = counters.line(&label, planned, started);
                let mut err = std::io::stderr().lock();
                let _ = write!(err, "\r{line}\x1b[K");
                let _ = err.flush();
            }
        });
    }

    let mut tasks = JoinSet::new();
    for (i, click) in clicks.into_iter().enumerate() {
        let http = http.clone();
        let targets = targets.clone();
        let counters = counters.clone();
        let next = next.clone();
        let permits = permits.clone();
        let retries = config.retries;
        let jitter_seed = config.seed ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        tasks.spawn(async move {
            let mut rng = fastrand::Rng::with_seed(jitter_seed);
            let mut latencies = Vec::new();
            for attempt in 0..=retries {
                let outcome = {
                    let _permit = permits.acquire().await.expect("semaphore closed");
                    let target = &targets[next.fetch_add(1, Ordering::Relaxed) % targets.len()];
                    let t0 = Instant::now();
                    let outcome = order(&http, target, &click).await;
                    latencies.push(t0.elapsed());
                    outcome
                };
                counters.add(outcome);
                if outcome != Outcome::LockBusy || attempt == retries {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50 + rng.u64(..150))).await;
            }
            counters.finished.fetch_add(1, Ordering::Relaxed);
            latencies
        });
    }
    let mut latencies = Vec::with_capacity(planned);
    while let Some(t) = tasks.join_next().await {
        latencies.extend(t.expect("buyer task panicked"));
    }
    let elapsed = started.elapsed();
    if show {
        ticker.abort_all();
        let line = counters.line(label, planned, started);
        eprintln!("\r{line}\x1b[K");
    }
    latencies.sort_unstable();
    let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
    LoadResult {
        requests: latencies.len() as u64,
        created: get(&counters.created),
        sold_out: get(&counters.sold_out),
        already_bought: get(&counters.already_bought),
        lock_busy: get(&counters.lock_busy),
        other: get(&counters.other),
        latencies,
        elapsed,
    }
}

async fn order(http: &reqwest::Client, target: &str, req: &OrderRequest) -> Outcome {
    let response = match http.post(format!("{target}/orders")).json(req).send().await {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!(%target, error = %e, "request failed");
            return Outcome::Other;
        }
    };
    let status = response.status().as_u16();
    // Read every body, so the connection goes back to the pool.
    let body = response.bytes().await.unwrap_or_default();
    if status == 201 {
        return Outcome::Created;
    }
    let code = serde_json::from_slice::<ErrorBody>(&body)
        .map(|b| b.error)
        .ok();
    match (status, code.as_deref()) {
        (409, Some("sold_out")) => Outcome::SoldOut,
        (409, Some("already_bought")) => Outcome::AlreadyBought,
        (503, Some("lock_busy")) => Outcome::LockBusy,
        _ => {
            tracing::warn!(%target, status, code = ?code, "unexpected answer");
            Outcome::Other
        }
    }
}
