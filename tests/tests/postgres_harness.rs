//! The PostgreSQL test harness itself (`tests/src/postgres.rs`): what the
//! engine's tests lean on must do what it says, against real servers.

use std::process::Command;
use std::time::{Duration, Instant};

use tests::postgres::{PgBouncer, PostgresServer};

/// `psql` over TCP at `url` (what a client of the URL sees).
fn psql_url(url: &str, sql: &str) -> Result<String, String> {
    let out = Command::new(tests::postgres::bin_dir().join("psql"))
        .args([
            "-X",
            "-q",
            "-A",
            "-t",
            "-v",
            "ON_ERROR_STOP=1",
            "-d",
            url,
            "-c",
            sql,
        ])
        .env("PGCONNECT_TIMEOUT", "5")
        .output()
        .map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
    }
}

#[test]
fn a_server_answers_over_tcp_and_its_data_survives_a_crash() {
    let mut pg = PostgresServer::options().durable().start();
    assert_eq!(psql_url(&pg.url(), "SELECT 1").unwrap(), "1");
    pg.psql("CREATE TABLE t (v int); INSERT INTO t VALUES (7)");
    let before = pg.pids();
    assert!(before.len() > 2, "postmaster and its children: {before:?}");

    pg.kill();
    assert!(psql_url(&pg.url(), "SELECT 1").is_err(), "down after kill");
    pg.start_again();
    assert_eq!(
        pg.scalar("SELECT v FROM t"),
        "7",
        "committed before the crash"
    );

    pg.restart();
    assert_eq!(pg.scalar("SELECT v FROM t"), "7", "after an immediate stop");
}

#[test]
fn a_paused_server_answers_nothing_until_resumed() {
    let pg = PostgresServer::start();
    let url = pg.url();
    pg.pause();
    let started = Instant::now();
    let err = psql_url(&url, "SELECT 1").unwrap_err();
    assert!(started.elapsed() >= Duration::from_secs(4), "{err}");
    pg.resume();
    assert_eq!(psql_url(&url, "SELECT 1").unwrap(), "1");
}

#[test]
fn terminate_backends_ends_every_client_connection_to_its_database() {
    let pg = PostgresServer::shared();
    let db = pg.fresh_database();
    let url = pg.url_for(&db);
    let sleeper = std::thread::spawn(move || psql_url(&url, "SELECT pg_sleep(30)"));
    let deadline = Instant::now() + Duration::from_secs(10);
    while pg.connections_to(&db) == 0 {
        assert!(Instant::now() < deadline, "the sleeper never connected");
        std::thread::sleep(Duration::from_millis(10));
    }
    // (The server is shared: only this test's database, so that the other
    // tests' sessions live on.)
    assert!(pg.terminate_backends_in(&db) >= 1);
    let err = sleeper.join().unwrap().unwrap_err();
    assert!(err.contains("terminat"), "{err}");
}

#[test]
fn a_password_server_refuses_a_wrong_one_over_tcp() {
    let pg = PostgresServer::options().password("s3cret").start();
    assert_eq!(psql_url(&pg.url(), "SELECT 1").unwrap(), "1");
    let wrong = pg.url().replace("s3cret", "wrong");
    let err = psql_url(&wrong, "SELECT 1").unwrap_err();
    assert!(err.contains("password authentication failed"), "{err}");
    // The harness's own queries go through the trusted socket.
    assert_eq!(pg.scalar("SELECT 2"), "2");
}

#[test]
fn counters_see_a_write() {
    let pg = PostgresServer::shared();
    let db = pg.fresh_database();
    pg.psql_in(&db, "CREATE TABLE t (v int PRIMARY KEY, pad text)");
    pg.reset_statements();
    let wal = pg.wal_position();
    let cpu = pg.cpu_time();
    for v in 0..5 {
        psql_url(
            &pg.url_for(&db),
            &format!("INSERT INTO t VALUES ({v}, repeat('x', 1000))"),
        )
        .unwrap();
    }
    assert!(pg.wal_bytes_since(wal) >= 5000, "five 1 kB rows");
    let statements = pg.statements_in(&db);
    if tests::postgres::has_pg_stat_statements() {
        assert_eq!(statements, 5, "{:?}", pg.statement_counts_in(&db));
    } else {
        assert!(statements >= 5);
    }
    assert!(pg.table_size_in(&db, "t") >= 5000);
    assert!(pg.cpu_time() >= cpu);
}

#[test]
fn pgbouncer_pools_in_transaction_mode() {
    let pg = PostgresServer::shared();
    let db = pg.fresh_database();
    let bouncer = PgBouncer::start(pg, 2);
    assert_eq!(psql_url(&bouncer.url_for(&db), "SELECT 1").unwrap(), "1");
    let mode = psql_url(&bouncer.url_for("pgbouncer"), "SHOW CONFIG").unwrap();
    assert!(
        mode.lines().any(|l| l.starts_with("pool_mode|transaction")),
        "{mode}"
    );
}

#[test]
fn a_synchronous_standby_has_every_commit_and_takes_over() {
    let mut primary = PostgresServer::options().durable().start();
    let standby = PostgresServer::standby_of(&primary, "standby1", true);
    primary.psql("CREATE TABLE t (v int); INSERT INTO t VALUES (1)");
    // Synchronous commit waited for the standby's flush; its replay
    // follows at once (remote_apply is not asked for): wait for it.
    let deadline = Instant::now() + Duration::from_secs(10);
    while standby
        .try_psql_in("postgres", "SELECT v FROM t")
        .ok()
        .as_deref()
        != Some("1")
    {
        assert!(Instant::now() < deadline, "standby never replayed");
        std::thread::sleep(Duration::from_millis(10));
    }
    primary.kill();
    standby.promote();
    standby.psql("INSERT INTO t VALUES (2)");
    assert_eq!(standby.scalar("SELECT count(*) FROM t"), "2");
}
