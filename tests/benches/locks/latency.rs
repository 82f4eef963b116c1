//! Cases 1 and 2: the Redis floor and uncontended lock + unlock, one task.

use std::future::Future;
use std::time::{Duration, Instant};

use lock_runtime::{distributed_lock, LockError};
use redis::aio::ConnectionManager;

use crate::captured::Captured;
use crate::monitor::{self, RoundTrips};
use crate::python;
use crate::report::Report;
use crate::stats::{fmt_opt, ratio, Samples};
use crate::unfenced::{self, unfenced};
use crate::Ctx;

const LEASE: Duration = Duration::from_secs(30);

/// Case 2's attribute contender: an empty body. Returns whether the body ran
/// under a lock (false while the attribute is a pass-through).
#[distributed_lock(key = "c2:macro:{i}")]
pub async fn empty_body(i: u64) -> Result<bool, LockError> {
    let _ = i;
    Ok(lock_runtime::current_fence().is_some())
}

/// Time `n` sequential calls of `op(first + k)`.
async fn time_each<F, Fut>(first: u64, n: usize, mut op: F) -> Samples
where
    F: FnMut(u64) -> Fut,
    Fut: Future<Output = ()>,
{
    let mut s = Samples::with_capacity(n);
    for k in 0..n as u64 {
        let t0 = Instant::now();
        op(first + k).await;
        s.push(t0.elapsed());
    }
    s
}

pub async fn ping(conn: &ConnectionManager) {
    let mut c = conn.clone();
    let _: String = redis::cmd("PING").query_async(&mut c).await.expect("PING");
}

/// Our client's acquire on a fresh key, exactly as the runtime sends it
/// (captured once with `MONITOR`: `EVALSHA` of the acquire script).
pub async fn evalsha_acquire(conn: &ConnectionManager, acquire: &Captured, tag: &str, i: u64) {
    let mut c = conn.clone();
    let reply: redis::Value = acquire
        .cmd_for(&format!("{tag}:{i}"))
        .query_async(&mut c)
        .await
        .expect("floor acquire");
    assert!(
        Captured::took(&reply),
        "floor acquire hit a held key: {reply:?}"
    );
}

pub async fn ours_manual(ctx: &Ctx, tag: &str, i: u64) {
    let guard = ctx
        .ours
        .lock(format!("{tag}:{i}"))
        .lease(LEASE)
        .await
        .expect("lock");
    guard.release().await.expect("release");
}

/// The same without a fencing token; `false` where this build has no
/// unfenced lock.
pub async fn ours_unfenced(ctx: &Ctx, tag: &str, i: u64) -> bool {
    let Some(request) = unfenced(ctx.ours.lock(format!("{tag}:{i}")).lease(LEASE)) else {
        return false;
    };
    let guard = request.await.expect("unfenced lock");
    guard.release().await.expect("release");
    true
}

pub async fn rslock_cycle(mgr: &rslock::LockManager, tag: &str, i: u64) {
    let key = format!("{tag}:{i}");
    let lock = mgr.lock(key.as_str(), LEASE).await.expect("rslock lock");
    mgr.unlock(&lock).await;
}

pub struct Floor {
    pub ping: Samples,
    pub evalsha: Samples,
    /// The same on a current-thread runtime on a thread of its own, where
    /// the connection's driver and the caller share the thread: the lowest
    /// latency the `redis` crate gets here.
    pub ping_ct: Samples,
    pub evalsha_ct: Samples,
}

/// Floor samples taken on a fresh current-thread runtime on its own thread.
fn floor_current_thread(ctx: &Ctx, first: u64, n: usize, warm: usize) -> (Samples, Samples) {
    let (port, acquire) = (ctx.server.port(), ctx.acquire.clone());
    let connect = ctx.floor_conn_config();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async move {
            let client = redis::Client::open(format!("redis://127.0.0.1:{port}")).expect("url");
            let conn = ConnectionManager::new_with_config(client, connect)
                .await
                .expect("floor connection");
            time_each(0, warm, |_| ping(&conn)).await;
            time_each(first, warm, |i| {
                evalsha_acquire(&conn, &acquire, "c1ctwarm", i)
            })
            .await;
            let p = time_each(first, n, |_| ping(&conn)).await;
            let e = time_each(first, n, |i| evalsha_acquire(&conn, &acquire, "c1ct", i)).await;
            (p, e)
        })
    })
    .join()
    .expect("floor thread")
}

