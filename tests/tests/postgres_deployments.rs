//! The PostgreSQL engine as deployed: through a real `pgbouncer` in
//! transaction mode, the errors a misconfigured deployment gets (each
//! within a bound, never a hang), and what many lock cycles and renewals
//! leave in the tables.

use std::future::IntoFuture;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lock_runtime::{LockClient, LockError};
use tests::postgres::{PgBouncer, PostgresServer};
use tests::{eventually, free_port, unique};

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Runtime::new().unwrap()
}

/// Through PgBouncer in transaction mode (2 server connections for every
/// client), with the listening connection to the server itself
/// (`listen_url`): locks work, contending tasks never hold twice, and a
/// waiter is handed the lock by the release's NOTIFY (its `retry_delay` of
/// 10 s is longer than its wait).
#[test]
fn pgbouncer_in_transaction_mode_with_listen_url() {
    let rt = rt();
    let pg = PostgresServer::shared();
    let db = pg.fresh_database();
    let bouncer = PgBouncer::start(pg, 2);
    let connect = || {
        rt.block_on(
            LockClient::builder()
                .retry_delay(Duration::from_secs(10))
                .listen_url(pg.url_for(&db))
                .connect(&bouncer.url_for(&db)),
        )
        .unwrap()
    };
    let (a, b) = (connect(), connect());
    let key = unique("bouncer");
    let held = rt.block_on(a.lock(&key).into_future()).unwrap();
    let (b2, k2) = (b.clone(), key.clone());
    let waiter = rt.spawn(async move { b2.lock(&k2).wait(Duration::from_secs(5)).await });
    rt.block_on(async {
        assert!(eventually(Duration::from_secs(5), || b.waiting_here(&key) == 1).await);
    });
    let fence = held.fence();
    rt.block_on(held.release()).unwrap();
    let got = rt
        .block_on(waiter)
        .unwrap()
        .expect("the waiter was not handed the lock within its wait (5 s < retry_delay 10 s)");
    assert!(got.fence() > fence);
    rt.block_on(got.release()).unwrap();

    let doubles = contend_briefly(&rt, &[a, b], 4, 40);
    assert_eq!(doubles, 0);
}

/// Through PgBouncer without a `listen_url`: no notification reaches the
/// waiter, which gets the lock by asking again at `retry_delay`.
#[test]
fn pgbouncer_without_listen_url_polls_at_retry_delay() {
    let rt = rt();
    let pg = PostgresServer::shared();
    let db = pg.fresh_database();
    let bouncer = PgBouncer::start(pg, 2);
    let connect = || {
        rt.block_on(
            LockClient::builder()
                .retry_delay(Duration::from_millis(200))
                .connect(&bouncer.url_for(&db)),
        )
        .unwrap()
    };
    let (a, b) = (connect(), connect());
    let key = unique("bouncerpoll");
    let held = rt.block_on(a.lock(&key).into_future()).unwrap();
    let (b2, k2) = (b.clone(), key.clone());
    let waiter = rt.spawn(async move { b2.lock(&k2).wait(Duration::from_secs(10)).await });
    std::thread::sleep(Duration::from_millis(300));
    rt.block_on(held.release()).unwrap();
    let got = rt.block_on(waiter).unwrap().expect("never got the lock");
    rt.block_on(got.release()).unwrap();
    assert_eq!(contend_briefly(&rt, &[a, b], 4, 20), 0);
}

/// `tasks` tasks per client, `rounds` lock cycles each on 2 keys; the
/// number of times a body found another inside.
fn contend_briefly(
    rt: &tokio::runtime::Runtime,
    clients: &[LockClient],
    tasks: usize,
    rounds: usize,
) -> u64 {
    let keys: Arc<Vec<String>> = Arc::new((0..2).map(|_| unique("brief")).collect());
    let inside: Arc<Vec<AtomicU32>> = Arc::new((0..2).map(|_| AtomicU32::new(0)).collect());
    let doubles = Arc::new(AtomicU64::new(0));
    let mut handles = Vec::new();
    for c in clients {
        for t in 0..tasks {
            let (c, keys, inside, doubles) =
                (c.clone(), keys.clone(), inside.clone(), doubles.clone());
            handles.push(rt.spawn(async move {
                for i in 0..rounds {
                    let k = (t + i) % 2;
                    let g = c
                        .lock(&keys[k])
                        .wait(Duration::from_secs(30))
                        .await
                        .unwrap();
                    if inside[k].fetch_add(1, Ordering::SeqCst) != 0 {
                        doubles.fetch_add(1, Ordering::Relaxed);
                    }
                    tokio::task::yield_now().await;
                    inside[k].fetch_sub(1, Ordering::SeqCst);
                    g.release().await.unwrap();
                }
            }));
        }
    }
    for h in handles {
        rt.block_on(h).unwrap();
    }
    doubles.load(Ordering::Relaxed)
}

