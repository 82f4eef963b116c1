//! What the PostgreSQL engine promises beyond the shared checks, each
//! against a real server: a statement sent twice grants nothing twice; a
//! dead waiter does not stall the lock; one statement per lock and one per
//! unlock; renewals stay HOT; nothing stays per lock name after its
//! fence_ttl; connections killed under held locks lose nothing; clear
//! errors for a missing server, a wrong password, a missing database, a
//! role without CREATE (quoting the SQL to apply) and timeouts on the role.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use lock_runtime::{LockClient, LockError};
use tests::postgres::PostgresServer;
use tests::{eventually, spawn_tied, unique};

/// A fresh database of the shared server: (its name, its URL).
fn fresh() -> (&'static PostgresServer, String, String) {
    let server = PostgresServer::shared();
    let db = server.fresh_database();
    let url = server.url_for(&db);
    (server, db, url)
}

fn name(key: &str) -> String {
    format!("lock:{{{key}}}")
}

/// A connection of its own to `url`, outside any lock client.
async fn session(url: &str) -> tokio_postgres::Client {
    let (c, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    c
}

/// Until session `pid` waits for a row lock, or `call` (its statement)
/// has answered; fails after 10 s of neither.
async fn waits_on_a_row_lock<T>(
    watcher: &tokio_postgres::Client,
    pid: i32,
    call: &tokio::task::JoinHandle<T>,
) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let waiting: bool = watcher
            .query_one(
                "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = $1",
                &[&pid],
            )
            .await
            .unwrap()
            .get::<_, Option<bool>>(0)
            .unwrap_or(false);
        if waiting || call.is_finished() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the statement neither waited nor answered"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The acquire function as a client sends it: (status, token).
fn acquire_sql(server: &PostgresServer, db: &str, key: &str, owner: &str) -> (i64, i64) {
    let row = server.query_in(
        db,
        &format!(
            "SELECT status, token FROM lock_acquire_v1('{}', '{owner}', 'w', 0, 30000, NULL, false, true, 'lock_x', 86400000)",
            name(key)
        ),
    );
    (row[0][0].parse().unwrap(), row[0][1].parse().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_statement_sent_twice_grants_nothing_twice() {
    let (server, db, url) = fresh();
    let client = LockClient::builder()
        .retry_delay(Duration::from_secs(60))
        .connect(&url)
        .await
        .unwrap();
    let key = unique("twice");
    // An acquire whose reply was lost, sent again: the same hold, the same
    // token.
    let (first, token) = acquire_sql(server, &db, &key, "lost:1");
    assert_eq!(first, 1, "taken");
    assert_eq!(acquire_sql(server, &db, &key, "lost:1"), (2, token));
    // A waiter of a real client queues behind it.
    let waiter = tokio::spawn({
        let (c, key) = (client.clone(), key.clone());
        async move { c.lock(&key).wait(Duration::from_secs(20)).await }
    });
    assert!(
        eventually(Duration::from_secs(10), || client.waiting_here(&key) == 1).await,
        "the waiter never parked"
    );
    // A release whose reply was lost, sent again: it handed the lock over
    // once, and the second send says released (not "someone else's").
    let release = format!("SELECT lock_release_v1('{}', 'lost:1', false)", name(&key));
    assert_eq!(server.psql_in(&db, &release), "1");
    assert_eq!(
        server.psql_in(&db, &release),
        "1",
        "the resend knows it ran"
    );
    let guard = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("handed over by the NOTIFY")
        .unwrap()
        .unwrap();
    assert!(guard.fence() > token as u64);
    let info = client.inspect(&key).await.unwrap().unwrap();
    assert_eq!(info.holders, [guard.holder()], "one holder, granted once");
    guard.release().await.unwrap();
    assert!(client.inspect(&key).await.unwrap().is_none());
}

/// A waiter whose process died while queued is passed over by the release
/// at once (its client's listening session is gone), not after the lease
/// its grant would have had.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_waiter_does_not_stall_the_lock() {
    let (_, _, url) = fresh();
    let a = LockClient::connect(&url).await.unwrap();
    let b = LockClient::builder()
        .retry_delay(Duration::from_secs(60))
        .connect(&url)
        .await
        .unwrap();
    let key = unique("dead-waiter");
    let holder = a.lock(&key).await.unwrap();
    let mut worker = spawn_tied({
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_lock_worker"));
        cmd.args(["hold", &url, &key, "30000"])
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        cmd
    })
    .unwrap();
    let waiters = |n: usize| {
        let (a, key) = (a.clone(), key.clone());
        async move {
            let deadline = Instant::now() + Duration::from_secs(15);
            while Instant::now() < deadline {
                if a.inspect(&key).await.unwrap().map_or(0, |i| i.waiters) == n {
                    return true;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            false
        }
    };
    assert!(waiters(1).await, "the worker did not queue");
    let next = tokio::spawn({
        let (b, key) = (b.clone(), key.clone());
        async move { b.lock(&key).wait(Duration::from_secs(20)).await }
    });
    assert!(
        eventually(Duration::from_secs(10), || b.waiting_here(&key) == 1).await,
        "the second waiter did not park"
    );
    worker.kill().unwrap();
    worker.wait().unwrap();
    // The worker's session ends with its process.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let released = Instant::now();
    holder.release().await.unwrap();
    let guard = tokio::time::timeout(Duration::from_secs(10), next)
        .await
        .expect("the live waiter was served, not the dead one")
        .unwrap()
        .unwrap();
    println!("served {:?} after the release", released.elapsed());
    guard.release().await.unwrap();
}

/// Uncontended, a lock is one statement and its release one more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_statement_per_lock_and_one_per_unlock() {
    let (server, db, url) = fresh();
    let client = LockClient::connect(&url).await.unwrap();
    let key = unique("trips");
    // Connected and the schema in place before counting.
    client.lock(&key).await.unwrap().release().await.unwrap();
    if !tests::postgres::has_pg_stat_statements() {
        println!("pg_stat_statements is not installed: statements not counted");
        return;
    }
    server.reset_statements();
    for _ in 0..10 {
        client.lock(&key).await.unwrap().release().await.unwrap();
    }
    assert_eq!(server.statements_in(&db), 20);
}

/// Over a connection that reaches the server itself, a lock statement is
/// prepared once per connection (beside the first calls, which go unnamed
/// meanwhile), then only bound: PostgreSQL plans a prepared statement for
/// its first five runs and then keeps a generic plan. Through anything in between (a TCP proxy, a real
/// `pgbouncer` in transaction mode) every call stays an unnamed statement,
/// planned each time: a pooler may run it on a session where another
/// process prepared a different statement under the same name. Before,
/// every call was planned wherever it went.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statements_are_prepared_only_where_the_server_is_reached_directly() {
    if !tests::postgres::has_pg_stat_statements() {
        println!("pg_stat_statements is not installed: plans not counted");
        return;
    }
    let server = PostgresServer::shared();
    let proxy = tests::proxy::Proxy::start(server.port());
    let bouncer = tests::postgres::PgBouncer::start(server, 2);
    let mut plans = Vec::new();
    for via in ["direct", "proxy", "pgbouncer"] {
        let db = server.fresh_database();
        server.psql(&format!(
            "ALTER DATABASE {db} SET pg_stat_statements.track_planning = on"
        ));
        let url = match via {
            "direct" => server.url_for(&db),
            "proxy" => format!("postgres://postgres@127.0.0.1:{}/{db}", proxy.port()),
            _ => bouncer.url_for(&db),
        };
        let client = LockClient::connect(&url).await.unwrap();
        let key = unique("prepared");
        for _ in 0..30 {
            client.lock(&key).await.unwrap().release().await.unwrap();
        }
        let row = server.query_in(
            "postgres",
            &format!(
                "SELECT coalesce(sum(calls), 0)::bigint, coalesce(sum(plans), 0)::bigint \
                 FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid \
                 WHERE d.datname = '{db}' AND s.query LIKE '%lock_acquire_v1(%' \
                 AND s.query NOT LIKE '%pg_stat%'"
            ),
        );
        let (calls, planned): (i64, i64) = (row[0][0].parse().unwrap(), row[0][1].parse().unwrap());
        assert!(calls >= 30, "{via}: {calls} acquires counted");
        plans.push((via, planned));
    }
    // (The first calls on a new connection go unnamed while it is found
    // direct and the statement prepared beside them.)
    assert!(plans[0].1 <= 12, "30 acquires planned: {plans:?}");
    assert!(
        plans[1..].iter().all(|(_, n)| *n >= 30),
        "30 acquires planned (prepared where they must not be?): {plans:?}"
    );
}

/// The HOT share of a table's updates, once the server has counted at
/// least `least` updates: (updates, HOT updates).
async fn updates(server: &PostgresServer, db: &str, table: &str, least: i64) -> (i64, i64) {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let row = server.query_in(
            db,
            &format!(
                "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = '{table}'"
            ),
        );
        let (upd, hot): (i64, i64) = (row[0][0].parse().unwrap(), row[0][1].parse().unwrap());
        if upd >= least || Instant::now() > deadline {
            return (upd, hot);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Renewals move only the lease end, which no index covers: every one is a
/// heap-only update, and the table does not grow with them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewals_are_hot_updates() {
    let (server, db, url) = fresh();
    let client = LockClient::connect(&url).await.unwrap();
    let mut guards = Vec::new();
    for i in 0..20 {
        let g = client
            .lock(format!("hot:{i}"))
            .lease(Duration::from_millis(600))
            .await
            .unwrap();
        guards.push(g);
    }
    let size =
        |server: &PostgresServer| server.number_in(&db, "SELECT pg_relation_size('lock_holders')");
    let before = size(server);
    // About ten renewal ticks of every hold.
    tokio::time::sleep(Duration::from_secs(2)).await;
    for g in guards {
        g.release().await.expect("renewed throughout");
    }
    let (upd, hot) = updates(server, &db, "lock_holders", 100).await;
    assert!(upd >= 100, "only {upd} renewals counted");
    assert!(hot * 100 >= upd * 95, "{hot} of {upd} renewals were HOT");
    assert_eq!(size(server), before, "renewals grew the table");
}

/// A lock cycle takes the name's free slot and frees it again: HOT updates,
/// no row inserted or deleted per cycle. Before, each cycle inserted a row
/// and deleted it; the dead rows of a busy name piled up faster than
/// autovacuum came by, and every later call on the name scanned them (a
/// cycle on one name grew from 1.8 to 3 ms within 16 s of pgbench).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_cycles_reuse_the_name_s_slot() {
    let (server, db, url) = fresh();
    let client = LockClient::connect(&url).await.unwrap();
    let key = tests::unique("slot");
    for _ in 0..300 {
        client.lock(&key).await.unwrap().release().await.unwrap();
    }
    let (upd, hot) = updates(server, &db, "lock_holders", 599).await;
    let row = server.query_in(
        &db,
        "SELECT n_tup_ins, n_tup_del FROM pg_stat_user_tables WHERE relname = 'lock_holders'",
    );
    let (ins, del): (i64, i64) = (row[0][0].parse().unwrap(), row[0][1].parse().unwrap());
    assert!(ins <= 1, "{ins} rows inserted for 300 cycles of one name");
    assert_eq!(del, 0, "{del} rows deleted for 300 cycles of one name");
    assert!(upd >= 599, "only {upd} updates counted");
    assert!(
        hot * 100 >= upd * 95,
        "{hot} of {upd} cycle updates were HOT"
    );
}

/// A release that hands nothing over commits without waiting for the WAL
/// flush: lost in a crash, it leaves the lock held until its lease ends,
/// which costs time and no safety. One that serves a queue, and an
/// operator's forced release, wait for the flush as grants do. Before, every
/// release waited: a flush per release, the larger share of an uncontended
/// unlock's time with `fsync` on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_release_that_hands_nothing_over_skips_the_flush() {
    let (server, db, url) = fresh();
    // The schema, as a client creates it.
    LockClient::connect(&url).await.unwrap();
    let key = name(&unique("flush"));
    // A name per case: `owner` on `key`:`owner`.
    let acquire = |owner: &str, on: &str, stay: &str| {
        format!(
            "SELECT status FROM lock_acquire_v1('{key}:{on}', '{owner}', 'w', 0, 30000, {stay}, false, true, 'lock_x', 86400000);"
        )
    };
    let release = |owner: &str, forced: bool| {
        format!("SELECT lock_release_v1('{key}:{owner}', '{owner}', {forced});")
    };
    // Each case in one transaction, the setting read before its commit.
    let commit_waits = |calls: String| {
        let out = server.psql_in(
            &db,
            &format!("BEGIN; {calls} SHOW synchronous_commit; COMMIT;"),
        );
        out.lines().last().unwrap_or_default().to_string()
    };
    assert_eq!(
        commit_waits("SELECT 1;".into()),
        "on",
        "the server's default"
    );
    let plain = acquire("a", "a", "NULL") + &release("a", false);
    assert_eq!(commit_waits(plain), "off", "a release nobody waits behind");
    let queued = acquire("c", "c", "NULL") + &acquire("d", "c", "30000") + &release("c", false);
    assert_eq!(commit_waits(queued), "on", "a release with a waiter queued");
    let forced = acquire("e", "e", "NULL") + &release("e", true);
    assert_eq!(commit_waits(forced), "on", "a forced release");
}

/// A renewal in flight when the lease runs out (it checked the hold in
/// time, and its commit is slow: a WAL flush, a synchronous standby) keeps
/// the hold: an acquire that reads the lease as over waits for that
/// renewal, sees the new lease, and answers busy. Before, the acquire read
/// the slot as free without waiting, took it when the renewal committed,
/// and both held the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_waits_for_a_renewal_in_flight() {
    let (server, db, url) = fresh();
    let connect = || session(&url);
    // The schema, as a client creates it.
    LockClient::connect(&url).await.unwrap();
    let key = name(&unique("inflight"));
    let acquire = |owner: &str| {
        format!(
            "SELECT status FROM lock_acquire_v1('{key}', '{owner}', 'w', 0, 300, NULL, false, true, 'lock_x', 86400000)"
        )
    };
    let a = connect().await;
    let took: i32 = a.query_one(&acquire("a"), &[]).await.unwrap().get(0);
    assert_eq!(took, 1);
    // The renewal of `a`, its row updated and not yet committed...
    a.batch_execute(&format!(
        "BEGIN; UPDATE lock_holders SET lease_end = clock_timestamp() + interval '30 s' \
         WHERE name = '{key}' AND owner = 'a'"
    ))
    .await
    .unwrap();
    // ...while the lease runs out (time is the subject: 300 ms).
    tokio::time::sleep(Duration::from_millis(600)).await;
    let b = connect().await;
    let b_pid: i32 = b
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    let sql = acquire("b");
    let asked =
        tokio::spawn(async move { b.query_one(&sql, &[]).await.map(|r| r.get::<_, i32>(0)) });
    // The acquire waits on the renewal's row.
    waits_on_a_row_lock(&connect().await, b_pid, &asked).await;
    a.batch_execute("COMMIT").await.unwrap();
    let status = asked.await.unwrap().unwrap();
    assert_eq!(status, 0, "granted over a hold whose renewal was in flight");
    let holders = server.query_in(
        &db,
        &format!(
            "SELECT owner FROM lock_holders WHERE name = '{key}' AND lease_end > clock_timestamp()"
        ),
    );
    assert_eq!(holders, [["a"]], "the renewed hold is a's alone");
}

