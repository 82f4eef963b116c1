//! The PostgreSQL engine under faults, against real servers: a holder
//! killed, the server paused, connections terminated under held locks,
//! replies lost after their statement ran, an immediate-stop crash (under
//! holds and under a parked waiter), a waiter that could not listen, lost
//! token counters, and a failover to a synchronous standby.
//!
//! Double holders are counted in the bodies: every client is a
//! `LockClient` of its own in this process, so a body that finds another
//! body of its key inside is a double holder, whichever clients they are.

use std::collections::HashMap;
use std::future::IntoFuture;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lock_runtime::{LockClient, LockError};
use tests::postgres::PostgresServer;
use tests::proxy::Proxy;
use tests::{spawn_tied, unique};

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Runtime::new().unwrap()
}

/// `(lease_end, fence)` of the holds of the lock named after `key` (its
/// free slots aside), the lease end in µs of the database's clock.
fn holds_of(pg: &PostgresServer, db: &str, key: &str) -> Vec<(i64, i64)> {
    pg.query_in(
        db,
        &format!(
            "SELECT (extract(epoch FROM lease_end) * 1e6)::bigint, fence FROM lock_holders \
             WHERE (name LIKE {} OR name LIKE {}) AND owner <> '' ORDER BY lease_end",
            tests::postgres::quote_literal(&format!("%{key}")),
            tests::postgres::quote_literal(&format!("%{{{key}}}"))
        ),
    )
    .into_iter()
    .map(|r| (r[0].parse().unwrap(), r[1].parse().unwrap()))
    .collect()
}

/// Wait (up to 15 s) until the lock named after `key` has one waiter
/// queued and a listening session is recorded that is alive: a release
/// then hands the waiter the lock. What was seen last, if not.
fn listening_again(pg: &PostgresServer, db: &str, key: &str) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let listeners = pg.query_in(
            db,
            "SELECT count(*) FROM lock_listeners l, pg_stat_get_activity(l.pid) s \
             WHERE s.backend_start = l.started",
        );
        let waiting = pg.query_in(
            db,
            &format!(
                "SELECT count(*) FROM lock_waiters WHERE name LIKE {}",
                tests::postgres::quote_literal(&format!("%{key}%"))
            ),
        );
        if listeners[0][0] != "0" && waiting[0][0] == "1" {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!("{listeners:?} live listeners, {waiting:?} waiting"));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Two clients on `url`: a holder's, and a waiter's that asks again only
/// every 30 s, so that a waiter served within seconds was served by its
/// grant.
fn holder_and_waiter_clients(rt: &tokio::runtime::Runtime, url: &str) -> (LockClient, LockClient) {
    rt.block_on(async {
        let a = LockClient::connect(url).await.unwrap();
        let b = LockClient::builder()
            .retry_delay(Duration::from_secs(30))
            .connect(url)
            .await
            .unwrap();
        (a, b)
    })
}

/// A key `a` holds for 20 s, and a task of `b` waiting up to 25 s for it
/// that answers when it got it.
fn hold_and_wait(
    rt: &tokio::runtime::Runtime,
    a: &LockClient,
    b: &LockClient,
    prefix: &str,
) -> (
    String,
    lock_runtime::LockGuard,
    tokio::task::JoinHandle<Result<Instant, LockError>>,
) {
    let key = unique(prefix);
    let held = rt
        .block_on(a.lock(&key).lease(Duration::from_secs(20)).into_future())
        .unwrap();
    let waiter = rt.spawn({
        let (b, key) = (b.clone(), key.clone());
        async move {
            let g = b.lock(&key).wait(Duration::from_secs(25)).await?;
            let at = Instant::now();
            g.release().await?;
            Ok::<_, LockError>(at)
        }
    });
    (key, held, waiter)
}

/// Release `held` and return how soon after it the waiter had the lock,
/// which must be by its grant: well within its 30 s `retry_delay`.
fn handed_over(
    rt: &tokio::runtime::Runtime,
    held: lock_runtime::LockGuard,
    waiter: tokio::task::JoinHandle<Result<Instant, LockError>>,
) -> Duration {
    let released = Instant::now();
    rt.block_on(held.release()).expect("the hold was kept");
    let granted = rt
        .block_on(waiter)
        .unwrap()
        .expect("the waiter was handed the lock");
    let after = granted.saturating_duration_since(released);
    assert!(
        after < Duration::from_secs(10),
        "granted {after:?} after the release: by asking again, not by its grant"
    );
    after
}

