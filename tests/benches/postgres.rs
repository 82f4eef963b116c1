//! The PostgreSQL engine side by side, in one run, against one throwaway
//! server (`fsync` and `synchronous_commit` on, as in production), with:
//!
//! - a ShedLock-style lease row: `INSERT … ON CONFLICT (name) DO UPDATE …
//!   WHERE lock_until <= now()` to lock, an `UPDATE` to unlock, prepared
//!   statements, a connection per task (its best case; ShedLock does not
//!   wait for a busy lock, so its waiters here poll every 5 ms);
//! - session advisory locks (`pg_advisory_lock` / `pg_advisory_unlock`),
//!   for reference only: neither durable nor expiring, and a connection per
//!   held lock and per waiter.
//!
//! ```sh
//! scripts/bench.sh                                   # everything, then this
//! cargo bench -p tests --bench postgres              # writes its section of docs/BENCHMARKS.md
//! LOCKBENCH_QUICK=1 cargo bench -p tests --bench postgres   # a smoke run, docs left as they are
//! LOCKBENCH_PG_CYCLES=100000 …                       # the table-size case with fewer cycles
//! LOCKBENCH_PG_ONLY=1,2 …                            # some cases only (P1-P6), docs left as they are
//! ```

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lock_runtime::LockClient;
use tests::postgres::PostgresServer;
use tokio_postgres::{Client, NoTls, Statement};

/// Where the section goes in `docs/BENCHMARKS.md` (the `locks` bench keeps
/// it when it rewrites the file).
const BEGIN: &str = "<!-- postgres-bench:begin -->";
const END: &str = "<!-- postgres-bench:end -->";

const LEASE_ROW_TABLE: &str = "CREATE TABLE IF NOT EXISTS shedlock (
    name varchar(64) PRIMARY KEY, lock_until timestamptz NOT NULL,
    locked_at timestamptz NOT NULL, locked_by varchar(255) NOT NULL)";
const LEASE_ROW_LOCK: &str = "INSERT INTO shedlock (name, lock_until, locked_at, locked_by)
    VALUES ($1, now() + interval '30 seconds', now(), $2)
    ON CONFLICT (name) DO UPDATE SET lock_until = EXCLUDED.lock_until,
        locked_at = EXCLUDED.locked_at, locked_by = EXCLUDED.locked_by
    WHERE shedlock.lock_until <= now()";
const LEASE_ROW_UNLOCK: &str =
    "UPDATE shedlock SET lock_until = now() WHERE name = $1 AND locked_by = $2";
const LEASE_ROW_EXTEND: &str = "UPDATE shedlock SET lock_until = now() + interval '30 seconds'
    WHERE name = $1 AND locked_by = $2 AND lock_until > now()";

async fn connection(url: &str) -> Client {
    let (client, conn) = tokio_postgres::connect(url, NoTls).await.unwrap();
    tokio::spawn(conn);
    client
}

/// One task's connection for the lease row.
struct LeaseRow {
    client: Client,
    lock: Statement,
    unlock: Statement,
    me: String,
}

impl LeaseRow {
    async fn new(url: &str) -> Self {
        let client = connection(url).await;
        let lock = client.prepare(LEASE_ROW_LOCK).await.unwrap();
        let unlock = client.prepare(LEASE_ROW_UNLOCK).await.unwrap();
        let me = tests::unique("row");
        LeaseRow {
            client,
            lock,
            unlock,
            me,
        }
    }

    async fn try_lock(&self, name: &str) -> bool {
        self.client
            .execute(&self.lock, &[&name, &self.me])
            .await
            .unwrap()
            == 1
    }