/// An acquire sent again (its reply lost) by an owner whose hold is live,
/// while its watchdog's renewal holds that hold's row and goes on to a
/// lapsed hold of the same name: the acquire locks the owner's slot and
/// the lapsed ones in slot order, as the renewal does, so it waits for the
/// renewal instead of holding the lapsed slot the renewal needs. Before,
/// it locked the lapsed slot first, then waited for its own: a deadlock,
/// which the server broke after `deadlock_timeout` by failing one of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resent_acquire_and_a_renewal_lock_in_one_order() {
    let (_server, _db, url) = fresh();
    LockClient::connect(&url).await.unwrap();
    let key = name(&unique("order"));
    let acquire = |owner: &str, lease_ms: u32| {
        format!(
            "SELECT status FROM lock_acquire_v1('{key}', '{owner}', 'r', 0, {lease_ms}, \
             NULL, false, true, 'lock_x', 86400000)"
        )
    };
    let c = session(&url).await;
    // Readers in slots 0, 1 and 2; y's lease is short.
    for (owner, lease) in [("z", 30_000), ("x", 30_000), ("y", 300)] {
        let took: i32 = c
            .query_one(&acquire(owner, lease), &[])
            .await
            .unwrap()
            .get(0);
        assert_eq!(took, 1, "{owner}");
    }
    let y_live = format!(
        "SELECT count(*) FROM lock_holders WHERE name = '{key}' AND owner = 'y' \
         AND lease_end > clock_timestamp()"
    );
    while c.query_one(&y_live, &[]).await.unwrap().get::<_, i64>(0) == 1 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // x's renewal has x's row...
    let renewal = session(&url).await;
    renewal
        .batch_execute(&format!(
            "BEGIN; UPDATE lock_holders SET lease_end = clock_timestamp() + interval '30 s' \
             WHERE name = '{key}' AND owner = 'x'"
        ))
        .await
        .unwrap();
    // ...when x's acquire comes again.
    let resend = session(&url).await;
    let pid: i32 = resend
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    let sql = acquire("x", 30_000);
    let resent = tokio::spawn(async move {
        resend
            .query_one(&sql, &[])
            .await
            .map(|r| r.get::<_, i32>(0))
    });
    waits_on_a_row_lock(&session(&url).await, pid, &resent).await;
    // The renewal goes on to y's lapsed row, and commits.
    let next = renewal
        .execute(
            &format!(
                "UPDATE lock_holders SET lease_end = lease_end \
                 WHERE name = '{key}' AND owner = 'y'"
            ),
            &[],
        )
        .await;
    assert!(next.is_ok(), "the renewal failed: {next:?}");
    renewal.batch_execute("COMMIT").await.unwrap();
    let status = resent.await.unwrap();
    assert!(
        matches!(status, Ok(2)),
        "the resent acquire did not find its hold: {status:?}"
    );
}

