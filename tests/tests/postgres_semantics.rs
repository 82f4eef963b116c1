//! The engine-independent checks (`tests/src/`: semantics, read-write,
//! semaphores, operations) on PostgreSQL: the same functions the Redis and
//! in-memory binaries call, against a throwaway server of the harness.

use std::time::Duration;

use lock_runtime::LockClient;
use tests::postgres::PostgresServer;
use tests::read_write as rw;
use tests::semaphores::{self, Deployment};
use tests::{global, operations as ops, semantics};

/// `n` clients of a fresh database of the shared server.
async fn clients(
    n: usize,
    builder: impl Fn() -> lock_runtime::LockClientBuilder,
) -> (String, Vec<LockClient>) {
    let server = PostgresServer::shared();
    let url = server.url_for(&server.fresh_database());
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(
            builder()
                .connect(&url)
                .await
                .expect("connect to PostgreSQL"),
        );
    }
    (url, out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mutual_exclusion_many_tasks() {
    global::postgres().await;
    semantics::mutual_exclusion(32, 20).await;
}

#[tokio::test]
async fn try_once_fails_fast() {
    global::postgres().await;
    semantics::try_once_fails_fast().await;
}

/// Fallback retries far beyond the wait: only the release's NOTIFY can
/// hand the lock over in time.
#[tokio::test]
async fn waiter_is_woken_by_the_release_notify() {
    let (_, c) = clients(1, || {
        LockClient::builder().retry_delay(Duration::from_secs(600))
    })
    .await;
    semantics::waiter_woken_by_release(&c[0]).await;
}

#[tokio::test]
async fn reentrancy() {
    global::postgres().await;
    semantics::reentrancy().await;
}

#[tokio::test]
async fn release_on_every_exit() {
    global::postgres().await;
    semantics::release_on_every_exit().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watchdog_keeps_a_one_second_lease_alive() {
    global::postgres().await;
    semantics::watchdog_keeps_lease().await;
}

#[tokio::test]
async fn fences_increase_across_clients() {
    let (_, c) = clients(3, LockClient::builder).await;
    semantics::fences_increase(&c).await;
}

#[tokio::test]
async fn empty_key_is_invalid() {
    global::postgres().await;
    semantics::empty_key_rejected().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_write() {
    let (_, c) = clients(3, LockClient::builder).await;
    rw::readers_share_and_a_writer_excludes_them(&c).await;
    rw::a_waiting_writer_is_not_starved(&c).await;
    rw::a_release_wakes_the_readers_together_then_the_writer(&c).await;
    rw::reentry_and_upgrade(&c[0]).await;
    rw::a_reader_is_renewed(&c[0], &c[1]).await;
    rw::dropped_read_requests_leave_nothing(&c).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_giving_up_lets_the_readers_behind_it_in() {
    let (_, c) = clients(2, || {
        LockClient::builder().retry_delay(Duration::from_secs(60))
    })
    .await;
    rw::a_writer_giving_up_lets_the_readers_behind_it_in(&c).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operations() {
    let (_, c) = clients(3, LockClient::builder).await;
    ops::a_free_key(&c[0]).await;
    ops::a_held_key(&c).await;
    ops::a_read_held_key(&c).await;
    ops::waiters_of_two_clients(&c).await;
    let took = ops::a_forced_release_hands_over(&c).await;
    println!("PostgreSQL: a forced release handed the lock over in {took:?}");
    ops::a_forced_read_release_hands_to_the_writer(&c, true).await;
    ops::a_conditional_release_leaves_a_holder_that_took_over(&c, true, true).await;
    ops::the_cleared_holder_learns_at_its_renewal(&c).await;
    ops::listing(&c).await;
}

/// The shared semaphore checks; what is kept of a key is read from the
/// tables themselves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn semaphores() {
    let server = PostgresServer::shared();
    let db = server.fresh_database();
    let url = server.url_for(&db);
    let mut c = Vec::new();
    for _ in 0..3 {
        c.push(LockClient::connect(&url).await.unwrap());
    }
    let d = Deployment {
        name: "postgres",
        clients: c,
        left: Box::new(move |key| left(server, &db, key)),
    };
    semaphores::all(&d).await;
}

/// Live holds and queue entries of `key` (default prefix).
fn left(server: &PostgresServer, db: &str, key: &str) -> Vec<String> {
    let name = format!("lock:{{{key}}}").replace('\'', "''");
    server
        .query_in(
            db,
            &format!(
                "SELECT 'holder ' || owner FROM lock_holders WHERE name = '{name}' AND lease_end > clock_timestamp() \
                 UNION ALL SELECT 'waiter ' || owner FROM lock_waiters WHERE name = '{name}' AND until > clock_timestamp()"
            ),
        )
        .into_iter()
        .flatten()
        .collect()
}