/// A holder process killed with SIGKILL: its lock is taken by a waiter
/// only once its lease has run out by the database's clock (the waiter's
/// hold starts after the dead one's lease end), and soon after.
#[test]
fn a_killed_holder_frees_its_lock_when_its_lease_runs_out_never_before() {
    let rt = rt();
    let pg = PostgresServer::shared();
    let db = pg.fresh_database();
    let url = pg.url_for(&db);
    let lease = Duration::from_millis(1500);
    let retry_delay = Duration::from_millis(100);
    let client = rt
        .block_on(
            LockClient::builder()
                .lease(lease)
                .retry_delay(retry_delay)
                .connect(&url),
        )
        .unwrap();
    let mut late = Vec::new();
    for run in 0..4 {
        let key = unique("pgcrash");
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_lock_worker"));
        cmd.args(["hold", &url, &key, &lease.as_millis().to_string()])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        let mut child = spawn_tied(cmd).unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert!(line.starts_with("HELD "), "holder said {line:?}");
        // Kill at a random point of the renewal cycle.
        std::thread::sleep(Duration::from_millis(fastrand::u64(0..1000)));
        child.kill().unwrap();
        child.wait().unwrap();
        let dead = holds_of(pg, &db, &key);
        assert_eq!(dead.len(), 1, "run {run}: the dead holder's row: {dead:?}");
        let (dead_end, dead_fence) = dead[0];
        let guard = rt
            .block_on(
                client
                    .lock(&key)
                    .wait(Duration::from_secs(10))
                    .into_future(),
            )
            .unwrap_or_else(|e| panic!("run {run}: never free after the holder died: {e}"));
        let now = holds_of(pg, &db, &key);
        assert_eq!(now.len(), 1, "run {run}: {now:?}");
        let started = now[0].0 - lease.as_micros() as i64;
        assert!(
            started >= dead_end,
            "run {run}: taken {} µs before the dead holder's lease ran out",
            dead_end - started
        );
        assert!(guard.fence() > dead_fence as u64, "run {run}: token");
        late.push(Duration::from_micros((started - dead_end) as u64));
        rt.block_on(guard.release()).unwrap();
    }
    late.sort();
    println!(
        "killed holder: taken {:?} to {:?} after its lease ran out (retry delay {retry_delay:?})",
        late[0],
        late[late.len() - 1]
    );
}

/// What a run of contending tasks saw.
#[derive(Default)]
struct Tally {
    acquired: AtomicU64,
    doubles: AtomicU64,
    failed: AtomicU64,
    lost: AtomicU64,
    errors: std::sync::Mutex<Vec<String>>,
}

impl Tally {
    fn fail(&self, what: String) {
        self.failed.fetch_add(1, Ordering::Relaxed);
        let mut e = self.errors.lock().unwrap();
        if e.len() < 5 {
            e.push(what);
        }
    }
}

/// `tasks` tasks on each client take turns on `keys` keys (lock, hold a
/// few ms, check nobody else is in, release) until `stop`.
fn contend(
    rt: &tokio::runtime::Runtime,
    clients: &[LockClient],
    keys: &[String],
    tasks: usize,
    wait: Duration,
    stop: Arc<AtomicBool>,
    tally: Arc<Tally>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let inside: Arc<HashMap<String, AtomicU32>> = Arc::new(
        keys.iter()
            .map(|k| (k.clone(), AtomicU32::new(0)))
            .collect(),
    );
    let mut handles = Vec::new();
    for client in clients {
        for t in 0..tasks {
            let (client, keys, inside, stop, tally) = (
                client.clone(),
                keys.to_vec(),
                inside.clone(),
                stop.clone(),
                tally.clone(),
            );
            handles.push(rt.spawn(async move {
                let mut i = t;
                while !stop.load(Ordering::Relaxed) {
                    i += 1;
                    let key = &keys[i % keys.len()];
                    match client.lock(key).wait(wait).await {
                        Ok(guard) => {
                            tally.acquired.fetch_add(1, Ordering::Relaxed);
                            if inside[key].fetch_add(1, Ordering::SeqCst) != 0 {
                                tally.doubles.fetch_add(1, Ordering::Relaxed);
                            }
                            tokio::time::sleep(Duration::from_millis(fastrand::u64(1..10))).await;
                            inside[key].fetch_sub(1, Ordering::SeqCst);
                            if guard.is_lost() {
                                tally.lost.fetch_add(1, Ordering::Relaxed);
                            }
                            if let Err(e) = guard.release().await {
                                tally.fail(format!("release: {e}"));
                            }
                        }
                        Err(e) => tally.fail(format!("lock: {e}")),
                    }
                }
            }));
        }
    }
    handles
}

