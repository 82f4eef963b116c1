//! The README's example: one annotated fn, run by several tasks at once.
//!
//! `cargo run -p examples --bin quickstart` (uses `REDIS_URL`, or the
//! in-memory backend when it is unset).

use std::time::Duration;

use lock_runtime::{distributed_lock, LockClient, LockError};

#[distributed_lock(key = "order:{id}", lease = "10s", wait = "5s")]
async fn pay(id: u64, task: usize) -> Result<u64, LockError> {
    let fence = lock_runtime::current_fence().unwrap_or_default();
    println!("task {task} pays order {id} under fence {fence}");
    tokio::time::sleep(Duration::from_millis(50)).await;
    Ok(fence)
}

#[tokio::main]
async fn main() -> Result<(), LockError> {
    let client = match std::env::var("REDIS_URL") {
        Ok(url) => LockClient::connect(&url).await?,
        Err(_) => LockClient::memory(),
    };
    lock_runtime::init(client)?;
    let tasks: Vec<_> = (0..4).map(|t| tokio::spawn(pay(42, t))).collect();
    for t in tasks {
        t.await.expect("task panicked")?;
    }
    Ok(())
}
