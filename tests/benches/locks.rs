//! Side-by-side lock benchmarks: the Redis floor, our runtime (manual API and
//! attribute, fenced and unfenced), `rslock` and redis-py's `Lock`, all
//! against `redis-server`s this bench starts itself, all in one run; and what
//! a lock costs the server and the client (cases 9 to 11), on the main
//! server (`LOCK_TEST_SERVER`, default `redis-server`) and on one of the
//! other kind (`valkey-server` next to Redis) started in the same run.
//!
//! ```sh
//! scripts/bench.sh                         # installs redis + redis-py, then:
//! cargo bench -p tests --bench locks       # prints the tables, writes docs/BENCHMARKS.md
//! LOCKBENCH_QUICK=1 cargo bench -p tests --bench locks   # a short smoke run (not written to docs)
//! LOCKBENCH_ONLY=9,10 cargo bench -p tests --bench locks # some cases only (not written to docs)
//! ```
//!
//! The unfenced rows (`client.lock(k).fence(false)`) switch on in
//! `locks/unfenced.rs`.
//!
//! Every result is reported next to a baseline measured in the same run:
//! the machine is shared and noisy, absolute numbers mean little.

#[path = "locks/captured.rs"]
mod captured;
#[path = "locks/command_costs.rs"]
mod command_costs;
#[path = "locks/cost.rs"]
mod cost;
#[path = "locks/deployments.rs"]
mod deployments;
#[path = "locks/fenced_floors.rs"]
mod fenced_floors;
#[path = "locks/grant_tap.rs"]
mod grant_tap;
#[path = "locks/handoff.rs"]
mod handoff;
#[path = "locks/handoff_segments.rs"]
mod handoff_segments;
#[path = "locks/latency.rs"]
mod latency;
#[path = "locks/memory.rs"]
mod memory;
#[path = "locks/monitor.rs"]
mod monitor;
#[path = "locks/placements.rs"]
mod placements;
#[path = "locks/proxy.rs"]
mod proxy;
#[path = "locks/python.rs"]
mod python;
#[path = "locks/read_heavy.rs"]
mod read_heavy;
#[path = "locks/redlock.rs"]
mod redlock;
#[path = "locks/report.rs"]
mod report;
#[path = "locks/scale.rs"]
mod scale;
#[path = "locks/script_costs.rs"]
mod script_costs;
#[path = "locks/servers.rs"]
mod servers;
#[path = "locks/stats.rs"]
mod stats;
#[path = "locks/throughput.rs"]
mod throughput;
#[path = "locks/unfenced.rs"]
mod unfenced;
#[path = "locks/watchdog.rs"]
mod watchdog;

use std::time::{Duration, Instant};

use lock_runtime::LockClient;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use tests::RedisServer;

#[global_allocator]
static ALLOC: stats::Counting = stats::Counting;

/// What every case needs.
pub struct Ctx {
    pub rt: tokio::runtime::Runtime,
    pub workers: usize,
    pub server: RedisServer,
    /// A server of the other kind (Valkey next to Redis), or why not.
    pub other: Result<servers::OtherServer, String>,
    /// Our client on `server`; also the global client the attribute uses.
    pub ours: LockClient,
    pub rslock: rslock::LockManager,
    pub py: Option<python::Python>,
    pub quick: bool,
    pub only: Option<Vec<u32>>,
    /// What our client sends to take a free lock (`EVALSHA` of the
    /// acquire script), replayed on fresh keys as the floor.
    pub acquire: captured::Captured,
}

impl Ctx {
    /// How the runtime configures its own `ConnectionManager`s.
    pub fn floor_conn_config(&self) -> ConnectionManagerConfig {
        ConnectionManagerConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(2)))
            .set_response_timeout(Some(Duration::from_secs(2)))
            .set_number_of_retries(2)
    }

    /// A `ConnectionManager` set up as the runtime sets up its own.
    pub async fn floor_conn(&self, port: u16) -> ConnectionManager {
        let client = redis::Client::open(format!("redis://127.0.0.1:{port}")).expect("url");
        ConnectionManager::new_with_config(client, self.floor_conn_config())
            .await
            .expect("floor connection")
    }

    /// Whether to run case `n` (`LOCKBENCH_ONLY=4,6` runs only those).
    pub fn wants(&self, n: u32) -> bool {
        match &self.only {
            Some(o) => o.contains(&n),
            None => true,
        }
    }
}

