//! The flash-sale scenario, smaller: a real `redis-server`, three
//! instances as separate `flash-sale serve` processes, a crowd of buyers.
//!
//! Without the lock the shop oversells (the handler pauses 50 ms between
//! reading and writing the stock, so concurrent buyers of one item always
//! overlap); with the lock it sells exactly what it has, once per user.
//! No wall-clock assertions: a slow machine only makes the run longer.

use std::path::PathBuf;
use std::time::Duration;

use examples::flash_sale::loadgen::LoadConfig;
use examples::flash_sale::report;
use examples::flash_sale::scenario::{self, Backend, Scenario};
use examples::flash_sale::spawn::TempRedis;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lock_stops_overselling_and_duplicate_purchases() {
    let redis = TempRedis::start()
        .expect("cannot start redis-server")
        .expect("redis-server is not on PATH: install it (scripts/test.sh does)");
    let backend = Backend::Redis {
        url: redis.url(),
        exe: PathBuf::from(env!("CARGO_BIN_EXE_flash-sale")),
    };
    let scenario = Scenario {
        instances: 3,
        stock: 10,
        race_delay: Duration::from_millis(50),
        load: LoadConfig {
            users: 300,
            items: scenario::item_names(2),
            double_rate: 0.3,
            concurrency: 64,
            // A slow machine may make buyers wait past the 2 s lock wait;
            // they retry, and a 503 is an honest answer anyway.
            retries: 5,
            seed: 7,
        },
        progress: false,
        child_log: "warn".into(),
        paused_holder: true,
    };

    let unsafe_run = scenario::run_phase(&backend, &scenario, false)
        .await
        .expect("unsafe run");
    let locked_run = scenario::run_phase(&backend, &scenario, true)
        .await
        .expect("locked run");
    eprintln!(
        "{}",
        report::render(&[unsafe_run.clone(), locked_run.clone()])
    );

    // The lock makes the difference: the same crowd against the same
    // handler oversells without it...
    assert!(
        unsafe_run.oversold > 0,
        "the unsafe run was expected to oversell (sold {} of {})",
        unsafe_run.sold,
        unsafe_run.stock
    );
    // ...and with it sells at most the stock, once per user.
    // An instance paused past its lease just before its write: the unit
    // is sold once, by the instance that took the lock after it.
    let paused = locked_run.paused.expect("the paused holder ran");
    eprintln!("paused holder: {paused:?}");
    assert_eq!(paused.sold, 1, "{paused:?}");
    assert_eq!(locked_run.oversold, 0, "locked run oversold");
    assert_eq!(locked_run.duplicates, 0, "locked run sold twice to a user");
    assert!(locked_run.sold <= locked_run.stock as u64);
    assert!(locked_run.sold > 0, "locked run sold nothing");
    // Every 201 is an order record, and nothing else was written.
    assert_eq!(locked_run.load.created, locked_run.sold);
    assert_eq!(
        locked_run.load.other, 0,
        "unexpected answers in the locked run"
    );
}
