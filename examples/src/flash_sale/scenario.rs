//! One run of the sale: seed the stock, start the instances, send the
//! crowd, stop the instances, count what was really sold.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use lock_runtime::LockClient;

use super::loadgen::{self, LoadConfig};
use super::lock_figures;
use super::report::PhaseReport;
use super::service::{self, Shop};
use super::spawn::{InstanceSpec, Instances};
use super::store::{Audit, Store};

/// Any error of a run, with a message for people.
pub type Error = Box<dyn std::error::Error + Send + Sync>;

/// Where the shop's data and locks live.
#[derive(Clone)]
pub enum Backend {
    /// One Redis; the instances are separate processes of `exe`.
    Redis {
        /// `redis://…`
        url: String,
        /// The `flash-sale` binary, run as `serve`.
        exe: PathBuf,
    },
    /// In this process: in-memory store and locks, the instances are axum
    /// servers on tasks of this process.
    Memory(Store),
}

impl Backend {
    /// For the report header.
    pub fn describe(&self) -> String {
        match self {
            Backend::Redis { url, .. } => {
                format!("Redis at {url}, instances as separate processes")
            }
            Backend::Memory(_) => "in-memory store and locks, instances in this process".into(),
        }
    }
}

/// What to run.
#[derive(Debug, Clone)]
pub struct Scenario {
    /// Service instances.
    pub instances: usize,
    /// Units of each item on sale.
    pub stock: i64,
    /// Pause between read and write in the order handler.
    pub race_delay: Duration,
    /// The crowd (its `items` are the items seeded).
    pub load: LoadConfig,
    /// Live progress line on stderr.
    pub progress: bool,
    /// `RUST_LOG` of instance processes when none is set.
    pub child_log: String,
}

/// `item-1`, `item-2`, …
pub fn item_names(n: usize) -> Vec<String> {
    (1..=n).map(|i| format!("item-{i}")).collect()
}

/// Run the scenario once, with or without the lock.
pub async fn run_phase(
    backend: &Backend,
    scenario: &Scenario,
    locked: bool,
) -> Result<PhaseReport, Error> {
    let label = if locked { "locked" } else { "unsafe" };
    let store = match backend {
        Backend::Redis { url, .. } => Store::connect(url).await?,
        Backend::Memory(store) => store.clone(),
    };
    for item in &scenario.load.items {
        store.seed(item, scenario.stock).await?;
    }
    let mut figures = None;
    let load = match backend {
        Backend::Redis { url, exe } => {
            let spec = InstanceSpec {
                exe: exe.clone(),
                redis_url: url.clone(),
                locked,
                race_delay: scenario.race_delay,
                log: scenario.child_log.clone(),
            };
            let instances = Instances::start(&spec, scenario.instances).await?;
            let load =
                loadgen::run(instances.urls(), &scenario.load, label, scenario.progress).await;
            if locked {
                figures = Some(lock_figures::read(instances.urls()).await);
            }
            instances.stop().await;
            load
        }
        Backend::Memory(store) => {
            if locked && lock_runtime::client().is_err() {
                // Another caller may have won the race to init; either way
                // there is a global client afterwards.
                let _ = lock_runtime::init(LockClient::memory());
            }
            let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
            let mut urls = Vec::new();
            let mut servers = Vec::new();
            for i in 1..=scenario.instances {
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
                urls.push(format!("http://{}", listener.local_addr()?));
                let shop = Arc::new(Shop {
                    metrics: super::lock_figures::recorder(),
                    store: store.clone(),
                    instance: format!("flash-{i}"),
                    locked,
                    race_delay: scenario.race_delay,
                });
                let mut stop = stop_rx.clone();
                servers.push(tokio::spawn(service::serve(listener, shop, async move {
                    let _ = stop.wait_for(|s| *s).await;
                })));
            }
            let load = loadgen::run(&urls, &scenario.load, label, scenario.progress).await;
            if locked {
                // One process, one recorder: every instance shows the same.
                figures = Some(lock_figures::read(&urls[..1]).await);
            }
            let _ = stop_tx.send(true);
            for s in servers {
                s.await??;
            }
            load
        }
    };
    let mut audits = Vec::new();
    for item in &scenario.load.items {
        let audit = store
            .audit(item)
            .await?
            .ok_or_else(|| format!("item {item} vanished from the store"))?;
        audits.push(audit);
    }
    let mut report = PhaseReport::new(label, locked, &audits, load);
    report.lock = figures;
    Ok(report)
}

/// Sum of several items' audits.
pub fn total(audits: &[Audit]) -> Audit {
    audits.iter().fold(Audit::default(), |acc, a| Audit {
        initial: acc.initial + a.initial,
        stock_counter: acc.stock_counter + a.stock_counter,
        sold: acc.sold + a.sold,
        duplicate_buyers: acc.duplicate_buyers + a.duplicate_buyers,
    })
}