/// `pg_terminate_backend` of every client connection every 150-400 ms
/// while locks are held (and renewed) and tasks contend: no hold is lost,
/// no call with wait left fails, nobody holds twice.
#[test]
fn terminated_connections_lose_no_lock_and_fail_no_call() {
    let rt = rt();
    let pg = PostgresServer::shared();
    let db = pg.fresh_database();
    let url = pg.url_for(&db);
    let clients: Vec<LockClient> = (0..3)
        .map(|_| {
            rt.block_on(
                LockClient::builder()
                    .lease(Duration::from_millis(1500))
                    .connect(&url),
            )
            .unwrap()
        })
        .collect();
    // Long holds: renewed many times over the run.
    let held: Vec<_> = (0..20)
        .map(|i| {
            rt.block_on(clients[i % 3].lock(unique("pgheld")).into_future())
                .unwrap()
        })
        .collect();
    let keys: Vec<String> = (0..3).map(|_| unique("pgterm")).collect();
    let stop = Arc::new(AtomicBool::new(false));
    let tally = Arc::new(Tally::default());
    let handles = contend(
        &rt,
        &clients,
        &keys,
        3,
        Duration::from_secs(20),
        stop.clone(),
        tally.clone(),
    );
    let started = Instant::now();
    let mut terminated = 0;
    let mut rounds = 0;
    while started.elapsed() < Duration::from_secs(8) {
        std::thread::sleep(Duration::from_millis(fastrand::u64(150..400)));
        terminated += pg.terminate_backends_in(&db);
        rounds += 1;
    }
    stop.store(true, Ordering::Relaxed);
    for h in handles {
        rt.block_on(h).unwrap();
    }
    let lost = held.iter().filter(|g| g.is_lost()).count();
    for g in held {
        rt.block_on(g.release()).unwrap();
    }
    println!(
        "{rounds} rounds of pg_terminate_backend ({terminated} connections) in 8 s: \
         {} acquisitions, {} failed calls, {} doubles, {lost} of 20 long holds lost",
        tally.acquired.load(Ordering::Relaxed),
        tally.failed.load(Ordering::Relaxed),
        tally.doubles.load(Ordering::Relaxed),
    );
    assert!(
        terminated >= rounds,
        "the nemesis found nothing to terminate"
    );
    assert_eq!(lost, 0, "held locks lost to terminated connections");
    assert_eq!(
        tally.failed.load(Ordering::Relaxed),
        0,
        "{:?}",
        tally.errors.lock().unwrap()
    );
    assert_eq!(tally.doubles.load(Ordering::Relaxed), 0);
    assert_eq!(tally.lost.load(Ordering::Relaxed), 0);
    assert!(tally.acquired.load(Ordering::Relaxed) >= 50);
}

/// The server stopped (SIGSTOP of every process) for less than a lease:
/// the holds survive. For longer than the lease: every holder hears it
/// lost them, and another client gets each lock afterwards with a higher
/// token.
#[test]
fn a_paused_server_keeps_short_pauses_and_reports_long_ones() {
    let rt = rt();
    let pg = PostgresServer::start();
    let url = pg.url();
    let lease = Duration::from_secs(3);
    let client = rt
        .block_on(LockClient::builder().lease(lease).connect(&url))
        .unwrap();
    let other = rt.block_on(LockClient::connect(&url)).unwrap();
    let keys: Vec<String> = (0..5).map(|_| unique("pgpause")).collect();
    let guards: Vec<_> = keys
        .iter()
        .map(|k| rt.block_on(client.lock(k).into_future()).unwrap())
        .collect();

    pg.pause();
    std::thread::sleep(lease / 3);
    pg.resume();
    std::thread::sleep(lease);
    assert!(
        guards.iter().all(|g| !g.is_lost()),
        "a pause shorter than the lease lost a hold"
    );

    pg.pause();
    std::thread::sleep(lease * 2);
    pg.resume();
    rt.block_on(async {
        for g in &guards {
            assert!(
                tokio::time::timeout(Duration::from_secs(10), g.lost())
                    .await
                    .is_ok(),
                "{} never heard it lost {}",
                g.holder(),
                g.key()
            );
        }
    });
    for (k, g) in keys.iter().zip(&guards) {
        let taken = rt
            .block_on(other.lock(k).wait(Duration::from_secs(5)).into_future())
            .unwrap();
        assert!(taken.fence() > g.fence());
        rt.block_on(taken.release()).unwrap();
    }
    for g in guards {
        let _ = rt.block_on(g.release());
    }
}

