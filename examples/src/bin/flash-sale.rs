//! The flash-sale demo: a shop that must not sell more than it has.
//!
//! `cargo run --release -p examples --bin flash-sale` runs the whole show:
//! Redis (`REDIS_URL`, or a temporary `redis-server`, or the in-memory
//! backend), three service instances, a crowd of buyers — first with
//! `--unsafe` instances, then with the lock — and a verdict table. It exits
//! non-zero if the locked run oversold or sold twice to one user.
//!
//! With `--postgres` the locks, the stock and the orders are all in one
//! PostgreSQL database (`DATABASE_URL`, or a temporary server), and each
//! sale checks the lock's fencing token in the transaction that writes it.
//!
//! `flash-sale serve` runs one instance of the service.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use examples::flash_sale::loadgen::LoadConfig;
use examples::flash_sale::report;
use examples::flash_sale::scenario::{self, Backend, Scenario};
use examples::flash_sale::service::{self, Shop};
use examples::flash_sale::spawn::TempRedis;
use examples::flash_sale::store::Store;
use examples::flash_sale::temp_postgres::TempPostgres;
use lock_runtime::LockClient;
use tracing_subscriber::EnvFilter;

/// A flash sale that does not oversell: `#[distributed_lock]` demo.
///
/// Without a subcommand: run the demo (unsafe run, then locked run, then
/// the verdict).
#[derive(Parser)]
#[command(version, args_conflicts_with_subcommands = true)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    demo: DemoArgs,
}

#[derive(Subcommand)]
enum Command {
    /// Run one instance of the shop service.
    Serve(ServeArgs),
}

#[derive(Args)]
struct ServeArgs {
    /// Port to listen on (0: any free port; the first line of stdout says
    /// which).
    #[arg(long, env = "PORT", default_value_t = 3000)]
    port: u16,
    /// Address to listen on.
    #[arg(long, env = "HOST", default_value = "127.0.0.1")]
    host: String,
    /// Name of this instance in logs and answers.
    #[arg(long, env = "INSTANCE", default_value = "flash-1")]
    instance: String,
    /// Redis for stock, orders and locks; without it, everything is in
    /// memory (one instance only).
    #[arg(long, env = "REDIS_URL")]
    redis_url: Option<String>,
    /// PostgreSQL (`postgres://…`) for stock, orders and locks, instead of
    /// Redis (it wins over `--redis-url`).
    #[arg(long)]
    database_url: Option<String>,
    /// Serve the same logic without the lock (for comparison).
    #[arg(long = "unsafe")]
    unsafe_mode: bool,
    /// Pause between reading and writing the stock, in ms.
    #[arg(long, default_value_t = 5)]
    race_delay_ms: u64,
    /// The demo's paused holder: the first locked sale stops this process
    /// with SIGSTOP just before its write (send SIGCONT to resume).
    #[arg(long)]
    pause_before_write: bool,
    /// Put items on sale at start-up: `--seed item-1=100` (repeatable).
    /// Resets their orders.
    #[arg(long, value_parser = parse_seed)]
    seed: Vec<(String, i64)>,
}

#[derive(Args)]
struct DemoArgs {
    /// Use this Redis instead of starting a temporary one.
    #[arg(long, env = "REDIS_URL")]
    redis_url: Option<String>,
    /// Use the in-memory backend even if Redis is available.
    #[arg(long, conflicts_with = "redis_url")]
    memory: bool,
    /// Keep locks, stock and orders in one PostgreSQL database:
    /// `DATABASE_URL` if set, else a temporary server.
    #[arg(long, conflicts_with = "memory")]
    postgres: bool,
    /// Service instances.
    #[arg(long, default_value_t = 3)]
    instances: usize,
    /// Items on sale.
    #[arg(long, default_value_t = 4)]
    items: usize,
    /// Units of each item.
    #[arg(long, default_value_t = 50)]
    stock: i64,
    /// Buyers.
    #[arg(long, default_value_t = 2500)]
    users: usize,
    /// Share of buyers who double-click (send the order twice at once).
    #[arg(long, default_value_t = 0.2)]
    double_rate: f64,
    /// Requests in flight at most.
    #[arg(long, default_value_t = 200)]
    concurrency: usize,
    /// Pause between reading and writing the stock, in ms.
    #[arg(long, default_value_t = 5)]
    race_delay_ms: u64,
    /// Random seed of the crowd.
    #[arg(long, default_value_t = 42)]
    seed: u64,
}

