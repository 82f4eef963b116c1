//! The small flash-sale scenario both engines' tests run, and what it
//! must show.

use std::time::Duration;

use examples::flash_sale::loadgen::LoadConfig;
use examples::flash_sale::report;
use examples::flash_sale::scenario::{self, Backend, Scenario};

/// Three instances, 10 units of 2 items, 300 buyers, a paused holder:
/// without the lock the shop oversells; with it, it sells at most its
/// stock, once per user, and the paused holder's unit is sold once.
/// No wall-clock assertions: a slow machine only makes the run longer.
pub async fn the_lock_stops_overselling_and_duplicate_purchases(backend: Backend) {
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

    assert!(
        unsafe_run.oversold > 0,
        "the unsafe run was expected to oversell (sold {} of {})",
        unsafe_run.sold,
        unsafe_run.stock
    );
    // An instance paused past its lease just before its write: the unit
    // is sold once, by the instance that took the lock after it.
    let paused = locked_run.paused.expect("the paused holder ran");
    eprintln!("paused holder: {paused:?}");
    assert_eq!((paused.sold, paused.stock), (1, 1), "{paused:?}");
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