/// A renewal that found a lease live, then waited for a row lock elsewhere
/// in its batch while that lease ran out: another call found the hold over
/// (it only locked its row) and let a writer take the name. The renewal,
/// once it has the rows, checks each lease again and does not bring the
/// hold back. Before, it extended the lapsed reader's lease beside the
/// writer's hold: both held the name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_that_waited_does_not_revive_a_lapsed_hold() {
    let (server, db, url) = fresh();
    let connect = || session(&url);
    LockClient::connect(&url).await.unwrap();
    let tag = unique("revive");
    // `first` sorts before `shared`: the renewal locks it first.
    let (first, shared) = (name(&format!("{tag}:a")), name(&format!("{tag}:b")));
    let acquire = |key: &str, owner: &str, kind: &str, lease_ms: u32| {
        format!(
            "SELECT status FROM lock_acquire_v1('{key}', '{owner}', '{kind}', 0, {lease_ms}, \
             NULL, false, true, 'lock_x', 86400000)"
        )
    };
    let c = connect().await;
    for (key, owner, kind, lease) in [
        (&first, "w", "w", 30_000),
        (&shared, "r0", "r", 30_000),
        (&shared, "r1", "r", 1_500),
    ] {
        let took: i32 = c
            .query_one(&acquire(key, owner, kind, lease), &[])
            .await
            .unwrap()
            .get(0);
        assert_eq!(took, 1, "{owner}");
    }
    // Someone holds the first name's row (a transaction of the user's).
    let blocker = connect().await;
    blocker
        .batch_execute(&format!(
            "BEGIN; SELECT 1 FROM lock_holders WHERE name = '{first}' AND slot = 0 FOR UPDATE"
        ))
        .await
        .unwrap();
    // The watchdog's batch: the first name's writer and r1, while r1 is live.
    let renewer = connect().await;
    let renewer_pid: i32 = renewer
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    let sql = format!(
        "SELECT lock_renew_v1(ARRAY['{first}', '{shared}'], ARRAY['w', 'r1'], \
         ARRAY[30000, 30000]::bigint[])"
    );
    let renewed = tokio::spawn(async move {
        renewer
            .query(&sql, &[])
            .await
            .map(|rows| rows.iter().map(|r| r.get::<_, i64>(0)).collect::<Vec<_>>())
    });
    waits_on_a_row_lock(&connect().await, renewer_pid, &renewed).await;
    assert!(
        !renewed.is_finished(),
        "the renewal did not wait for the row"
    );
    // The renewal found r1 live (it waits with r1 in its batch), and r1's
    // lease now runs out: watched on the database's clock.
    let r1_live = format!(
        "SELECT count(*) FROM lock_holders WHERE name = '{shared}' AND owner = 'r1' \
         AND lease_end > clock_timestamp()"
    );
    let r1_is_live = || async { c.query_one(&r1_live, &[]).await.unwrap().get::<_, i64>(0) == 1 };
    assert!(
        r1_is_live().await,
        "r1 lapsed before the renewal waited: too slow to test"
    );
    while r1_is_live().await {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // r0 leaves: the name has no live slot but r1's lapsed one, and a
    // writer takes it (the client's fast path).
    let left: i32 = c
        .query_one(
            &format!("SELECT lock_release_v1('{shared}', 'r0', false)"),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(left, 1);
    let writer = LockClient::connect(&url).await.unwrap();
    let held = writer
        .lock(format!("{tag}:b"))
        .wait(Duration::ZERO)
        .await
        .expect("the writer takes the name once r1's lease is over");
    blocker.batch_execute("COMMIT").await.unwrap();
    let renewed = renewed.await.unwrap().unwrap();
    assert_eq!(renewed, [1], "only the first name's writer is renewed");
    let live = server.query_in(
        &db,
        &format!(
            "SELECT owner FROM lock_holders WHERE name = '{shared}' \
             AND lease_end > clock_timestamp() ORDER BY owner"
        ),
    );
    assert_eq!(live.len(), 1, "the writer's hold alone: {live:?}");
    assert_ne!(live[0][0], "r1", "{live:?}");
    held.release().await.unwrap();
}

/// A lock name nobody holds or waits for leaves nothing once its fence row
/// has expired (fence_ttl after its last acquisition, and no later than
/// half of it again): later calls sweep it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_stays_per_lock_name_after_its_fence_ttl() {
    let (server, db, url) = fresh();
    let client = LockClient::builder()
        .fence_ttl(Duration::from_secs(1))
        .connect(&url)
        .await
        .unwrap();
    let tag = unique("swept");
    for i in 0..10 {
        client
            .lock(format!("{tag}:{i}"))
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
    }
    let rows = || {
        server.number_in(
            &db,
            &format!(
                "SELECT (SELECT count(*) FROM lock_holders WHERE name LIKE '%{tag}%') \
                      + (SELECT count(*) FROM lock_waiters WHERE name LIKE '%{tag}%')"
            ),
        )
    };
    assert_eq!(
        rows(),
        10,
        "each name's slot 0 (its counter, free) stays for its fence_ttl"
    );
    // Time is the subject: the rows may go 1.5 s after their last use.
    tokio::time::sleep(Duration::from_millis(1800)).await;
    for _ in 0..6 {
        client.lock("other").await.unwrap().release().await.unwrap();
    }
    assert_eq!(rows(), 0, "nothing kept for names nobody uses");
}