fn parse_seed(s: &str) -> Result<(String, i64), String> {
    let (item, stock) = s
        .split_once('=')
        .ok_or_else(|| format!("`{s}`: expected ITEM=STOCK"))?;
    let stock = stock
        .parse()
        .map_err(|e| format!("`{s}`: stock is not a number: {e}"))?;
    Ok((item.to_owned(), stock))
}

fn init_tracing(default: &str) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Some(Command::Serve(args)) => {
            init_tracing("info");
            match serve(args).await {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    tracing::error!("{e}");
                    ExitCode::FAILURE
                }
            }
        }
        None => {
            init_tracing("warn");
            // On ctrl-c or SIGTERM the demo future is dropped, and with it
            // every instance and the temporary Redis (killed on drop).
            tokio::select! {
                result = demo(cli.demo) => match result {
                    Ok(code) => code,
                    Err(e) => {
                        eprintln!("flash-sale: {e}");
                        ExitCode::FAILURE
                    }
                },
                () = service::shutdown_signal() => {
                    eprintln!("\nflash-sale: interrupted; stopped every process it started");
                    ExitCode::from(130)
                }
            }
        }
    }
}

async fn serve(args: ServeArgs) -> Result<(), scenario::Error> {
    let url = args.database_url.as_ref().or(args.redis_url.as_ref());
    let (store, client) = match url {
        Some(url) => (Store::connect(url).await?, LockClient::connect(url).await?),
        None => {
            tracing::warn!("no REDIS_URL: stock and locks are in memory, private to this instance");
            (Store::memory(), LockClient::memory())
        }
    };
    lock_runtime::init(client)?;
    for (item, stock) in &args.seed {
        store.seed(item, *stock).await?;
        tracing::info!(%item, stock, "on sale");
    }
    let shop = Arc::new(Shop {
        metrics: examples::flash_sale::lock_figures::recorder(),
        store,
        instance: args.instance,
        locked: !args.unsafe_mode,
        race_delay: Duration::from_millis(args.race_delay_ms),
        pause_before_write: args.pause_before_write.into(),
    });
    if args.unsafe_mode {
        tracing::info!(instance = %shop.instance, "--unsafe: orders are NOT locked; this instance can oversell");
    }
    let listener = tokio::net::TcpListener::bind((args.host.as_str(), args.port)).await?;
    // The first line of stdout, for whoever started this with `--port 0`
    // (the demo does).
    println!("listening on http://{}", listener.local_addr()?);
    service::serve(listener, shop, service::shutdown_signal()).await?;
    // The requests in flight are done: hand any lock still held to the
    // next instance now, not one lease from now.
    lock_runtime::close_global(Duration::from_secs(5)).await;
    Ok(())
}

