//! One run of the sale: seed the stock, start the instances, send the
//! crowd, stop the instances, count what was really sold.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use lock_runtime::LockClient;

use super::loadgen::{self, LoadConfig};
use super::lock_figures;
use super::report::{PausedHolder, PhaseReport};
use super::service::{self, OrderRequest, Shop};
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
    /// One PostgreSQL database for the locks and the shop's tables; the
    /// instances are separate processes of `exe`.
    Postgres {
        /// `postgres://…`
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
            Backend::Postgres { url, .. } => format!(
                "PostgreSQL at {} (locks, stock and orders in one database), \
                 instances as separate processes",
                without_password(url)
            ),
            Backend::Memory(_) => "in-memory store and locks, instances in this process".into(),
        }
    }
}

/// `url` with its password, if any, left out (for the screen).
fn without_password(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    match rest[..authority_end].rsplit_once('@') {
        Some((userinfo, host)) => {
            let user = userinfo.split(':').next().unwrap_or_default();
            format!("{scheme}://{user}@{host}{}", &rest[authority_end..])
        }
        None => url.to_owned(),
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
    /// After the locked crowd (instances as processes: Redis or
    /// PostgreSQL): pause one instance with
    /// SIGSTOP past its lease just before its write, let another sell the
    /// unit meanwhile, and show the store refusing the stale write.
    pub paused_holder: bool,
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
        Backend::Redis { url, .. } | Backend::Postgres { url, .. } => Store::connect(url).await?,
        Backend::Memory(store) => store.clone(),
    };
    for item in &scenario.load.items {
        store.seed(item, scenario.stock).await?;
    }
    let mut figures = None;
    let mut paused = None;
    let load = match backend {
        Backend::Redis { url, exe } | Backend::Postgres { url, exe } => {
            let spec = InstanceSpec {
                exe: exe.clone(),
                url: url.clone(),
                locked,
                race_delay: scenario.race_delay,
                log: scenario.child_log.clone(),
                pause_first: false,
            };
            let instances = Instances::start(&spec, scenario.instances).await?;
            let load =
                loadgen::run(instances.urls(), &scenario.load, label, scenario.progress).await;
            if locked {
                figures = Some(lock_figures::read(instances.urls()).await);
            }
            instances.stop().await;
            if locked && scenario.paused_holder {
                paused = Some(paused_holder(&spec).await?);
            }
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
                    pause_before_write: false.into(),
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
    report.paused = paused;
    Ok(report)
}

/// The paused holder (see [`Scenario::paused_holder`]): two locked
/// instances and an item with one unit. The first instance takes the lock,
/// reads, and stops itself (SIGSTOP) just before its write; the second
/// waits for the lock until the paused holder's lease lapses, then sells
/// the unit; the first is resumed (SIGCONT). Its body is stopped before
/// the write (its lock is lost by the clock, `on_lost = "abort"`); a write
/// that got out all the same would carry the older token, which the store
/// refuses.
async fn paused_holder(spec: &InstanceSpec) -> Result<PausedHolder, Error> {
    const ITEM: &str = "paused-item";
    let store = Store::connect(&spec.url).await?;
    store.seed(ITEM, 1).await?;
    let spec = InstanceSpec {
        pause_first: true,
        ..spec.clone()
    };
    let instances = Instances::start(&spec, 2).await?;
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()?;
    let order = |base: &str, user: &str| {
        http.post(format!("{base}/orders")).json(&OrderRequest {
            user: user.to_owned(),
            item: ITEM.to_owned(),
        })
    };
    let paused_buyer = tokio::spawn(order(&instances.urls()[0], "paused-buyer").send());
    let pid = instances.pid(0);
    wait_until_stopped(pid, Duration::from_secs(30)).await?;
    // The second buyer waits (2 s a try) until the lease of the paused
    // holder lapses (10 s at most), then buys the unit.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let r = order(&instances.urls()[1], "second-buyer").send().await?;
        match r.status().as_u16() {
            201 => break,
            503 if std::time::Instant::now() < deadline => continue,
            status => return Err(format!("the second buyer got {status}").into()),
        }
    }
    resume(pid);
    let answer = paused_buyer.await??;
    tracing::info!(status = %answer.status(), "the paused buyer's answer");
    let audit = store
        .audit(ITEM)
        .await?
        .ok_or("the paused holder's item vanished")?;
    instances.stop().await;
    Ok(PausedHolder {
        stock: audit.initial,
        sold: audit.sold,
        refused: audit.stale_refused,
    })
}

/// Wait until process `pid` is stopped (SIGSTOP): its state in
/// `/proc/<pid>/stat` is `T`.
async fn wait_until_stopped(pid: u32, limit: Duration) -> Result<(), Error> {
    let deadline = std::time::Instant::now() + limit;
    loop {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        // `pid (comm) state …`: the state follows the last `)`.
        let state = stat
            .rsplit(')')
            .next()
            .and_then(|r| r.split_whitespace().next());
        if state == Some("T") {
            return Ok(());
        }
        if std::time::Instant::now() > deadline {
            return Err(format!("instance {pid} did not pause within {limit:?}").into());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn resume(pid: u32) {
    #[cfg(unix)]
    // SAFETY: a signal to the pid of a child we have not reaped.
    unsafe {
        libc::kill(pid as libc::pid_t, libc::SIGCONT);
    }
}

/// Sum of several items' audits.
pub fn total(audits: &[Audit]) -> Audit {
    audits.iter().fold(Audit::default(), |acc, a| Audit {
        initial: acc.initial + a.initial,
        stock_counter: acc.stock_counter + a.stock_counter,
        sold: acc.sold + a.sold,
        duplicate_buyers: acc.duplicate_buyers + a.duplicate_buyers,
        stale_refused: acc.stale_refused + a.stale_refused,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_screen_shows_no_password() {
        assert_eq!(
            without_password("postgres://app:s3cret@db:5432/shop?sslmode=require"),
            "postgres://app@db:5432/shop?sslmode=require"
        );
        assert_eq!(
            without_password("postgres://postgres@127.0.0.1:5432/postgres"),
            "postgres://postgres@127.0.0.1:5432/postgres"
        );
        assert_eq!(without_password("postgres://db/shop"), "postgres://db/shop");
    }
}
