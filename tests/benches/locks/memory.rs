//! Case 10: what stays in the server per distinct lock name once its lock
//! is released: `used_memory` and keys, right after the traffic and once
//! the keys that carry a TTL are gone.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lock_runtime::LockClient;

use crate::report::Report;
use crate::servers;
use crate::stats::{fmt_bytes, fmt_count, fmt_ns};
use crate::unfenced::{self, unfenced};
use crate::Ctx;

const TASKS: usize = 64;
const LEASE: Duration = Duration::from_secs(30);

/// `24.0 h`, `30 min`, `12.5 s`.
fn fmt_ttl(ms: i64) -> String {
    let s = ms.max(0) as f64 / 1000.0;
    if s >= 3600.0 {
        format!("{:.1} h", s / 3600.0)
    } else if s >= 60.0 {
        format!("{:.0} min", s / 60.0)
    } else {
        format!("{s:.1} s")
    }
}

/// `used_memory` once it stops moving (the server resizes its tables and
/// trims buffers in its periodic cron): two readings 100 ms apart within
/// 4 KiB, or the last of 30.
fn settled_memory(conn: &mut redis::Connection) -> i64 {
    let mut last = servers::used_memory(conn);
    for _ in 0..30 {
        std::thread::sleep(Duration::from_millis(100));
        let now = servers::used_memory(conn);
        if (now - last).abs() < 4096 {
            return now;
        }
        last = now;
    }
    last
}

/// Delete every key that carries a TTL: what their expiry leaves behind,
/// without waiting for it. Returns the longest TTL found (ms).
fn expire_now(conn: &mut redis::Connection) -> i64 {
    let mut cursor: u64 = 0;
    let mut longest = 0;
    loop {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("COUNT")
            .arg(1000)
            .query(conn)
            .expect("SCAN");
        if !keys.is_empty() {
            let mut pipe = redis::pipe();
            for k in &keys {
                pipe.cmd("PTTL").arg(k);
            }
            let ttls: Vec<i64> = pipe.query(conn).expect("PTTL");
            let doomed: Vec<&String> = keys
                .iter()
                .zip(&ttls)
                .filter(|(_, &t)| t >= 0)
                .map(|(k, _)| k)
                .collect();
            longest = ttls.iter().copied().fold(longest, i64::max);
            if !doomed.is_empty() {
                let _: i64 = redis::cmd("DEL").arg(&doomed).query(conn).expect("DEL");
            }
        }
        cursor = next;
        if cursor == 0 {
            return longest;
        }
    }
}

/// Run `op(i)` for every `i < n`, `TASKS` at a time.
async fn each<F, Fut>(n: u64, op: F)
where
    F: Fn(u64) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let next = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = (0..TASKS)
        .map(|_| {
            let (next, op) = (next.clone(), op.clone());
            tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= n {
                        break;
                    }
                    op(i).await;
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("memory task");
    }
}

struct Left {
    server: String,
    who: &'static str,
    n: u64,
    took: Duration,
    /// Bytes above the empty server's, right after the traffic.
    after: i64,
    keys_after: u64,
    ttl_after: u64,
    /// The same once the keys with a TTL are gone.
    expired: i64,
    keys_expired: u64,
    longest_ttl_ms: i64,
}

fn measure(
    ctx: &Ctx,
    server: &str,
    port: u16,
    who: &'static str,
    n: u64,
    cycle: impl Fn(u64) -> std::pin::Pin<Box<dyn Future<Output = ()> + Send>>
        + Clone
        + Send
        + Sync
        + 'static,
) -> Left {
    let mut admin = servers::conn(port);
    servers::flushall(&mut admin);
    let base = settled_memory(&mut admin);
    let t0 = Instant::now();
    ctx.rt.block_on(each(n, cycle));
    let took = t0.elapsed();
    let after = settled_memory(&mut admin) - base;
    let (keys_after, ttl_after) = servers::keyspace(&mut admin);
    let longest_ttl_ms = expire_now(&mut admin);
    let expired = settled_memory(&mut admin) - base;
    let (keys_expired, _) = servers::keyspace(&mut admin);
    servers::flushall(&mut admin);
    Left {
        server: server.into(),
        who,
        n,
        took,
        after,
        keys_after,
        ttl_after,
        expired,
        keys_expired,
        longest_ttl_ms,
    }
}