async fn demo(args: DemoArgs) -> Result<ExitCode, scenario::Error> {
    let exe: PathBuf = std::env::current_exe()?;
    // Declared before the backend so that it outlives every use; dropped
    // (killed) on every return path, also while a panic unwinds.
    let mut temp_redis = None;
    let mut temp_postgres = None;
    let backend = if args.postgres {
        match std::env::var("DATABASE_URL") {
            Ok(url) => Backend::Postgres { url, exe },
            Err(_) => {
                let pg = TempPostgres::start()?.ok_or(
                    "--postgres: DATABASE_URL is not set and the PostgreSQL server binaries \
                     (initdb, postgres) are not in /usr/lib/postgresql/<version>/bin nor on PATH: \
                     install them, or set DATABASE_URL",
                )?;
                let url = pg.url();
                temp_postgres = Some(pg);
                Backend::Postgres { url, exe }
            }
        }
    } else if let Some(url) = &args.redis_url {
        Backend::Redis {
            url: url.clone(),
            exe,
        }
    } else if args.memory {
        Backend::Memory(Store::memory())
    } else {
        match TempRedis::start()? {
            Some(redis) => {
                let url = redis.url();
                temp_redis = Some(redis);
                Backend::Redis { url, exe }
            }
            None => {
                eprintln!(
                    "redis-server is not on PATH: falling back to the in-memory backend, \
                     all {} instances in this process (install redis-server to see separate processes)",
                    args.instances
                );
                Backend::Memory(Store::memory())
            }
        }
    };
    let scenario = Scenario {
        instances: args.instances.max(1),
        stock: args.stock,
        race_delay: Duration::from_millis(args.race_delay_ms),
        load: LoadConfig {
            users: args.users,
            items: scenario::item_names(args.items.max(1)),
            double_rate: args.double_rate,
            concurrency: args.concurrency,
            retries: 3,
            seed: args.seed,
        },
        progress: true,
        child_log: "warn".into(),
        paused_holder: true,
    };
    let source = if temp_redis.is_some() {
        " (temporary redis-server)"
    } else if temp_postgres.is_some() {
        " (temporary postgres server)"
    } else {
        ""
    };
    eprintln!("flash sale: {}{source}", backend.describe());
    eprintln!(
        "  {} instances, {} items x {} units, {} buyers ({:.0}% double-click), {} requests in flight, 503s retried up to 3 times",
        scenario.instances,
        scenario.load.items.len(),
        scenario.stock,
        scenario.load.users,
        scenario.load.double_rate * 100.0,
        scenario.load.concurrency
    );

    eprintln!("\n1/2  --unsafe: the same handler without #[distributed_lock]");
    let unsafe_run = scenario::run_phase(&backend, &scenario, false).await?;
    eprintln!("2/2  locked: #[distributed_lock(key = \"stock:{{req.item}}\", wait = \"2s\")]");
    let locked_run = scenario::run_phase(&backend, &scenario, true).await?;
    drop(temp_redis);
    drop(temp_postgres);

    println!();
    print!(
        "{}",
        report::render(&[unsafe_run.clone(), locked_run.clone()])
    );
    println!();
    if let Some(f) = &locked_run.lock {
        let ms = |s: Option<f64>| s.map_or("n/a".to_owned(), |s| format!("{:.1} ms", s * 1000.0));
        println!(
            "  lock figures read from the {} locked instances' /metrics: {} acquisitions, {} gave up busy, {} lost; \
             waiting for the lock p50 {}, p99 {} (the first instance)",
            f.instances,
            f.acquired,
            f.busy,
            f.lost,
            ms(f.wait_p50),
            ms(f.wait_p99)
        );
    }
    if unsafe_run.correct() {
        println!(
            "  unsafe: this time the race did not show (try more --concurrency or --race-delay-ms)"
        );
    } else {
        println!(
            "  unsafe: sold {} units of {} in stock ({} oversold), {} users bought the same item twice",
            unsafe_run.sold, unsafe_run.stock, unsafe_run.oversold, unsafe_run.duplicates
        );
    }
    if locked_run.correct() {
        println!(
            "  locked: sold {} of {}, no overselling, no duplicate purchases",
            locked_run.sold, locked_run.stock
        );
        Ok(ExitCode::SUCCESS)
    } else {
        println!(
            "  locked: FAILED: {} oversold, {} duplicate purchases",
            locked_run.oversold, locked_run.duplicates
        );
        Ok(ExitCode::FAILURE)
    }
}
