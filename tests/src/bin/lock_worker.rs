//! A separate OS process for multi-process tests.
//!
//! `lock_worker increment URL KEY ROUNDS`: read-modify-write a Redis counter
//! under `#[distributed_lock]`, printing each fence.
//! `lock_worker hold URL KEY LEASE_MS`: take the lock (waiting up to 60 s),
//! print `HELD <fence>`, and keep it (renewed) until killed.
//! A leading `--redlock` makes URL a comma-separated list of independent
//! servers locked with Redlock; the counter lives on the first of them.

use std::io::Write;
use std::time::Duration;

use lock_runtime::{distributed_lock, LockClient, LockError};
use redis::aio::MultiplexedConnection;

#[distributed_lock(key = "{key}", wait = "60s")]
async fn increment(key: &str, conn: &mut MultiplexedConnection) -> Result<u64, LockError> {
    let counter = format!("{key}:counter");
    let v: Option<i64> = redis::cmd("GET")
        .arg(&counter)
        .query_async(conn)
        .await
        .unwrap();
    tokio::task::yield_now().await;
    let _: () = redis::cmd("SET")
        .arg(&counter)
        .arg(v.unwrap_or(0) + 1)
        .query_async(conn)
        .await
        .unwrap();
    Ok(lock_runtime::current_fence().unwrap())
}

#[tokio::main]
async fn main() -> Result<(), LockError> {
    let mut args: Vec<String> = std::env::args().collect();
    let redlock = args.get(1).is_some_and(|a| a == "--redlock");
    if redlock {
        args.remove(1);
    }
    let (mode, urls, key, n) = (
        &args[1],
        &args[2],
        &args[3],
        args[4].parse::<u64>().unwrap(),
    );
    let url = &urls.split(',').next().unwrap().to_owned();
    let client = if redlock {
        LockClient::redlock(urls.split(',')).await?
    } else {
        LockClient::connect(url).await?
    };
    lock_runtime::init(client)?;
    let mut out = std::io::stdout().lock();
    match mode.as_str() {
        "increment" => {
            let mut conn = redis::Client::open(url.as_str())
                .unwrap()
                .get_multiplexed_async_connection()
                .await
                .unwrap();
            for _ in 0..n {
                let fence = increment(key, &mut conn).await?;
                writeln!(out, "FENCE {fence}").unwrap();
            }
        }
        "hold" => {
            let guard = lock_runtime::client()?
                .lock(key)
                .lease(Duration::from_millis(n))
                .wait(Duration::from_secs(60))
                .await?;
            writeln!(out, "HELD {}", guard.fence()).unwrap();
            out.flush().unwrap();
            std::future::pending::<()>().await;
        }
        other => panic!("unknown mode {other}"),
    }
    Ok(())
}