/// `connect` (which checks the server and creates the schema) of `url`:
/// its error, and how long it took.
fn connect_error(rt: &tokio::runtime::Runtime, url: &str) -> (LockError, Duration) {
    let started = Instant::now();
    let out = rt.block_on(
        LockClient::builder()
            .connect_timeout(Duration::from_secs(2))
            .connect(url),
    );
    let took = started.elapsed();
    match out {
        Ok(_) => panic!("{url}: connected"),
        Err(e) => (e, took),
    }
}

/// No server, a wrong password, a missing database: a `Backend` error that
/// says which, within the connect timeout (2 s) and a margin.
#[test]
fn misconfigured_connections_are_clear_errors_in_bounded_time() {
    let rt = rt();
    let pg = PostgresServer::options().password("right").start();
    let bound = Duration::from_secs(5);

    let nobody = format!("postgres://postgres@127.0.0.1:{}/postgres", free_port());
    let (e, took) = connect_error(&rt, &nobody);
    assert!(matches!(e, LockError::Backend(_)), "no server: {e:?}");
    assert!(took < bound, "no server: {took:?}");

    let wrong = pg.url().replace(":right@", ":wrong@");
    let (e, took) = connect_error(&rt, &wrong);
    let text = e.to_string();
    assert!(
        matches!(e, LockError::Backend(_) | LockError::Config(_)) && text.contains("password"),
        "wrong password: {e:?}"
    );
    assert!(
        !text.contains("wrong"),
        "the password is in the message: {text}"
    );
    assert!(took < bound, "wrong password: {took:?}");

    let (e, took) = connect_error(&rt, &pg.url_for("no_such_db"));
    assert!(
        matches!(e, LockError::Backend(_) | LockError::Config(_))
            && e.to_string().contains("no_such_db"),
        "missing database: {e:?}"
    );
    assert!(took < bound, "missing database: {took:?}");
}

/// A role that may not create the tables (PostgreSQL 15 grants nobody
/// CREATE on `public`): `connect` is a `Config` error that quotes the SQL
/// to apply by hand.
#[test]
fn a_role_without_create_gets_the_sql_to_apply() {
    let rt = rt();
    let pg = PostgresServer::shared();
    let db = pg.fresh_database();
    let role = unique("nocreate").replace('-', "_");
    pg.create_role(&role, None, "");
    pg.psql_in(&db, "REVOKE CREATE ON SCHEMA public FROM PUBLIC");
    let url = format!("postgres://{role}@127.0.0.1:{}/{db}", pg.port());
    let (e, took) = connect_error(&rt, &url);
    let LockError::Config(text) = &e else {
        panic!("expected Config, got {e:?}");
    };
    assert!(
        text.contains("CREATE TABLE IF NOT EXISTS lock_holders"),
        "the error does not quote the schema: {text}"
    );
    assert!(took < Duration::from_secs(5), "{took:?}");

    // Applied by hand (the SQL the error quotes), the role can lock.
    let schema = include_str!("../../lock-runtime/sql/schema.sql");
    pg.psql_in(&db, schema);
    for f in std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../lock-runtime/sql"))
        .unwrap()
        .flatten()
        .filter(|f| f.file_name() != "schema.sql")
    {
        pg.psql_in(&db, &std::fs::read_to_string(f.path()).unwrap());
    }
    pg.psql_in(
        &db,
        &format!("GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {role}"),
    );
    let client = rt.block_on(LockClient::connect(&url)).unwrap();
    let g = rt
        .block_on(client.lock(unique("byhand")).into_future())
        .unwrap();
    rt.block_on(g.release()).unwrap();
}

/// A database whose lock tables are of an earlier layout (before a name's
/// counter moved into its slot 0): `CREATE TABLE IF NOT EXISTS` keeps the
/// old table, so the client says what to drop instead of failing each call.
#[test]
fn tables_of_an_earlier_layout_get_a_config_error() {
    let rt = rt();
    let pg = PostgresServer::shared();
    let db = pg.fresh_database();
    pg.psql_in(
        &db,
        "CREATE TABLE lock_holders (name text NOT NULL, slot integer NOT NULL, \
         owner text NOT NULL, kind \"char\" NOT NULL, lease_end timestamptz NOT NULL, \
         fence bigint NOT NULL, kept boolean NOT NULL DEFAULT false, handed_by text, \
         PRIMARY KEY (name, slot))",
    );
    let url = format!("postgres://postgres@127.0.0.1:{}/{db}", pg.port());
    let (e, took) = connect_error(&rt, &url);
    let LockError::Config(text) = &e else {
        panic!("expected Config, got {e:?}");
    };
    assert!(text.contains("earlier layout"), "{text}");
    assert!(text.contains("drop the tables lock_holders"), "{text}");
    assert!(took < Duration::from_secs(5), "{took:?}");
}

