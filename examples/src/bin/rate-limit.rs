//! At most 4 calls in flight to a slow payment provider, across three
//! instances: `#[distributed_lock(key = "payments:{merchant}", permits = 4)]`
//! on the call. 60 charges start at once, first without the semaphore (the
//! provider refuses what exceeds its limit), then with it (every charge
//! waits for a permit and goes through).
//!
//! `cargo run -p examples --bin rate-limit` (uses `REDIS_URL`, else a
//! temporary `redis-server` if one is on `PATH`, else the in-memory
//! backend).

use std::time::Duration;

use examples::instances::Instances;
use examples::rate_limit::{self, Report, LIMIT};
use lock_runtime::LockError;

const INSTANCES: usize = 3;
const CALLS: usize = 60;
const LATENCY: Duration = Duration::from_millis(50);

#[tokio::main]
async fn main() -> Result<(), LockError> {
    let Instances {
        clients,
        on,
        redis: temp,
    } = Instances::connect(INSTANCES).await?;
    println!(
        "{INSTANCES} instances, {CALLS} charges at once, a provider that takes {LATENCY:?} a call \
         and refuses more than {LIMIT} in flight; on {}",
        on
    );
    let show = |what: &str, r: &Report| {
        println!(
            "  {what:<16} served {:>3}, refused {:>3}, at most {:>2} in flight",
            r.served, r.refused, r.most_in_flight
        )
    };
    let unlimited = rate_limit::run(&clients, CALLS, LATENCY, false).await?;
    show("no semaphore:", &unlimited);
    let limited = rate_limit::run(&clients, CALLS, LATENCY, true).await?;
    show("permits = 4:", &limited);
    drop(temp);
    if limited.refused == 0 && limited.most_in_flight <= LIMIT {
        Ok(())
    } else {
        std::process::exit(1)
    }
}