/// Tokens per key rise strictly across clients, across an immediate-stop
/// crash of the server (fsync on), and when the token counters are lost
/// (their rows deleted): they are floored at the database's clock.
#[test]
fn tokens_rise_across_clients_crashes_and_lost_counters() {
    let rt = rt();
    let mut pg = PostgresServer::options().durable().start();
    let url = pg.url();
    let clients: Vec<LockClient> = (0..3)
        .map(|_| rt.block_on(LockClient::connect(&url)).unwrap())
        .collect();
    let key = unique("pgfence");
    let mut last = 0u64;
    let take = |what: &str, n: usize, last: &mut u64| {
        for i in 0..n {
            let g = rt
                .block_on(
                    clients[i % 3]
                        .lock(&key)
                        .wait(Duration::from_secs(20))
                        .into_future(),
                )
                .unwrap_or_else(|e| panic!("{what}, {i}: {e}"));
            assert!(g.fence() > *last, "{what}: {} after {last}", g.fence());
            *last = g.fence();
            rt.block_on(g.release()).unwrap();
        }
    };
    take("before", 9, &mut last);

    // Held across the crash: the row is committed, so it is still held.
    let held = rt.block_on(clients[0].lock(&key).into_future()).unwrap();
    assert!(held.fence() > last);
    last = held.fence();
    pg.restart();
    let busy = rt.block_on(clients[1].lock(&key).wait(Duration::ZERO).into_future());
    assert!(
        matches!(busy, Err(LockError::Timeout { .. })),
        "the lock held across the crash was free: {:?}",
        busy.map(|g| g.fence())
    );
    rt.block_on(held.release()).unwrap();
    take("after the crash", 9, &mut last);

    pg.psql("DELETE FROM lock_holders");
    take("after the counters were lost", 9, &mut last);
}

/// Replies lost after their statement ran (the proxy throws the reply away
/// and closes the connection): 5 % of the acquires and releases. The
/// re-sent statements grant nothing twice, no call with wait left fails,
/// and no lock is left behind.
#[test]
fn lost_replies_grant_nothing_twice() {
    let rt = rt();
    let pg = PostgresServer::shared();
    let db = pg.fresh_database();
    let proxy = Proxy::start(pg.port());
    let url = format!("postgres://postgres@127.0.0.1:{}/{db}", proxy.port());
    let clients: Vec<LockClient> = (0..3)
        .map(|_| {
            rt.block_on(
                LockClient::builder()
                    .lease(Duration::from_secs(5))
                    .connect(&url),
            )
            .unwrap()
        })
        .collect();
    let keys: Vec<String> = (0..2).map(|_| unique("pglost")).collect();
    proxy.lose_replies(b"lock_acquire_v1", 0.05);
    let stop = Arc::new(AtomicBool::new(false));
    let tally = Arc::new(Tally::default());
    let handles = contend(
        &rt,
        &clients,
        &keys,
        3,
        Duration::from_secs(30),
        stop.clone(),
        tally.clone(),
    );
    std::thread::sleep(Duration::from_secs(4));
    proxy.lose_replies(b"lock_release_v1", 0.05);
    std::thread::sleep(Duration::from_secs(4));
    stop.store(true, Ordering::Relaxed);
    for h in handles {
        rt.block_on(h).unwrap();
    }
    proxy.lose_replies(b"", 0.0);
    let lost_replies = proxy.replies_lost();
    println!(
        "{lost_replies} replies lost: {} acquisitions, {} failed calls, {} doubles",
        tally.acquired.load(Ordering::Relaxed),
        tally.failed.load(Ordering::Relaxed),
        tally.doubles.load(Ordering::Relaxed),
    );
    assert!(lost_replies >= 5, "only {lost_replies} replies lost");
    assert_eq!(tally.doubles.load(Ordering::Relaxed), 0);
    assert_eq!(
        tally.failed.load(Ordering::Relaxed),
        0,
        "{:?}",
        tally.errors.lock().unwrap()
    );
    for k in &keys {
        assert!(
            holds_of(pg, &db, k).is_empty(),
            "{k} left held: {:?}",
            holds_of(pg, &db, k)
        );
    }
}