pub fn run(ctx: &Ctx, report: &mut Report) -> Floor {
    let (rounds, per, warm) = if ctx.quick {
        (2, 200, 50)
    } else {
        (5, 1000, 200)
    };
    let count_n: u64 = if ctx.quick { 50 } else { 200 };
    let conn = ctx.rt.block_on(ctx.floor_conn(ctx.server.port()));
    let sha = &ctx.acquire;
    let macro_locks = ctx.rt.block_on(empty_body(u64::MAX)).unwrap_or(false);

    let mut floor = Floor {
        ping: Samples::default(),
        evalsha: Samples::default(),
        ping_ct: Samples::default(),
        evalsha_ct: Samples::default(),
    };
    let (mut manual, mut attr, mut rs, mut py) = (
        Samples::default(),
        Samples::default(),
        Samples::default(),
        Samples::default(),
    );
    let has_unfenced = unfenced::available(&ctx.ours);
    let mut bare = Samples::default();
    let mut py_err = None;
    // Warm every path once (connections, script caches, branch predictors).
    ctx.rt.block_on(async {
        time_each(0, warm, |_| ping(&conn)).await;
        time_each(0, warm, |i| evalsha_acquire(&conn, sha, "c1warm", i)).await;
        time_each(0, warm, |i| ours_manual(ctx, "c2warm:manual", i)).await;
        if has_unfenced {
            time_each(0, warm, |i| async move {
                ours_unfenced(ctx, "c2warm:bare", i).await;
            })
            .await;
        }
        time_each(0, warm, |i| async move {
            empty_body(1_000_000_000 + i).await.expect("attribute");
        })
        .await;
        time_each(0, warm, |i| rslock_cycle(&ctx.rslock, "c2warm:rslock", i)).await;
    });
    // Rounds interleave the contenders so that a burst of noise from other
    // work on the machine lands on all of them alike.
    let (mut manual_rounds, mut attr_rounds) = (Vec::new(), Vec::new());
    for r in 0..rounds {
        let first = (r * per) as u64;
        let (p, e) = floor_current_thread(ctx, first, per, warm);
        floor.ping_ct.append(p);
        floor.evalsha_ct.append(e);
        ctx.rt.block_on(async {
            floor
                .ping
                .append(time_each(first, per, |_| ping(&conn)).await);
            floor
                .evalsha
                .append(time_each(first, per, |i| evalsha_acquire(&conn, sha, "c1", i)).await);
            let m = time_each(first, per, |i| ours_manual(ctx, "c2:manual", i)).await;
            manual_rounds.push(m.clone());
            manual.append(m);
            let a = time_each(first, per, |i| async move {
                empty_body(i).await.expect("attribute");
            })
            .await;
            attr_rounds.push(a.clone());
            attr.append(a);
            if has_unfenced {
                bare.append(
                    time_each(first, per, |i| async move {
                        ours_unfenced(ctx, "c2:bare", i).await;
                    })
                    .await,
                );
            }
            rs.append(time_each(first, per, |i| rslock_cycle(&ctx.rslock, "c2:rslock", i)).await);
        });
        if let Some(p) = &ctx.py {
            match p.run(
                ctx.server.port(),
                "uncontended",
                &[
                    ("n", per.to_string()),
                    ("warmup", (warm / 2).to_string()),
                    ("tag", format!("c2:py:{r}")),
                ],
            ) {
                Ok(v) => py.append(python::samples(&v, "samples_ns")),
                Err(e) => py_err = Some(e),
            }
        }
    }

    // Round trips per cycle.
    let mut admin = ctx.server.conn();
    let port = ctx.server.port();
    let mut count = |external: bool, run: &mut dyn FnMut(&str) -> Result<(), String>| {
        monitor::count(&mut admin, port, count_n, external, run)
            .map_err(|e| eprintln!("counting round trips failed: {e}"))
            .ok()
    };
    let rt_manual = count(false, &mut |_| {
        ctx.rt.block_on(time_each(0, count_n as usize, |i| {
            ours_manual(ctx, "c2count:manual", i)
        }));
        Ok(())
    });
    let rt_bare = has_unfenced
        .then(|| {
            count(false, &mut |_| {
                ctx.rt
                    .block_on(time_each(0, count_n as usize, |i| async move {
                        ours_unfenced(ctx, "c2count:bare", i).await;
                    }));
                Ok(())
            })
        })
        .flatten();
    let rt_attr = count(false, &mut |_| {
        ctx.rt
            .block_on(time_each(0, count_n as usize, |i| async move {
                empty_body(2_000_000_000 + i).await.expect("attribute");
            }));
        Ok(())
    });
    let rt_rs = count(false, &mut |_| {
        ctx.rt.block_on(time_each(0, count_n as usize, |i| {
            rslock_cycle(&ctx.rslock, "c2count:rslock", i)
        }));
        Ok(())
    });
    let rt_py = ctx.py.as_ref().and_then(|p| {
        count(true, &mut |id| {
            p.run(
                port,
                "count",
                &[
                    ("n", count_n.to_string()),
                    ("warmup", "20".into()),
                    ("tag", "c2count:py".into()),
                    ("marker", id.to_owned()),
                ],
            )
            .map(|_| ())
        })
    });

    // Case 1.
    report.heading("Case 1 — the floor: raw round trips with the `redis` crate");
    report.para(&format!(
        "One task, `redis::aio::ConnectionManager` configured as the runtime configures its own, {} samples each in \
         {rounds} rounds interleaved with case 2. `EVALSHA acquire` sends, on a fresh key, the command our client \
         sends to take a free lock ({} of the acquire script, captured once with `MONITOR` and replayed with \
         the key replaced). Two placements: the caller on the bench's multi-thread runtime (where the lock \
         contenders run), and a current-thread runtime on a thread of its own, where the caller and the \
         connection's driver share one thread (like the runtime's I/O thread). The lower EVALSHA p50 of the two is \
         the floor that case 2 is held to.",
        floor.ping.len(),
        ctx.acquire.name()
    ));
    report.table(
        &["op", "caller", "p50", "p99"],
        &[
            vec![
                "PING".into(),
                "multi-thread runtime".into(),
                fmt_opt(floor.ping.p50()),
                fmt_opt(floor.ping.p99()),
            ],
            vec![
                "PING".into(),
                "current-thread runtime".into(),
                fmt_opt(floor.ping_ct.p50()),
                fmt_opt(floor.ping_ct.p99()),
            ],
            vec![
                "EVALSHA acquire".into(),
                "multi-thread runtime".into(),
                fmt_opt(floor.evalsha.p50()),
                fmt_opt(floor.evalsha.p99()),
            ],
            vec![
                "EVALSHA acquire".into(),
                "current-thread runtime".into(),
                fmt_opt(floor.evalsha_ct.p50()),
                fmt_opt(floor.evalsha_ct.p99()),
            ],
        ],
    );

    // Case 2.
    let evalsha_floor = floor.evalsha.p50().min(floor.evalsha_ct.p50());
    let two = evalsha_floor.map(|x| 2.0 * x as f64).unwrap_or(f64::NAN);
    let attr_ok = macro_locks;
    let row = |name: &str, s: &Samples, rts: &Option<RoundTrips>, valid: bool| -> Vec<String> {
        if !valid || s.is_empty() {
            return vec![
                name.into(),
                "n/a".into(),
                "n/a".into(),
                "n/a".into(),
                "n/a".into(),
                "n/a".into(),
            ];
        }
        let (rtc, cmds) = match rts {
            Some(r) => (
                format!(
                    "{:.2} ({}){}",
                    r.per_cycle(),
                    r.breakdown(),
                    if r.consistent() { "" } else { " ⚠" }
                ),
                format!("{:.2}", r.commands_per_cycle()),
            ),
            None => ("n/a".into(), "n/a".into()),
        };
        vec![
            name.into(),
            fmt_opt(s.p50()),
            fmt_opt(s.p99()),
            ratio(s.p50().unwrap_or(0) as f64, two),
            rtc,
            cmds,
        ]
    };
    report.heading("Case 2 — uncontended lock + unlock, one task, a fresh key per cycle");
    report.para(&format!(
        "{} cycles per contender in {rounds} interleaved rounds (after {warm} warm-up cycles). \
         Round trips per cycle: commands the client sent, counted with `MONITOR` between two markers over \
         {count_n} cycles (commands that scripts run are tagged `lua` there and left out); the last column is \
         the `INFO commandstats` total over the same window, which also counts the commands the scripts run.",
        manual.len()
    ));
    let mut rows = vec![
        row(
            "ours, manual API (`client.lock(k).await` + `release().await`)",
            &manual,
            &rt_manual,
            true,
        ),
        if has_unfenced {
            row(
                "ours, unfenced (`client.lock(k).fence(false)`)",
                &bare,
                &rt_bare,
                true,
            )
        } else {
            vec![
                "ours, unfenced (`fence(false)`)".into(),
                unfenced::MISSING.into(),
                "".into(),
                "".into(),
                "".into(),
                "".into(),
            ]
        },
        row(
            "ours, `#[distributed_lock]` on an empty body",
            &attr,
            &rt_attr,
            attr_ok,
        ),
        row("rslock (`lock` + `unlock`)", &rs, &rt_rs, true),
    ];
    match (&ctx.py, &py_err) {
        (Some(p), None) => rows.push(row(
            &format!("{} `Lock` (`acquire` + `release`)", p.describe),
            &py,
            &rt_py,
            true,
        )),
        (_, Some(e)) => rows.push(vec![
            format!("redis-py: {e}"),
            "".into(),
            "".into(),
            "".into(),
            "".into(),
            "".into(),
        ]),
        (None, None) => rows.push(vec![
            "redis-py: not installed".into(),
            "".into(),
            "".into(),
            "".into(),
            "".into(),
            "".into(),
        ]),
    }
    report.table(
        &[
            "contender",
            "p50",
            "p99",
            "p50 ÷ (2 × EVALSHA floor p50)",
            "round trips / cycle",
            "Redis commands / cycle",
        ],
        &rows,
    );
    if !attr_ok {
        report.para(
            "The attribute row is empty: in this build `#[distributed_lock]` did not take a lock (the body saw no \
             fence), i.e. lock-macros is still a pass-through.",
        );
    }

    // Held to the floor placement by placement: see `placements.rs`.
    let m50 = manual.p50().unwrap_or(0) as f64;
    let a50 = attr.p50().unwrap_or(0) as f64;
    report.target(
        "2",
        "attribute p50 ≤ 1.05 × manual API p50",
        if attr_ok {
            format!(
                "{} ({} vs {})",
                ratio(a50, m50),
                fmt_opt(attr.p50()),
                fmt_opt(manual.p50())
            )
        } else {
            "attribute does not lock yet (lock-macros stub)".into()
        },
        attr_ok.then_some(a50 <= 1.05 * m50),
    );
    if attr_ok {
        let per_round: Vec<f64> = attr_rounds
            .iter()
            .zip(&manual_rounds)
            .filter_map(|(a, m)| Some(a.p50()? as f64 / m.p50()? as f64))
            .collect();
        let lo = per_round.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = per_round.iter().copied().fold(0.0, f64::max);
        report.why(format!(
            "the attribute does more per call than `lock().await` + `release()`: it opens the task-local \
             reentry scope and polls the body beside the loss watch (`LockRequest::run`), {} per cycle here. \
             Round by round the ratio ranged {lo:.2}–{hi:.2}×. What would meet it: a scope that costs \
             nothing until a nested call asks for it.",
            fmt_opt(Some((a50 - m50).max(0.0) as u64)),
        ));
    }
    if let Some(r) = &rt_manual {
        report.target(
            "2",
            "2 round trips per lock + unlock (EVALSHA + EVALSHA)",
            format!("{:.2} ({})", r.per_cycle(), r.breakdown()),
            Some((r.per_cycle() - 2.0).abs() < 0.01),
        );
        report.target(
            "2",
            "≤ 7 Redis commands per uncontended lock + unlock (scripts' inner calls included)",
            format!("{:.2}", r.commands_per_cycle()),
            Some(r.commands_per_cycle() <= 7.0 + 0.01),
        );
        report.why(
            "besides its two EVALSHA, the fenced acquire runs TIME and one SET ... GET on the \
             slot's counter (the token), SET NX PX (the lock) and an HDEL of the owner from \
             the waiters' hash, and the release GET and DEL. The HDEL is there because a \
             waiting acquire may be a copy the transport sent again after an earlier copy \
             queued its owner: a copy that then takes a free lock must leave the queue \
             (docs/RELIABILITY.md, \"Delayed and repeated replies\"). What would meet it: \
             dropping that HDEL, safe only where the transport never repeats a command; \
             `fence(false)` runs 4 (round_trips.rs)",
        );
    }
    floor
}