/// `pg_terminate_backend` of every connection every 300 ms while a lock is
/// held: the hold is a row, not a session, so it is never lost, and nobody
/// else gets it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_killed_under_a_held_lock_lose_nothing() {
    let server = PostgresServer::start();
    let url = server.url();
    let a = LockClient::connect(&url).await.unwrap();
    let b = LockClient::connect(&url).await.unwrap();
    let key = unique("killed");
    let guard = a
        .lock(&key)
        .lease(Duration::from_millis(900))
        .await
        .unwrap();
    let killer = std::thread::spawn({
        let port = server.port();
        move || {
            let mut killed = 0;
            let until = Instant::now() + Duration::from_secs(3);
            while Instant::now() < until {
                killed += terminate(port);
                std::thread::sleep(Duration::from_millis(300));
            }
            killed
        }
    });
    let mut tries = 0;
    while !killer.is_finished() {
        match b.lock(&key).wait(Duration::from_millis(300)).await {
            Err(LockError::Timeout { .. }) => tries += 1,
            other => panic!("the held lock was {other:?}"),
        }
    }
    let killed = killer.join().unwrap();
    assert!(killed >= 5, "only {killed} connections terminated");
    assert!(!guard.is_lost());
    guard.release().await.expect("still held after the kills");
    println!("{killed} connections terminated, {tries} busy attempts meanwhile");
    drop(server);
}