pub fn run(ctx: &Ctx, report: &mut Report) {
    let n: u64 = if ctx.quick { 10_000 } else { 100_000 };
    let has_unfenced = unfenced::available(&ctx.ours);
    let mut targets = vec![(servers::describe(&mut ctx.server.conn()), ctx.server.port())];
    if let Ok(o) = &ctx.other {
        targets.push((o.describe.clone(), o.port()));
    }
    let mut results = Vec::new();
    for (s, (name, port)) in targets.iter().enumerate() {
        let url = format!("redis://127.0.0.1:{port}");
        let ours = ctx
            .rt
            .block_on(LockClient::connect(&url))
            .expect("connect for case 10");
        let mut variants: Vec<(&'static str, bool)> = vec![("ours, fenced (default)", false)];
        if has_unfenced {
            variants.push(("ours, `fence(false)`", true));
        }
        for (who, bare) in variants {
            let ours = ours.clone();
            results.push(measure(ctx, name, *port, who, n, move |i| {
                let ours = ours.clone();
                Box::pin(async move {
                    let request = ours.lock(format!("c10:{s}:{bare}:{i}")).lease(LEASE);
                    let request = if bare {
                        unfenced(request).expect("unfenced locks in this build")
                    } else {
                        request
                    };
                    let guard = request.await.expect("lock");
                    guard.release().await.expect("release");
                })
            }));
        }
        let mgr = rslock::LockManager::new(vec![url]);
        results.push(measure(ctx, name, *port, "rslock", n, move |i| {
            let mgr = mgr.clone();
            Box::pin(async move {
                let key = format!("c10:{s}:r:{i}");
                let lock = mgr.lock(key.as_str(), LEASE).await.expect("rslock lock");
                mgr.unlock(&lock).await;
            })
        }));
    }

    report.heading("Case 10 — what stays in the server per distinct lock name");
    report.para(&format!(
        "{} distinct names, each locked and released once ({TASKS} tasks), on an emptied server. \
         Per name: (`used_memory` − the empty server's) ÷ names, and keys left ÷ names (`INFO keyspace`), \
         right after the traffic, then once every key that carries a TTL is gone. Those are deleted by the \
         bench (`SCAN` + `PTTL` + `DEL`), which leaves what their expiry would leave, without waiting for it; \
         the longest TTL they had is shown. `used_memory` is read once it settles (two readings 100 ms apart \
         within 4 KiB). What stays for good is the last two columns. No target: the figures say what the \
         layout leaves.",
        fmt_count(n as f64)
    ));
    // (Within half a byte of nothing: "0 B", not "-0 B".)
    let per = |b: i64, n: u64| {
        let x = b as f64 / n as f64;
        fmt_bytes(if x.abs() < 0.5 { 0.0 } else { x })
    };
    let keys = |k: u64, n: u64| format!("{:.2} ({})", k as f64 / n as f64, fmt_count(k as f64));
    let rows: Vec<Vec<String>> = results
        .iter()
        .map(|r| {
            vec![
                r.server.clone(),
                r.who.into(),
                fmt_count(r.n as f64),
                fmt_ns(r.took.as_nanos() as u64),
                per(r.after, r.n),
                keys(r.keys_after, r.n),
                keys(r.ttl_after, r.n),
                if r.ttl_after > 0 {
                    fmt_ttl(r.longest_ttl_ms)
                } else {
                    "—".into()
                },
                per(r.expired, r.n),
                keys(r.keys_expired, r.n),
            ]
        })
        .collect();
    report.table(
        &[
            "server",
            "contender",
            "names",
            "took",
            "memory / name, right after",
            "keys / name (in all)",
            "of them with a TTL",
            "longest TTL",
            "memory / name, TTL'd keys gone",
            "keys / name (in all)",
        ],
        &rows,
    );
    if !has_unfenced {
        report.para(&format!("Unfenced rows: {}.", unfenced::MISSING));
    }
    if let Err(e) = &ctx.other {
        report.para(&format!("Second server: {e}."));
    }
}