/// `statement_timeout` and `idle_in_transaction_session_timeout` set on the
/// role (1 ms, as a strict DBA might): each lock call ends within its
/// bound, `Ok` or a clear error, never a hang.
#[test]
fn role_timeouts_give_results_or_clear_errors_in_bounded_time() {
    let rt = rt();
    let pg = PostgresServer::shared();
    for setting in ["statement_timeout", "idle_in_transaction_session_timeout"] {
        let db = pg.fresh_database();
        let role = unique("strict").replace('-', "_");
        pg.create_role(&role, None, "SUPERUSER");
        pg.psql(&format!("ALTER ROLE {role} SET {setting} = '1ms'"));
        let url = format!("postgres://{role}@127.0.0.1:{}/{db}", pg.port());
        let started = Instant::now();
        let out = rt.block_on(async {
            let client = LockClient::builder()
                .connect_timeout(Duration::from_secs(2))
                .op_timeout(Duration::from_secs(2))
                .connect(&url)
                .await?;
            for _ in 0..20 {
                let g = client
                    .lock(unique("strict"))
                    .wait(Duration::from_secs(2))
                    .await?;
                g.release().await?;
            }
            Ok::<_, LockError>(())
        });
        let took = started.elapsed();
        println!("{setting} = 1ms on the role: {out:?} in {took:?}");
        assert!(took < Duration::from_secs(30), "{setting}: {took:?}");
        if let Err(e) = out {
            assert!(
                matches!(e, LockError::Backend(_) | LockError::Config(_))
                    && e.to_string().contains(setting.split('_').next().unwrap()),
                "{setting}: {e:?}"
            );
        }
    }
}

/// Renewals are HOT updates (no index covers the lease end), and once
/// vacuumed the tables take no new space for the same churn. The sizes are
/// printed; 10^6 cycles are the bench's (`scripts/bench.sh`).
#[test]
fn renewals_stay_hot_and_cycles_leave_the_tables_small() {
    let rt = rt();
    let pg = PostgresServer::shared();
    let db = pg.fresh_database();
    let url = pg.url_for(&db);
    let client = rt
        .block_on(
            LockClient::builder()
                .lease(Duration::from_millis(600))
                .connect(&url),
        )
        .unwrap();
    // 200 holds renewed every ~200 ms for 3 s.
    let held: Vec<_> = (0..200)
        .map(|_| {
            rt.block_on(client.lock(unique("hot")).into_future())
                .unwrap()
        })
        .collect();
    std::thread::sleep(Duration::from_secs(3));
    assert!(held.iter().all(|g| !g.is_lost()));
    for g in held {
        rt.block_on(g.release()).unwrap();
    }
    let size_of = |t: &str| pg.table_size_in(&db, t);
    // One caller cycles the names: while a transaction of the database is
    // open, no row version it might see can be pruned, so concurrent
    // callers descheduled mid-call on a loaded machine push HOT updates
    // onto new pages for as long as they stall. The bench's P6 measures
    // 10^6 cycles of 32 tasks (`scripts/bench.sh`).
    let cycles = |n: usize| {
        let keys: Vec<String> = (0..50).map(|_| unique("cycle")).collect();
        rt.block_on(async {
            for i in 0..n {
                // (A lease of its own: the client's 600 ms, for the
                // renewals above, lapsed under a loaded machine.)
                let g = client
                    .lock(&keys[i % keys.len()])
                    .lease(Duration::from_secs(30))
                    .await
                    .unwrap();
                g.release().await.unwrap();
            }
        });
    };
    // A cycle updates its name's slot in place (HOT); what pruning leaves,
    // vacuum (autovacuum, every minute by default) makes reusable: after
    // one vacuum the same churn needs no new space.
    let vacuum = || pg.psql_in(&db, "VACUUM lock_holders");
    cycles(2_000);
    let unvacuumed = size_of("lock_holders");
    vacuum();
    cycles(2_000);
    vacuum();
    let after_first = size_of("lock_holders");
    for _ in 0..2 {
        cycles(2_000);
        vacuum();
    }
    let after_all = size_of("lock_holders");
    rt.block_on(client.close(Duration::from_secs(1)));
    drop(client);
    // A backend reports its table statistics when it ends.
    rt.block_on(async {
        assert!(eventually(Duration::from_secs(10), || pg.connections_to(&db) == 0).await);
    });
    let stats = pg.query_in(
        &db,
        "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = 'lock_holders'",
    );
    let (upd, hot): (u64, u64) = (stats[0][0].parse().unwrap(), stats[0][1].parse().unwrap());
    println!(
        "lock_holders: {upd} updates, {hot} HOT; 2,000 cycles on 50 names without vacuum: \
         {} kB; vacuumed after each 2,000, after 4,000 / 8,000: {} / {} kB",
        unvacuumed / 1024,
        after_first / 1024,
        after_all / 1024,
    );
    assert!(upd >= 2_000, "the renewals were not counted: {upd}");
    assert!(hot * 10 >= upd * 9, "only {hot} of {upd} updates were HOT");
    assert!(
        after_all <= after_first + after_first / 4 + 65_536,
        "vacuumed, lock_holders still grew from {after_first} to {after_all} bytes"
    );
}

