//! The flash-sale scenario, smaller: a real `redis-server`, three
//! instances as separate `flash-sale serve` processes, a crowd of buyers.
//!
//! Without the lock the shop oversells (the handler pauses 50 ms between
//! reading and writing the stock, so concurrent buyers of one item always
//! overlap); with the lock it sells exactly what it has, once per user.
//! No wall-clock assertions: a slow machine only makes the run longer.

use std::path::PathBuf;

use examples::flash_sale::scenario::Backend;
use examples::flash_sale::spawn::TempRedis;

mod common;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lock_stops_overselling_and_duplicate_purchases() {
    let redis = TempRedis::start()
        .expect("cannot start redis-server")
        .expect("redis-server is not on PATH: install it (scripts/test.sh does)");
    let backend = Backend::Redis {
        url: redis.url(),
        exe: PathBuf::from(env!("CARGO_BIN_EXE_flash-sale")),
    };
    common::the_lock_stops_overselling_and_duplicate_purchases(backend).await;
}