/// `pg_terminate_backend` of every client connection of the server on
/// `port`, from a connection of its own.
fn terminate(port: u16) -> usize {
    let out = Command::new("psql")
        .args([
            "-h",
            "127.0.0.1",
            "-p",
            &port.to_string(),
            "-U",
            "postgres",
            "-d",
            "postgres",
        ])
        .args(["-X", "-q", "-A", "-t", "-c"])
        .arg(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
             WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()",
        )
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .unwrap_or(0)
}

fn within<T>(limit: Duration, started: Instant, out: T) -> T {
    assert!(started.elapsed() < limit, "took {:?}", started.elapsed());
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clear_errors_in_bounded_time() {
    let quick = || {
        LockClient::builder()
            .connect_timeout(Duration::from_secs(1))
            .op_timeout(Duration::from_secs(1))
    };
    // No server.
    let port = tests::free_port();
    let t = Instant::now();
    let err = quick()
        .connect(&format!("postgres://postgres@127.0.0.1:{port}/postgres"))
        .await
        .unwrap_err();
    let err = within(Duration::from_secs(4), t, err);
    assert!(matches!(err, LockError::Backend(_)), "{err:?}");

    let server = PostgresServer::options().password("right").start();
    let url_with = |user: &str, password: &str, db: &str| {
        format!(
            "postgres://{user}:{password}@127.0.0.1:{}/{db}",
            server.port()
        )
    };
    // A wrong password.
    let t = Instant::now();
    let err = quick()
        .connect(&url_with("postgres", "wrong", "postgres"))
        .await
        .unwrap_err();
    let err = within(Duration::from_secs(4), t, err);
    assert!(err.to_string().contains("password"), "{err}");
    // A missing database.
    let t = Instant::now();
    let err = quick()
        .connect(&url_with("postgres", "right", "nowhere"))
        .await
        .unwrap_err();
    let err = within(Duration::from_secs(4), t, err);
    assert!(err.to_string().contains("does not exist"), "{err}");

    // A role that may not create the tables: a Config error quoting them.
    let db = server.fresh_database();
    server.create_role("app", Some("pw"), "");
    let err = quick()
        .connect(&url_with("app", "pw", &db))
        .await
        .unwrap_err();
    let LockError::Config(message) = &err else {
        panic!("{err:?}");
    };
    assert!(
        message.contains("CREATE TABLE IF NOT EXISTS lock_holders")
            && message.contains("CREATE OR REPLACE FUNCTION lock_acquire_v1"),
        "{message}"
    );
    // Applied by hand (as the docs say), the role locks.
    let sql = message.split_once(":\n").unwrap().1;
    server.psql_in(&db, &format!("BEGIN;\n{sql}\nCOMMIT;"));
    server.psql_in(
        &db,
        "GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO app",
    );
    // Timeouts set on the role change nothing: no statement waits, and no
    // transaction stays open between statements.
    server.psql(
        "ALTER ROLE app SET statement_timeout = '50ms'; \
         ALTER ROLE app SET idle_in_transaction_session_timeout = '50ms'",
    );
    // (Connecting opens the pool's 8 connections, each a password
    // handshake, here in a debug build beside the other lanes: more than
    // the failing cases' 1 s may pass on a loaded machine.)
    let app = quick()
        .connect_timeout(Duration::from_secs(10))
        .connect(&url_with("app", "pw", &db))
        .await
        .unwrap();
    for _ in 0..3 {
        let g = app
            .lock("k")
            .lease(Duration::from_millis(300))
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(400)).await;
        g.release()
            .await
            .expect("renewed under the role's timeouts");
    }
}