fn main() {
    let quick = std::env::var_os("LOCKBENCH_QUICK").is_some_and(|v| v != "0");
    let started = Instant::now();
    let date = report::now_utc();
    let py = python::Python::detect();
    println!(
        "# lock benchmarks{}\n",
        if quick { " (quick run)" } else { "" }
    );

    let workers = std::thread::available_parallelism().map_or(2, |n| n.get());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let server = RedisServer::start();
    let other = servers::OtherServer::start();
    let ours = rt
        .block_on(LockClient::connect(&server.url()))
        .expect("connect our client");
    let acquire = captured::Captured::acquire(&rt, &ours, server.port())
        .expect("capture our client's acquire with MONITOR");
    lock_runtime::init(ours.clone()).expect("init the global client");
    let rslock = rslock::LockManager::new(vec![server.url()]);
    let machine = report::machine(
        py.as_ref().map(|p| p.describe.as_str()),
        &match &other {
            Ok(o) => format!(
                "{} (`{}`, cases 9 and 10)",
                o.describe,
                servers::other_binary()
            ),
            Err(e) => format!("not available: {e}"),
        },
    );
    println!("{machine}");
    let ctx = Ctx {
        rt,
        workers,
        server,
        other,
        ours,
        rslock,
        py,
        quick,
        only: std::env::var("LOCKBENCH_ONLY")
            .ok()
            .map(|s| s.split(',').filter_map(|x| x.trim().parse().ok()).collect()),
        acquire,
    };

    let mut report = report::Report::default();
    let step = |name: &str| eprintln!("[{:>5.1} s] {name}", started.elapsed().as_secs_f64());
    if ctx.wants(1) || ctx.wants(2) {
        step("cases 1 and 2: floor and uncontended latency");
        latency::run(&ctx, &mut report);
        if ctx.wants(2) {
            placements::run(&ctx, &mut report);
        }
    }
    if ctx.wants(3) {
        step("case 3: throughput");
        throughput::run(&ctx, &mut report);
    }
    if ctx.wants(4) {
        step("case 4: contended hand-off");
        handoff::run(&ctx, &mut report);
    }
    if ctx.wants(5) {
        step("case 5: Redlock");
        redlock::run(&ctx, &mut report);
    }
    if ctx.wants(6) {
        step("case 6: watchdog scale");
        watchdog::run(&ctx, &mut report);
    }
    if ctx.wants(7) {
        step("case 7: acquire latency by deployment");
        deployments::run(&ctx, &mut report);
    }
    if ctx.wants(8) {
        step("case 8: read-heavy, one hot key");
        read_heavy::run(&ctx, &mut report);
    }
    if ctx.wants(9) {
        step("case 9: server and client CPU per lock, Redis and Valkey");
        cost::run(&ctx, &mut report);
    }
    if ctx.wants(10) {
        step("case 10: server memory per distinct lock name");
        memory::run(&ctx, &mut report);
    }
    if ctx.wants(11) {
        step("case 11: each script per call against the floor");
        script_costs::run(&ctx, &mut report);
    }
    if ctx.wants(12) {
        step("case 12: throughput at scale, 1,000 keys and 10 clients");
        scale::run(&ctx, &mut report);
    }
    step("done");

    let run = format!(
        "Run: {date}, {:.0} s{}. Command: `scripts/bench.sh` (or `cargo bench -p tests --bench locks`).",
        started.elapsed().as_secs_f64(),
        if quick { " (LOCKBENCH_QUICK)" } else { "" }
    );
    println!("## Targets\n\n{}", report.targets_table());
    let mut doc = report.render(&machine, &run);
    // Sections written elsewhere stay: the fenced cost analysis (measured
    // with `scripts/profile-scripts.sh`), the client's instructions per
    // cycle (`scripts/client-cost.sh`) and the PostgreSQL engine's
    // (`benches/postgres.rs`).
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/BENCHMARKS.md");
    let old = std::fs::read_to_string(path).unwrap_or_default();
    for name in ["fenced-cost", "client-cost", "postgres-bench"] {
        let (begin, end) = (
            format!("<!-- {name}:begin -->"),
            format!("<!-- {name}:end -->"),
        );
        if let (Some(a), Some(z)) = (old.find(&begin), old.find(&end)) {
            if a < z {
                let section = &old[a..z + end.len()];
                doc = format!("{}\n\n{section}\n", doc.trim_end());
            }
        }
    }
    if quick || ctx.only.is_some() {
        eprintln!("partial run: docs/BENCHMARKS.md left as it is");
    } else {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/BENCHMARKS.md");
        let written = std::fs::create_dir_all(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs"))
            .and_then(|_| std::fs::write(path, doc));
        match written {
            Ok(()) => eprintln!("wrote docs/BENCHMARKS.md"),
            Err(e) => eprintln!("could not write docs/BENCHMARKS.md: {e}"),
        }
    }
}
