//! The flash-sale scenario on PostgreSQL: a temporary server holds the
//! locks and the shop's tables, three instances run as separate
//! `flash-sale serve --database-url …` processes, a crowd of buyers.
//!
//! Without the lock the shop oversells; with it, it sells exactly what it
//! has, once per user, and an instance paused past its lease does not sell
//! the unit a later holder sold. The store's own check is shown directly
//! too: a write whose token is below one the item has seen is refused in
//! the transaction that would have written it.
//! No wall-clock assertions: a slow machine only makes the run longer.

use std::path::PathBuf;

use examples::flash_sale::scenario::Backend;
use examples::flash_sale::store::{Committed, Store};
use examples::flash_sale::temp_postgres::TempPostgres;

mod common;

fn start_postgres() -> TempPostgres {
    TempPostgres::start()
        .expect("cannot start a PostgreSQL server")
        .expect(
            "PostgreSQL server binaries (initdb, postgres) not found in \
             /usr/lib/postgresql/<version>/bin nor on PATH: install them \
             (scripts/install-postgres.sh does)",
        )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lock_stops_overselling_and_duplicate_purchases() {
    let pg = start_postgres();
    let backend = Backend::Postgres {
        url: pg.url(),
        exe: PathBuf::from(env!("CARGO_BIN_EXE_flash-sale")),
    };
    common::the_lock_stops_overselling_and_duplicate_purchases(backend).await;
}

/// The paused holder (token 5) read; then the next holder (token 9) read.
/// The paused holder's write comes in between: refused, counted, no order
/// inserted (the later holder's read alone raised the item's token). The
/// later holder's write, with the token its read left there, is applied.
#[tokio::test]
async fn a_write_below_the_highest_token_seen_is_refused_in_its_transaction() {
    let pg = start_postgres();
    let store = Store::connect(&pg.url()).await.expect("connect");
    store.seed("i", 2).await.unwrap();
    store.read("i", "a", Some(5)).await.unwrap();
    store.read("i", "b", Some(9)).await.unwrap();
    assert_eq!(
        store.commit("i", "a", 1, "a", Some(5)).await.unwrap(),
        Committed::Stale
    );
    assert_eq!(
        store.commit("i", "b", 1, "b", Some(9)).await.unwrap(),
        Committed::Applied
    );
    let audit = store.audit("i").await.unwrap().unwrap();
    assert_eq!(
        (audit.sold, audit.stock_counter, audit.stale_refused),
        (1, 1, 1)
    );
}
