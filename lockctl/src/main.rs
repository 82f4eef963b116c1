//! `lockctl`: look at lock-runtime's locks and clear a stuck one.
//!
//! ```text
//! lockctl --url redis://127.0.0.1:6379 list 'order:*'
//! lockctl show order:42
//! lockctl release order:42 --force
//! lockctl release order:42 --force --holder 3f2a…:7   # only if it still holds
//! ```
//!
//! A semaphore (`client.semaphore(key, n)`, `permits = n`) shows as mode
//! `semaphore(n)` with every permit holder; `release --force` frees every
//! permit, `--holder ID` that holder's one.
//!
//! Exit status: 0 found (a lock listed, shown or released), 1 not found,
//! 2 error (bad usage, unreachable Redis, `release` without `--force`).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use lock_runtime::LockClient;

mod output;

use output::Output;

/// Look at lock-runtime's distributed locks and clear a stuck one.
#[derive(Debug, Parser)]
#[command(name = "lockctl", version)]
#[command(after_help = "Exit status: 0 found, 1 not found, 2 error.")]
struct Cli {
    /// Redis URL (`redis://`, `rediss://`, `redis://user:password@host:port/db`)
    /// or PostgreSQL URL (`postgres://user:password@host:port/db`);
    /// several, comma-separated, with --cluster or --redlock, or the
    /// sentinels' with --sentinel. Without it the deployment comes from the
    /// environment exactly as `LockClient::from_env` reads it:
    /// LOCK_REDIS_URL, LOCK_REDIS_SENTINELS + LOCK_REDIS_MASTER,
    /// LOCK_REDIS_CLUSTER or LOCK_REDIS_REDLOCK, else REDIS_URL (with
    /// --cluster, --redlock or --sentinel: the URLs in REDIS_URL).
    #[arg(long, global = true)]
    url: Option<String>,

    /// The URLs are Redis Cluster nodes (listing scans every primary).
    #[arg(long, global = true, conflicts_with_all = ["sentinel", "redlock"])]
    cluster: bool,

    /// The URLs are sentinels watching this master.
    #[arg(long, global = true, value_name = "MASTER", conflicts_with = "redlock")]
    sentinel: Option<String>,

    /// The URLs are independent Redlock nodes (a lock is what a majority
    /// says; a release clears every node).
    #[arg(long, global = true)]
    redlock: bool,

    /// The prefix of the lock names, as the services' clients set it.
    #[arg(long, global = true, default_value = "lock:")]
    prefix: String,

    /// One JSON object a line instead of text.
    #[arg(long, global = true)]
    json: bool,

    /// A PEM file with the CA that `rediss://` servers' certificates chain
    /// to (default: the platform's roots).
    #[arg(long, global = true, value_name = "FILE")]
    tls_ca: Option<PathBuf>,

    /// How long to wait for Redis to connect and to answer each command.
    #[arg(long, global = true, default_value = "2s", value_parser = duration)]
    timeout: Duration,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Held or awaited locks whose key matches PATTERN (a Redis glob:
    /// `*`, `?`, `[a-z]`; default `*`), found with SCAN.
    List {
        /// The keys to list, as the services name them (without prefix).
        pattern: Option<String>,
    },
    /// One lock: mode, holders, lease left, waiters, last fencing token
    /// (of a semaphore: its permits and every permit holder).
    Show {
        /// The key, as the services name it (without prefix).
        key: String,
    },
    /// Clear a stuck lock: its hold ends as if its lease ran out, and the
    /// next waiter gets it at once (of a semaphore: every permit, or with
    /// --holder that holder's). The old holder learns at its next renewal;
    /// until then its work may still be running.
    Release {
        /// The key, as the services name it (without prefix).
        key: String,
        /// Required: clearing a lock its holder still uses breaks the
        /// exclusion it gives.
        #[arg(long)]
        force: bool,
        /// Clear only this holder's hold (an id `show` prints), and only if
        /// it still holds: a holder that took over since is left alone.
        #[arg(long, value_name = "ID")]
        holder: Option<String>,
    },
}

/// A duration such as `500ms`, `2s` or `1m`, longer than zero.
fn duration(s: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(s).map_err(|e| format!("`{s}`: {e}"))?;
    if d.is_zero() {
        return Err("the timeout must be longer than zero".into());
    }
    Ok(d)
}

/// What a command found: the exit status.
enum Found {
    Yes,
    No,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return error(&format!("cannot start: {e}")),
    };
    match rt.block_on(run(cli)) {
        Ok(Found::Yes) => ExitCode::SUCCESS,
        Ok(Found::No) => ExitCode::from(1),
        Err(e) => error(&e),
    }
}