/// A synchronous standby takes over: the client's URL names both servers
/// (`target_session_attrs=read-write`), the primary is killed, the standby
/// promoted. The hold survives (its row was on the standby before the
/// acquire returned), the watchdog renews it on the new primary, and the
/// next token is higher than any before.
#[test]
fn a_hold_survives_failover_to_a_synchronous_standby() {
    let rt = rt();
    let mut primary = PostgresServer::options().durable().start();
    let standby = PostgresServer::standby_of(&primary, "standby1", true);
    let url = format!(
        "postgres://postgres@127.0.0.1:{},127.0.0.1:{}/postgres?target_session_attrs=read-write&connect_timeout=2",
        primary.port(),
        standby.port()
    );
    let lease = Duration::from_secs(6);
    let holder = rt
        .block_on(LockClient::builder().lease(lease).connect(&url))
        .unwrap();
    let key = unique("pgfailover");
    let guard = rt.block_on(holder.lock(&key).into_future()).unwrap();
    primary.kill();
    standby.promote();
    let other = rt.block_on(LockClient::connect(&standby.url())).unwrap();
    let busy = rt.block_on(other.lock(&key).wait(Duration::ZERO).into_future());
    assert!(busy.is_err(), "the hold was gone after the failover");
    // Two leases on: renewed on the new primary meanwhile.
    std::thread::sleep(lease * 2);
    assert!(!guard.is_lost(), "the hold was lost across the failover");
    let fence = guard.fence();
    rt.block_on(guard.release()).unwrap();
    let next = rt
        .block_on(other.lock(&key).wait(Duration::from_secs(5)).into_future())
        .unwrap();
    assert!(next.fence() > fence);
    rt.block_on(next.release()).unwrap();
}

/// A waiter parked when the server crashes (immediate stop, then start) is
/// still handed the lock by the next release, by its grant and not by
/// asking again: its listening session died with the server, so it asks
/// once more, listens afresh and parks; the holder's row survived the
/// crash, and its release after the restart serves the waiter. With a
/// `retry_delay` of 30 s, the guard comes back well within it.
#[test]
fn a_waiter_parked_across_a_server_crash_is_handed_the_lock() {
    let rt = rt();
    let mut pg = PostgresServer::options().durable().start();
    let url = pg.url();
    let (a, b) = holder_and_waiter_clients(&rt, &url);
    let (key, held, waiter) = hold_and_wait(&rt, &a, &b, "pglisten");
    let parked = |what: &str| {
        let deadline = Instant::now() + Duration::from_secs(15);
        while b.waiting_here(&key) != 1 {
            assert!(Instant::now() < deadline, "{what}: the waiter did not park");
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    parked("before the crash");
    pg.restart();
    // The waiter's session is gone: it asks again, and parks once its new
    // listening session is recorded. Until then a release would pass it
    // over; this waits for the event, not for time.
    if let Err(seen) = listening_again(&pg, "postgres", &key) {
        let ended = waiter
            .is_finished()
            .then(|| rt.block_on(waiter).unwrap().err());
        panic!("after the crash: {seen}; the waiter ended: {ended:?}");
    }
    parked("after the crash");
    let after = handed_over(&rt, held, waiter);
    println!("granted {after:?} after the release");
}

/// A waiter whose client cannot listen for a moment (here
/// `lock_listen_v1` fails, as a session refused under load would) asks
/// again soon and listens then, and the next release hands it the lock by
/// its grant. Before, it napped the holder's lease unheard (at most
/// `retry_delay`, 30 s here), and the release passed it over.
#[test]
fn a_waiter_that_could_not_listen_listens_again_soon() {
    let rt = rt();
    let pg = PostgresServer::shared();
    let db = pg.fresh_database();
    let url = pg.url_for(&db);
    let (a, b) = holder_and_waiter_clients(&rt, &url);
    // Listening fails, and each try is counted (a sequence is not rolled
    // back with the failed statement).
    pg.query_in(
        &db,
        "CREATE SEQUENCE listen_tries; \
         ALTER FUNCTION lock_listen_v1(text) RENAME TO lock_listen_v1_kept; \
         CREATE FUNCTION lock_listen_v1(p_channel text) RETURNS void LANGUAGE plpgsql AS \
         $$ BEGIN PERFORM nextval('listen_tries'); RAISE EXCEPTION 'listening refused'; END $$",
    );
    let (key, held, waiter) = hold_and_wait(&rt, &a, &b, "pgunheard");
    let deadline = Instant::now() + Duration::from_secs(15);
    while pg.query_in(&db, "SELECT is_called FROM listen_tries")[0][0] != "t" {
        assert!(
            Instant::now() < deadline,
            "the waiter never tried to listen"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    pg.query_in(
        &db,
        "DROP FUNCTION lock_listen_v1(text); \
         ALTER FUNCTION lock_listen_v1_kept(text) RENAME TO lock_listen_v1",
    );
    if let Err(seen) = listening_again(pg, &db, &key) {
        panic!("after a failed subscription: {seen}: the waiter did not listen again");
    }
    let after = handed_over(&rt, held, waiter);
    let tries = &pg.query_in(&db, "SELECT last_value FROM listen_tries")[0][0];
    println!("granted {after:?} after the release; {tries} failed subscriptions");
}
