//! The rate-limited upstream: a semaphore of 4 permits keeps three
//! instances within the provider's limit of 4 calls in flight, where the
//! same load without it exceeds the limit and is refused. On a real
//! `redis-server` and on the in-memory backend; a fraction of a second
//! each.

use std::time::Duration;

use examples::flash_sale::spawn::TempRedis;
use examples::rate_limit::{run, LIMIT};
use lock_runtime::LockClient;

const CALLS: usize = 40;
const LATENCY: Duration = Duration::from_millis(20);

async fn the_limit_holds(clients: &[LockClient], on: &str) {
    let unlimited = run(clients, CALLS, LATENCY, false).await.unwrap();
    // The load exceeds the limit: the check below could fail.
    assert!(
        unlimited.most_in_flight > LIMIT && unlimited.refused > 0,
        "{on}: the load never exceeded the limit: {unlimited:?}"
    );
    let limited = run(clients, CALLS, LATENCY, true).await.unwrap();
    println!("{on}: without {unlimited:?}, with {limited:?}");
    assert!(
        limited.most_in_flight <= LIMIT,
        "{on}: {} calls in flight under {LIMIT} permits",
        limited.most_in_flight
    );
    assert_eq!((limited.served, limited.refused), (CALLS, 0), "{on}");
    // And the permits were used side by side, not one at a time.
    assert_eq!(limited.most_in_flight, LIMIT, "{on}: {limited:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_most_4_calls_in_flight_across_three_instances_on_redis() {
    let redis = TempRedis::start()
        .expect("cannot start redis-server")
        .expect("redis-server is not on PATH: install it (scripts/test.sh does)");
    let mut clients = Vec::new();
    for _ in 0..3 {
        clients.push(LockClient::connect(&redis.url()).await.unwrap());
    }
    the_limit_holds(&clients, "Redis").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_most_4_calls_in_flight_in_memory() {
    the_limit_holds(&[LockClient::memory()], "memory").await;
}