/// docs/POSTGRES.md prints every SQL file the client runs, as it is: a
/// team that migrates by hand applies what the client would.
#[test]
fn docs_print_the_sql_the_client_runs() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    let doc = std::fs::read_to_string(format!("{root}/docs/POSTGRES.md")).unwrap();
    let mut files = 0;
    for f in std::fs::read_dir(format!("{root}/lock-runtime/sql"))
        .unwrap()
        .flatten()
    {
        let name = f.file_name().to_string_lossy().into_owned();
        let sql = std::fs::read_to_string(f.path()).unwrap();
        let block = format!(
            "`lock-runtime/sql/{name}`:\n\n```sql\n{}\n```",
            sql.trim_end()
        );
        assert!(
            doc.contains(&block),
            "docs/POSTGRES.md does not print lock-runtime/sql/{name} as it is \
             (copy it between the schema markers)"
        );
        files += 1;
    }
    assert!(files >= 2, "no SQL files found");
}

/// `sslmode=require` (the `tls` feature): every connection of the client,
/// the listening one too, goes over TLS, and the server's certificate is
/// verified: against the client's private CA it connects; with only the
/// platform's roots it is refused, never sent in clear; a server without
/// TLS is refused too. Before, such a URL was a `Config` error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sslmode_require_goes_over_verified_tls() {
    let certs = tests::tls::Certs::make();
    // The server's key, as the server's user wants it (its own, 0600).
    for (from, to) in [("server.crt", "pg.crt"), ("server.key", "pg.key")] {
        let ok = std::process::Command::new("install")
            .args([
                "-o",
                "postgres",
                "-m",
                "600",
                &certs.path(from),
                &certs.path(to),
            ])
            .status()
            .unwrap()
            .success();
        assert!(ok, "install {to}");
    }
    let pg = PostgresServer::options()
        .setting("ssl", "on")
        .setting("ssl_cert_file", &certs.path("pg.crt"))
        .setting("ssl_key_file", &certs.path("pg.key"))
        .start();
    let url = format!("{}?sslmode=require", pg.url());
    let client = LockClient::builder()
        .tls_root_ca(&certs.ca_pem())
        .connect(&url)
        .await
        .expect("connect over TLS");
    let key = unique("tls");
    let held = client.lock(&key).await.unwrap();
    // A waiter: the listening connection opens too.
    let waiter = tokio::spawn({
        let (client, key) = (client.clone(), key.clone());
        async move { client.lock(&key).wait(Duration::from_secs(20)).await }
    });
    assert!(eventually(Duration::from_secs(10), || client.waiting_here(&key) == 1).await);
    let sessions = |tls: bool| {
        pg.number_in(
            "postgres",
            &format!(
                "SELECT count(*) FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid) \
                 WHERE a.application_name = 'lock-runtime' AND s.ssl = {tls}"
            ),
        )
    };
    assert!(
        sessions(true) >= 2,
        "the pool's and the listener's sessions over TLS"
    );
    assert_eq!(sessions(false), 0, "a session in clear");
    held.release().await.unwrap();
    let handed = waiter
        .await
        .unwrap()
        .expect("handed over through the listener");
    handed.release().await.unwrap();
    client.close(Duration::from_secs(5)).await;

    // The platform's roots do not know this CA: refused, in bounded time.
    let started = Instant::now();
    let err = LockClient::builder()
        .connect_timeout(Duration::from_secs(2))
        .connect(&url)
        .await
        .map(drop)
        .unwrap_err();
    assert!(matches!(err, LockError::Backend(_)), "{err:?}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );

    // A server without TLS: refused, not used in clear.
    let plain = PostgresServer::start();
    let err = LockClient::builder()
        .tls_root_ca(&certs.ca_pem())
        .connect(&format!("{}?sslmode=require", plain.url()))
        .await
        .map(drop)
        .unwrap_err();
    assert!(matches!(err, LockError::Backend(_)), "{err:?}");
}