    /// ShedLock does not wait; a waiter here asks again every 5 ms.
    async fn lock(&self, name: &str) {
        while !self.try_lock(name).await {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    async fn unlock(&self, name: &str) {
        self.client
            .execute(&self.unlock, &[&name, &self.me])
            .await
            .unwrap();
    }
}

/// One task's connection for advisory locks.
struct Advisory {
    client: Client,
    lock: Statement,
    unlock: Statement,
}

impl Advisory {
    async fn new(url: &str) -> Self {
        let client = connection(url).await;
        let lock = client
            .prepare("SELECT pg_advisory_lock(hashtext($1))")
            .await
            .unwrap();
        let unlock = client
            .prepare("SELECT pg_advisory_unlock(hashtext($1))")
            .await
            .unwrap();
        Advisory {
            client,
            lock,
            unlock,
        }
    }

    async fn lock(&self, name: &str) {
        self.client.query_one(&self.lock, &[&name]).await.unwrap();
    }

    async fn unlock(&self, name: &str) {
        self.client.query_one(&self.unlock, &[&name]).await.unwrap();
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Who {
    Ours,
    LeaseRow,
    Advisory,
}

impl Who {
    const ALL: [Who; 3] = [Who::Ours, Who::LeaseRow, Who::Advisory];

    fn label(self) -> &'static str {
        match self {
            Who::Ours => "ours (`client.lock(k)` + `release()`)",
            Who::LeaseRow => "lease row (ShedLock-style upsert + update)",
            Who::Advisory => "advisory lock pair (reference)",
        }
    }
}

/// A lock + unlock, by whoever.
enum Locker {
    Ours(LockClient),
    Row(LeaseRow),
    Adv(Advisory),
}

impl Locker {
    async fn new(who: Who, url: &str, shared: Option<&LockClient>) -> Self {
        match who {
            Who::Ours => Locker::Ours(match shared {
                Some(c) => c.clone(),
                None => LockClient::connect(url).await.unwrap(),
            }),
            Who::LeaseRow => Locker::Row(LeaseRow::new(url).await),
            Who::Advisory => Locker::Adv(Advisory::new(url).await),
        }
    }

    /// Lock `name` (waiting), run `during` with the lock, unlock.
    async fn cycle(&self, name: &str, during: impl std::future::Future<Output = ()>) {
        match self {
            Locker::Ours(c) => {
                let g = c.lock(name).wait(Duration::from_secs(60)).await.unwrap();
                during.await;
                g.release().await.unwrap();
            }
            Locker::Row(r) => {
                r.lock(name).await;
                during.await;
                r.unlock(name).await;
            }
            Locker::Adv(a) => {
                a.lock(name).await;
                during.await;
                a.unlock(name).await;
            }
        }
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn us(d: Duration) -> String {
    format!("{:.0} µs", d.as_secs_f64() * 1e6)
}

struct Bench {
    pg: PostgresServer,
    quick: bool,
    /// A database per contender, so their statements count apart.
    dbs: Vec<(Who, String)>,
    out: String,
    targets: Vec<String>,
}

impl Bench {
    fn url(&self, who: Who) -> String {
        let db = &self.dbs.iter().find(|(w, _)| *w == who).unwrap().1;
        self.pg.url_for(db)
    }

    fn db(&self, who: Who) -> &str {
        &self.dbs.iter().find(|(w, _)| *w == who).unwrap().1
    }

    fn section(&mut self, title: &str, text: &str) {
        let block = format!("### {title}\n\n{text}\n");
        println!("{block}");
        self.out.push_str(&block);
        self.out.push('\n');
    }
}

/// Case P0 (diagnostic, only with LOCKBENCH_PG_ONLY=0): where one task's
/// cycle spends its time on the client.
async fn diagnose(b: &mut Bench) {
    let url = b.url(Who::Ours);
    let c = LockClient::connect(&url).await.unwrap();
    let raw = connection(&url).await;
    let n = 2000;
    let mut t_lock = Vec::new();
    let mut t_nowait = Vec::new();
    let mut t_rel = Vec::new();
    let mut t_raw = Vec::new();
    for i in 0..n {
        let t = Instant::now();
        let g = c.lock("diag").wait(Duration::from_secs(60)).await.unwrap();
        let l = t.elapsed();
        let t = Instant::now();
        g.release().await.unwrap();
        let r = t.elapsed();
        let t = Instant::now();
        let g = c.lock("diag").await.unwrap();
        let nw = t.elapsed();
        g.release().await.unwrap();
        let t = Instant::now();
        let owner = format!("raw{i}");
        raw.query_typed(
            "SELECT * FROM lock_acquire_v1($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
            &[
                (&"rawdiag", tokio_postgres::types::Type::TEXT),
                (&owner, tokio_postgres::types::Type::TEXT),
                (&(b'w' as i8), tokio_postgres::types::Type::CHAR),
                (&0i32, tokio_postgres::types::Type::INT4),
                (&30000i64, tokio_postgres::types::Type::INT8),
                (&None::<i64>, tokio_postgres::types::Type::INT8),
                (&false, tokio_postgres::types::Type::BOOL),
                (&true, tokio_postgres::types::Type::BOOL),
                (&"ch", tokio_postgres::types::Type::TEXT),
                (&600000i64, tokio_postgres::types::Type::INT8),
            ],
        )
        .await
        .unwrap();
        raw.query_typed(
            "SELECT lock_release_v1($1, $2, $3)",
            &[
                (&"rawdiag", tokio_postgres::types::Type::TEXT),
                (&owner, tokio_postgres::types::Type::TEXT),
                (&false, tokio_postgres::types::Type::BOOL),
            ],
        )
        .await
        .unwrap();
        let rw = t.elapsed();
        if i >= 200 {
            t_lock.push(l);
            t_rel.push(r);
            t_nowait.push(nw);
            t_raw.push(rw);
        }
    }
    for (what, v) in [
        ("lock wait", &mut t_lock),
        ("release", &mut t_rel),
        ("lock nowait", &mut t_nowait),
        ("raw cycle", &mut t_raw),
    ] {
        v.sort();
        eprintln!(
            "P0 {what}: p50 {} p90 {}",
            us(percentile(v, 0.5)),
            us(percentile(v, 0.9))
        );
    }
}

/// Case P1: one task, lock + unlock of one name, repeated.
async fn one_task(b: &mut Bench) -> [Duration; 3] {
    let n = if b.quick { 200 } else { 1_000 };
    let rounds = 5;
    let mut lockers = Vec::new();
    for who in Who::ALL {
        lockers.push((who, Locker::new(who, &b.url(who), None).await));
    }
    let mut samples: Vec<Vec<Duration>> = vec![Vec::new(); 3];
    for (_, l) in &lockers {
        for _ in 0..100 {
            l.cycle("one", async {}).await;
        }
    }
    // Interleaved rounds: drift of the shared machine hits all alike.
    for _ in 0..rounds {
        for (i, (_, l)) in lockers.iter().enumerate() {
            for _ in 0..n / rounds {
                let t = Instant::now();
                l.cycle("one", async {}).await;
                samples[i].push(t.elapsed());
            }
        }
    }
    let mut rows = String::from("| | p50 | p99 | vs the lease row (p50) |\n|---|---|---|---|\n");
    let mut p50s = [Duration::ZERO; 3];
    for (i, who) in Who::ALL.iter().enumerate() {
        samples[i].sort();
        p50s[i] = percentile(&samples[i], 0.5);
        rows.push_str(&format!(
            "| {} | {} | {} | |\n",
            who.label(),
            us(p50s[i]),
            us(percentile(&samples[i], 0.99)),
        ));
    }
    // Fill the ratio column.
    let ratio = |i: usize| p50s[i].as_secs_f64() / p50s[1].as_secs_f64();
    let rows = rows
        .lines()
        .enumerate()
        .map(|(line, text)| {
            if (2..5).contains(&line) {
                text.replace("| |", &format!("| {:.2}× |", ratio(line - 2)))
            } else {
                text.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    b.section(
        "Case P1 — one task: lock + unlock of one name, repeated",
        &format!("{n} cycles each, interleaved in {rounds} rounds.\n\n{rows}"),
    );
    b.targets.push(format!(
        "| one task's lock + unlock p50 ≤ 1.1× the lease row's | {:.2}× | {} |",
        ratio(0),
        if ratio(0) <= 1.1 { "met" } else { "missed" }
    ));
    p50s
}

/// Case P2: 32 tasks on 32 keys, for a few seconds each.
async fn throughput(b: &mut Bench) {
    let span = if b.quick {
        Duration::from_secs(1)
    } else {
        Duration::from_secs(6)
    };
    let mut rates = [0.0f64; 4];
    let mut rows = String::from(
        "| | connections | lock + unlock per s | vs the lease row |\n|---|---|---|---|\n",
    );
    // Last, the lease row again on as many connections as our client has,
    // the 32 tasks sharing them: what the same commits do without the
    // other sessions to share WAL flushes with.
    let runs = Who::ALL
        .iter()
        .map(|&w| (w, 32))
        .chain([(Who::LeaseRow, 8)]);
    for (i, (who, connections)) in runs.enumerate() {
        let url = b.url(who);
        let shared = match who {
            Who::Ours => Some(LockClient::connect(&url).await.unwrap()),
            _ => None,
        };
        let mut own = Vec::new();
        for _ in 0..connections {
            own.push(Arc::new(Locker::new(who, &url, shared.as_ref()).await));
        }
        let lockers: Vec<_> = (0..32).map(|t| own[t % own.len()].clone()).collect();
        let conns_before = b.pg.connections_to(b.db(who));
        let stop = Arc::new(AtomicBool::new(false));
        let done = Arc::new(AtomicU64::new(0));
        let mut tasks = Vec::new();
        for (t, l) in lockers.iter().enumerate() {
            let (l, stop, done) = (l.clone(), stop.clone(), done.clone());
            tasks.push(tokio::spawn(async move {
                let key = format!("tp{t}");
                while !stop.load(Ordering::Relaxed) {
                    l.cycle(&key, async {}).await;
                    done.fetch_add(1, Ordering::Relaxed);
                }
            }));
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        let start = (Instant::now(), done.load(Ordering::Relaxed));
        tokio::time::sleep(span).await;
        let n = done.load(Ordering::Relaxed) - start.1;
        rates[i] = n as f64 / start.0.elapsed().as_secs_f64();
        stop.store(true, Ordering::Relaxed);
        for t in tasks {
            t.await.unwrap();
        }
        rows.push_str(&format!(
            "| {}{} | {} | {:.0} | {:.2}× |\n",
            who.label(),
            if i == 3 {
                ", 8 connections shared by the 32 tasks"
            } else {
                ""
            },
            conns_before,
            rates[i],
            if rates[1] > 0.0 {
                rates[i] / rates[1]
            } else {
                0.0
            }
        ));
    }
    // The first row was written before the lease row's rate was known.
    let rows = rows.replacen("| 0.00× |", &format!("| {:.2}× |", rates[0] / rates[1]), 1);
    b.section(
        "Case P2 — throughput: 32 tasks on 32 keys",
        &format!(
            "{:.0} s each. Ours: one client (its pool and its listening connection) for all 32 tasks; \
             the others: a connection per task, and the lease row once more on 8 connections.\n\n{rows}",
            span.as_secs_f64()
        ),
    );
    let r = rates[0] / rates[1];
    b.targets.push(format!(
        "| 32 tasks on 32 keys ≥ 0.9× the lease row's throughput | {r:.2}× | {} |",
        if r >= 0.9 { "met" } else { "missed" }
    ));
}

/// Case P3: WAL bytes and statements per lock + unlock.
async fn wal_and_statements(b: &mut Bench) {
    let n = if b.quick { 200 } else { 500 };
    let mut rows = String::from(
        "| | WAL bytes per lock + unlock | statements per lock + unlock |\n|---|---|---|\n",
    );
    let mut ours_statements = Vec::new();
    for who in Who::ALL {
        let l = Locker::new(who, &b.url(who), None).await;
        for _ in 0..50 {
            l.cycle("wal", async {}).await;
        }
        b.pg.reset_statements();
        let wal = b.pg.wal_position();
        for _ in 0..n {
            l.cycle("wal", async {}).await;
        }
        let bytes = b.pg.wal_bytes_since(wal) as f64 / n as f64;
        let statements = b.pg.statements_in(b.db(who)) as f64 / n as f64;
        if who == Who::Ours {
            ours_statements = b.pg.statement_counts_in(b.db(who));
        }
        rows.push_str(&format!(
            "| {} | {bytes:.0} | {statements:.2} |\n",
            who.label()
        ));
    }
    let mut detail = String::new();
    for (calls, query) in ours_statements.iter().take(6) {
        let q: String = query.chars().take(90).collect();
        detail.push_str(&format!(
            "- {:.2} per cycle: `{q}`\n",
            *calls as f64 / n as f64
        ));
    }
    b.section(
        "Case P3 — WAL bytes and statements per lock + unlock",
        &format!(
            "{n} cycles of one task on one name; WAL by `pg_current_wal_insert_lsn()` (the whole \
             server: background work included), statements by `pg_stat_statements` in the \
             contender's own database.\n\n{rows}\nOurs, by statement:\n\n{detail}"
        ),
    );
}

/// Case P4: hand-off, 8 tasks on one key (2 of our clients, 4 tasks each),
/// each holding ~1 ms.
async fn hand_off(b: &mut Bench) {
    let span = if b.quick {
        Duration::from_secs(1)
    } else {
        Duration::from_secs(5)
    };
    let mut rows = String::from("| | hand-offs | p50 | p99 |\n|---|---|---|---|\n");
    for who in Who::ALL {
        let url = b.url(who);
        let clients = match who {
            Who::Ours => vec![
                Some(LockClient::connect(&url).await.unwrap()),
                Some(LockClient::connect(&url).await.unwrap()),
            ],
            _ => vec![None, None],
        };
        let events: Arc<Mutex<Vec<(Instant, bool)>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let mut tasks = Vec::new();
        for t in 0..8 {
            let l = Arc::new(Locker::new(who, &url, clients[t % 2].as_ref()).await);
            let (events, stop) = (events.clone(), stop.clone());
            tasks.push(tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let ev = events.clone();
                    l.cycle("handoff", async move {
                        ev.lock().unwrap().push((Instant::now(), true));
                        tokio::time::sleep(Duration::from_millis(1)).await;
                        ev.lock().unwrap().push((Instant::now(), false));
                    })
                    .await;
                }
            }));
        }
        tokio::time::sleep(span).await;
        stop.store(true, Ordering::Relaxed);
        for t in tasks {
            t.await.unwrap();
        }
        let mut ev = events.lock().unwrap().clone();
        ev.sort_by_key(|e| e.0);
        // From the end of one body (its release starts) to the next
        // body's start.
        let mut gaps: Vec<Duration> = ev
            .windows(2)
            .filter(|w| !w[0].1 && w[1].1)
            .map(|w| w[1].0 - w[0].0)
            .collect();
        gaps.sort();
        rows.push_str(&format!(
            "| {} | {} | {} | {} |\n",
            who.label(),
            gaps.len(),
            us(percentile(&gaps, 0.5)),
            us(percentile(&gaps, 0.99))
        ));
    }
    b.section(
        "Case P4 — hand-off: 8 tasks on one key, each holding ~1 ms",
        &format!(
            "From the end of one holder's body (its release starts) to the start of the next \
             holder's body, {:.0} s each. Ours: 2 clients of 4 tasks, waiters queued and woken by \
             NOTIFY; lease row: waiters ask again every 5 ms; advisory: waiters block in \
             `pg_advisory_lock` on connections of their own.\n\n{rows}",
            span.as_secs_f64()
        ),
    );
}

/// Case P5: renewals of 10,000 held locks on one client.
async fn renewals(b: &mut Bench) {
    let n = if b.quick { 1_000 } else { 10_000 };
    let lease = Duration::from_secs(6);
    let url = b.url(Who::Ours);
    // The server's own background work over a window of the same length,
    // nothing held: subtracted below.
    let window = lease * 2;
    let idle = b.pg.cpu_time();
    tokio::time::sleep(window).await;
    let idle = b.pg.cpu_time().saturating_sub(idle);
    let client = LockClient::builder()
        .lease(lease)
        .connect(&url)
        .await
        .unwrap();
    let guards = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for t in 0..32 {
        let (c, g) = (client.clone(), guards.clone());
        tasks.push(tokio::spawn(async move {
            for i in (t..n).step_by(32) {
                let guard = c.lock(format!("held{i}")).await.unwrap();
                g.lock().unwrap().push(guard);
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    // Two ticks to settle, then measure over whole ticks.
    tokio::time::sleep(lease * 2 / 3).await;
    b.pg.reset_statements();
    let cpu = b.pg.cpu_time();
    let wal = b.pg.wal_position();
    tokio::time::sleep(window).await;
    let cpu = b.pg.cpu_time() - cpu;
    let wal = b.pg.wal_bytes_since(wal);
    let renew_calls: u64 =
        b.pg.statement_counts_in(b.db(Who::Ours))
            .iter()
            .filter(|(_, q)| q.contains("lock_renew"))
            .map(|(c, _)| c)
            .sum();
    let lost = guards
        .lock()
        .unwrap()
        .iter()
        .filter(|g| g.is_lost())
        .count();
    let ticks = window.as_secs_f64() / (lease.as_secs_f64() / 3.0);
    let held: Vec<_> = guards.lock().unwrap().drain(..).collect();
    for g in held {
        g.release().await.unwrap();
    }

    // The lease row extends each lock with an UPDATE of its own, in its
    // own transaction (as ShedLock's keep-alive does), here over 8
    // connections at once; the rows are taken and freed in bulk.
    let row = LeaseRow::new(&b.url(Who::LeaseRow)).await;
    row.client
        .execute(
            "INSERT INTO shedlock (name, lock_until, locked_at, locked_by) \
             SELECT 'held' || i, now() + interval '30 seconds', now(), $2 \
             FROM generate_series(0, $1 - 1) AS i",
            &[&(n as i32), &row.me],
        )
        .await
        .unwrap();
    let mut extenders = Vec::new();
    for _ in 0..8 {
        let c = connection(&b.url(Who::LeaseRow)).await;
        let st = c.prepare(LEASE_ROW_EXTEND).await.unwrap();
        extenders.push(Arc::new((c, st)));
    }
    let cpu_row = b.pg.cpu_time();
    let wal_row = b.pg.wal_position();
    let started = Instant::now();
    let mut tasks = Vec::new();
    for (t, e) in extenders.iter().enumerate() {
        let (e, me) = (e.clone(), row.me.clone());
        tasks.push(tokio::spawn(async move {
            for i in (t..n).step_by(8) {
                e.0.execute(&e.1, &[&format!("held{i}"), &me])
                    .await
                    .unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let row_wall = started.elapsed();
    let cpu_row = b.pg.cpu_time() - cpu_row;
    let wal_row = b.pg.wal_bytes_since(wal_row);
    row.client
        .execute("DELETE FROM shedlock WHERE locked_by = $1", &[&row.me])
        .await
        .unwrap();

    b.section(
        &format!("Case P5 — renewals: {n} held locks on one client"),
        &format!(
            "Lease {lease:?}: the watchdog ticks every lease / 3. Measured over {window:?} \
             (≈ {ticks:.0} ticks); DB CPU is every server process's user + system time, less what \
             the idle server used over a window as long ({:.0} ms per tick).\n\n\
             | | statements (round trips) per tick | DB CPU per tick | WAL per tick |\n|---|---|---|---|\n\
             | ours (`lock_renew_v1`, batched) | {:.1} | {:.1} ms | {:.0} kB |\n\
             | lease row, one `UPDATE` per lock | {n} | {:.1} ms | {} kB |\n\n\
             Holds lost meanwhile: {lost}. The lease row's tick took {:.0} ms of wall time over 8 connections.",
            idle.as_secs_f64() * 1e3 / ticks,
            renew_calls as f64 / ticks,
            cpu.saturating_sub(idle).as_secs_f64() * 1e3 / ticks,
            wal as f64 / ticks / 1024.0,
            cpu_row
                .saturating_sub(idle.mul_f64(row_wall.as_secs_f64() / window.as_secs_f64()))
                .as_secs_f64()
                * 1e3,
            wal_row / 1024,
            row_wall.as_secs_f64() * 1e3,
        ),
    );
}

/// Case P6: the tables' size after many lock cycles, autovacuum at its
/// defaults.
async fn table_size(b: &mut Bench) {
    let cycles: u64 = std::env::var("LOCKBENCH_PG_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if b.quick { 20_000 } else { 1_000_000 });
    let db = b.pg.fresh_database();
    let url = b.pg.url_for(&db);
    let client = LockClient::connect(&url).await.unwrap();
    let done = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    let size = |t: &str| b.pg.table_size_in(&db, t) / 1024;
    let mut samples = Vec::new();
    for t in 0..32u64 {
        let (c, done) = (client.clone(), done.clone());
        tasks.push(tokio::spawn(async move {
            let mut i = t;
            while done.fetch_add(1, Ordering::Relaxed) < cycles {
                // 1,000 names, each taken over and over.
                let g = c.lock(format!("size{}", i % 1000)).await.unwrap();
                g.release().await.unwrap();
                i += 32;
            }
        }));
    }
    let mut next = cycles / 4;
    while done.load(Ordering::Relaxed) < cycles {
        tokio::time::sleep(Duration::from_millis(200)).await;
        if done.load(Ordering::Relaxed) >= next {
            samples.push((next, size("lock_holders"), size("lock_waiters")));
            next += cycles / 4;
        }
    }
    for t in tasks {
        t.await.unwrap();
    }
    let took = started.elapsed();
    let final_sizes = (size("lock_holders"), size("lock_waiters"));
    let vacuums = b.pg.query_in(
        &db,
        "SELECT relname, autovacuum_count, n_dead_tup FROM pg_stat_user_tables \
         WHERE relname IN ('lock_holders', 'lock_waiters') ORDER BY 1",
    );
    let mut rows = String::from("| cycles | lock_holders | lock_waiters |\n|---|---|---|\n");
    for (at, h, f) in &samples {
        rows.push_str(&format!("| {at} | {h} kB | {f} kB |\n"));
    }
    rows.push_str(&format!(
        "| {cycles} (end) | {} kB | {} kB |\n",
        final_sizes.0, final_sizes.1
    ));
    b.section(
        &format!("Case P6 — table size after {cycles} lock cycles"),
        &format!(
            "32 tasks of one client on 1,000 names, {:.0} s ({:.0} cycles/s); autovacuum at its \
             defaults. `pg_total_relation_size` (heap, indexes, TOAST).\n\n{rows}\n\
             Autovacuum runs and dead rows at the end: {vacuums:?}.",
            took.as_secs_f64(),
            cycles as f64 / took.as_secs_f64()
        ),
    );
}

fn machine(pg: &PostgresServer) -> String {
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let version = pg.scalar("SHOW server_version");
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    format!(
        "{cpus} CPUs (load average at the start: {}), PostgreSQL {version} on this machine over \
         TCP to 127.0.0.1, `fsync=on`, `synchronous_commit=on`, `full_page_writes=on`, \
         shared_buffers 64MB; release build.",
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    )
}

fn main() {
    // `cargo bench` passes `--bench`; a filter argument is not supported.
    let quick = std::env::var("LOCKBENCH_QUICK").is_ok_and(|v| !v.is_empty() && v != "0");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let pg = PostgresServer::options().durable().start();
    let dbs = Who::ALL.iter().map(|&w| (w, pg.fresh_database())).collect();
    let mut b = Bench {
        pg,
        quick,
        dbs,
        out: String::new(),
        targets: Vec::new(),
    };
    for (_, db) in &b.dbs {
        b.pg.psql_in(db, LEASE_ROW_TABLE);
    }
    let machine = machine(&b.pg);
    let started = Instant::now();
    // LOCKBENCH_PG_ONLY=1,2: some cases only (docs left as they are).
    let only: Option<Vec<u32>> = std::env::var("LOCKBENCH_PG_ONLY")
        .ok()
        .map(|v| v.split(',').filter_map(|c| c.trim().parse().ok()).collect());
    let run = |case: u32| only.as_ref().is_none_or(|o| o.contains(&case));
    rt.block_on(async {
        if only.as_ref().is_some_and(|o| o.contains(&0)) {
            diagnose(&mut b).await;
        }
        if run(1) {
            eprintln!("== case P1: one task");
            one_task(&mut b).await;
        }
        if run(2) {
            eprintln!("== case P2: 32 tasks on 32 keys");
            throughput(&mut b).await;
        }
        if run(3) {
            eprintln!("== case P3: WAL and statements");
            wal_and_statements(&mut b).await;
        }
        if run(4) {
            eprintln!("== case P4: hand-off");
            hand_off(&mut b).await;
        }
        if run(5) {
            eprintln!("== case P5: renewals");
            renewals(&mut b).await;
        }
        if run(6) {
            eprintln!("== case P6: table size");
            table_size(&mut b).await;
        }
    });
    let doc = format!(
        "{BEGIN}\n## PostgreSQL engine (`cargo bench -p tests --bench postgres`)\n\n\
         Written by `tests/benches/postgres.rs`; run: {:.0} s{}. {machine}\n\n\
         | target | measured | |\n|---|---|---|\n{}\n\n{}{END}\n",
        started.elapsed().as_secs_f64(),
        if quick { " (LOCKBENCH_QUICK)" } else { "" },
        b.targets.join("\n"),
        b.out
    );
    println!("{doc}");
    if quick || only.is_some() {
        eprintln!("quick or partial run: docs/BENCHMARKS.md left as it is");
        return;
    }
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/BENCHMARKS.md");
    let old = std::fs::read_to_string(path).unwrap_or_default();
    let new = match (old.find(BEGIN), old.find(END)) {
        (Some(a), Some(z)) if a < z => {
            let rest = old[z + END.len()..]
                .strip_prefix('\n')
                .unwrap_or(&old[z + END.len()..]);
            format!("{}{doc}{rest}", &old[..a])
        }
        _ => format!("{}\n{doc}", old.trim_end()),
    };
    match std::fs::write(path, new) {
        Ok(()) => eprintln!("wrote its section of docs/BENCHMARKS.md"),
        Err(e) => eprintln!("could not write docs/BENCHMARKS.md: {e}"),
    }
}