fn error(message: &str) -> ExitCode {
    eprintln!("lockctl: {message}");
    ExitCode::from(2)
}

async fn run(cli: Cli) -> Result<Found, String> {
    if let Command::Release {
        key, force: false, ..
    } = &cli.command
    {
        return Err(format!(
            "refusing to release `{key}` without --force: its holder may still be running \
             (it learns at its next renewal), and the next waiter would run beside it"
        ));
    }
    let client = connect(&cli).await?;
    let out = Output::new(cli.json);
    match &cli.command {
        Command::List { pattern } => {
            let pattern = pattern.as_deref().unwrap_or("*");
            let locks = client.locks(pattern).await.map_err(|e| e.to_string())?;
            out.list(&locks);
            Ok(if locks.is_empty() {
                Found::No
            } else {
                Found::Yes
            })
        }
        Command::Show { key } => match client.inspect(key).await.map_err(|e| e.to_string())? {
            Some(info) => {
                out.show(&info);
                Ok(Found::Yes)
            }
            None => {
                out.free(key);
                Ok(Found::No)
            }
        },
        Command::Release { key, holder, .. } => {
            let before = client.inspect(key).await.map_err(|e| e.to_string())?;
            let released = match holder {
                Some(h) => client.force_release_if(key, h).await,
                None => client.force_release(key).await,
            }
            .map_err(|e| e.to_string())?;
            let after = client.inspect(key).await.map_err(|e| e.to_string())?;
            out.released(
                key,
                holder.as_deref(),
                released,
                before.as_ref(),
                after.as_ref(),
            );
            Ok(if released { Found::Yes } else { Found::No })
        }
    }
}

/// A client of the deployment the flags name, within `--timeout` for
/// connecting plus one for the first answer.
async fn connect(cli: &Cli) -> Result<LockClient, String> {
    let mut builder = LockClient::builder()
        .key_prefix(cli.prefix.as_str())
        .connect_timeout(cli.timeout)
        .op_timeout(cli.timeout);
    if let Some(path) = &cli.tls_ca {
        let pem = std::fs::read(path)
            .map_err(|e| format!("cannot read the CA file {}: {e}", path.display()))?;
        builder = builder.tls_root_ca(&pem);
    }
    // Without --url, the library's own reading of the environment (its
    // variables before REDIS_URL); REDIS_URL alone only lists the nodes
    // of the kind a flag names.
    let kind_flag = cli.cluster || cli.redlock || cli.sentinel.is_some();
    let from_env = (cli.url.is_none() && kind_flag)
        .then(|| std::env::var("REDIS_URL").ok())
        .flatten();
    let urls: Vec<&str> = cli
        .url
        .as_deref()
        .or(from_env.as_deref())
        .unwrap_or_default()
        .split(',')
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .collect();
    let connected = match (urls.as_slice(), &cli.sentinel) {
        ([], None) if !cli.cluster && !cli.redlock => builder.from_env().await,
        ([], _) => return Err("no Redis URL: give --url or set REDIS_URL".into()),
        (urls, Some(master)) => builder.sentinel(urls, master).await,
        (urls, None) if cli.cluster => builder.cluster(urls).await,
        (urls, None) if cli.redlock => builder.redlock(urls).await,
        ([url], None) => builder.connect(url).await,
        (_, None) => {
            return Err(
                "several URLs: say whether they are --cluster nodes, --redlock nodes or \
                 sentinels (--sentinel MASTER)"
                    .into(),
            )
        }
    };
    connected.map_err(|e| format!("cannot reach the lock service: {e}"))
}