/// Through a `pgbouncer` in transaction mode every call stands alone: locks
/// exclude and hand over. `LISTEN` does not pass such a pooler, so a
/// client given only the pooler's URL hears no grants and its waiters ask
/// again at `retry_delay`; with `listen_url` set to the server itself, a
/// grant wakes the waiter at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_pgbouncer_in_transaction_mode() {
    let server = PostgresServer::start();
    let bouncer = tests::postgres::PgBouncer::start(&server, 2);
    // Only the pooler: hand-off by asking again.
    let polling = LockClient::builder()
        .retry_delay(Duration::from_millis(200))
        .connect(&bouncer.url())
        .await
        .unwrap();
    let key = unique("bounced");
    let held = polling.lock(&key).await.unwrap();
    let waiter = tokio::spawn({
        let (c, key) = (polling.clone(), key.clone());
        async move { c.lock(&key).wait(Duration::from_secs(20)).await }
    });
    assert!(
        eventually(Duration::from_secs(10), || polling.waiting_here(&key) == 1).await,
        "the waiter did not park"
    );
    let fence = held.fence();
    held.release().await.unwrap();
    let next = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("served through the pooler")
        .unwrap()
        .unwrap();
    assert!(next.fence() > fence);
    next.release().await.unwrap();
    // Calls through the pooler, grants heard on the server itself.
    let listening = LockClient::builder()
        .retry_delay(Duration::from_secs(600))
        .listen_url(server.url())
        .connect(&bouncer.url())
        .await
        .unwrap();
    tests::semantics::waiter_woken_by_release(&listening).await;
    // Many tasks, few server connections: still one holder at a time.
    let clients = [polling.clone(), listening.clone()];
    let key = unique("bounced-many");
    let inside = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for i in 0..8 {
        let (c, key, inside) = (clients[i % 2].clone(), key.clone(), inside.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..5 {
                let g = c.lock(&key).wait(Duration::from_secs(30)).await.unwrap();
                assert_eq!(inside.fetch_add(1, std::sync::atomic::Ordering::SeqCst), 0);
                tokio::task::yield_now().await;
                inside.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                g.release().await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
}

/// `connect_lazy` sends nothing: built while the server is down, a lock
/// fails within its wait with a Backend error, and once the server is up
/// the same client locks (creating the tables then).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lazy_client_waits_for_its_server() {
    let port = tests::free_port();
    let url = format!("postgres://postgres@127.0.0.1:{port}/postgres");
    let client = LockClient::builder()
        .connect_timeout(Duration::from_millis(500))
        .op_timeout(Duration::from_millis(500))
        .connect_lazy(&url)
        .unwrap();
    let t = Instant::now();
    let err = client
        .lock("lazy")
        .wait(Duration::from_secs(1))
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::Backend(_)), "{err:?}");
    assert!(
        t.elapsed() < Duration::from_secs(4),
        "took {:?}",
        t.elapsed()
    );
    let _server = PostgresServer::options().port(port).start();
    let guard = client.lock("lazy").await.unwrap();
    assert!(guard.fence() > 0);
    guard.release().await.unwrap();
}

/// A crash of the server (immediate stop, then start) within a lease: the
/// hold is a committed row, so it is still held and renewed after it, and
/// the next token of the key is above every earlier one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_lock_and_its_tokens_survive_a_crash() {
    let mut server = PostgresServer::options().durable().start();
    let url = server.url();
    let client = LockClient::connect(&url).await.unwrap();
    let key = unique("crash");
    let guard = client
        .lock(&key)
        .lease(Duration::from_secs(6))
        .await
        .unwrap();
    let before = guard.fence();
    server.stop_immediate();
    server.start_again();
    let other = LockClient::connect(&url).await.unwrap();
    let busy = other.lock(&key).wait(Duration::ZERO).await;
    assert!(matches!(busy, Err(LockError::Timeout { .. })), "{busy:?}");
    // Past the first renewals after the restart.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(!guard.is_lost());
    guard.release().await.expect("held across the crash");
    let next = other.lock(&key).await.unwrap();
    assert!(next.fence() > before);
    next.release().await.unwrap();
}
