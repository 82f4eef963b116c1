//! The client's own cost of one uncontended lock + unlock, in a form that
//! counts instructions repeatably on a shared machine: run it under
//! `valgrind --tool=callgrind` twice with different `CYCLES_N` and divide
//! the difference of the totals by the difference of the cycles (the
//! redis-server it starts runs outside valgrind). `scripts/client-cost.sh`
//! does exactly that.
//!
//! ```sh
//! cargo bench -p tests --bench cycles --no-run
//! CYCLES_N=2000 CYCLES_WHERE=task CYCLES_WHAT=fenced valgrind --tool=callgrind target/release/deps/cycles-…
//! ```
//!
//! `CYCLES_WHERE`: `task` (a task of a multi-thread runtime), `current`
//! (a current-thread runtime), `block_on` (a multi-thread runtime's
//! `block_on`). `CYCLES_WHAT`: `fenced`, `unfenced`, or `raw` (two raw
//! round trips with the `redis` crate: the floor in the same placement), or
//! `rslock` (rslock's lock + unlock), or `attribute` (an empty `#[distributed_lock]` fn on the global client,
//! fenced).

use std::time::Duration;

use lock_runtime::{distributed_lock, LockClient, LockError};
use tests::RedisServer;

/// The `attribute` cycle: an empty body under the lock.
#[distributed_lock(key = "cycles:attr:{i}", lease = "30s")]
async fn empty_body(i: u64) -> Result<(), LockError> {
    let _ = i;
    Ok(())
}

async fn cycles(
    client: LockClient,
    conn: redis::aio::MultiplexedConnection,
    rslock: &rslock::LockManager,
    what: String,
    n: u64,
) {
    let mut conn = conn;
    for i in 0..n {
        let key = format!("cycles:{i}");
        match what.as_str() {
            "rslock" => {
                let lock = rslock
                    .lock(key.as_str(), Duration::from_secs(30))
                    .await
                    .expect("rslock lock");
                rslock.unlock(&lock).await;
            }
            "raw" => {
                let _: Option<String> = redis::cmd("SET")
                    .arg(&key)
                    .arg("x")
                    .arg("NX")
                    .arg("PX")
                    .arg(30_000)
                    .query_async(&mut conn)
                    .await
                    .expect("SET");
                let _: i64 = redis::cmd("DEL")
                    .arg(&key)
                    .query_async(&mut conn)
                    .await
                    .expect("DEL");
            }
            "attribute" => empty_body(i).await.expect("attributed call"),
            w => {
                let guard = client
                    .lock(key)
                    .lease(Duration::from_secs(30))
                    .fence(w == "fenced")
                    .await
                    .expect("lock");
                guard.release().await.expect("release");
            }
        }
    }
}

fn main() {
    let n: u64 = std::env::var("CYCLES_N")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1000);
    let place = std::env::var("CYCLES_WHERE").unwrap_or_else(|_| "task".into());
    let what = std::env::var("CYCLES_WHAT").unwrap_or_else(|_| "fenced".into());
    let server = RedisServer::start();
    let url = server.url();
    let rt = match place.as_str() {
        "current" => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build(),
        _ => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build(),
    }
    .expect("runtime");
    let run = |n: u64| {
        let (url, what) = (url.clone(), what.clone());
        let fut = async move {
            let client = LockClient::connect(&url).await.expect("connect");
            if what == "attribute" {
                lock_runtime::init(client.clone()).expect("the global client");
            }
            let conn = redis::Client::open(url.as_str())
                .expect("url")
                .get_multiplexed_async_connection()
                .await
                .expect("raw connection");
            let rslock = rslock::LockManager::new(vec![url.clone()]);
            // Warm: connections of this runtime, scripts, pools.
            cycles(client.clone(), conn.clone(), &rslock, what.clone(), 50).await;
            cycles(client.clone(), conn, &rslock, what, n).await;
            client.close(Duration::from_secs(1)).await;
        };
        if place == "task" {
            rt.block_on(async { tokio::spawn(fut).await.expect("task") });
        } else {
            rt.block_on(fut);
        }
    };
    run(n);
    println!("{n} cycles ({what}, {place})");
}
