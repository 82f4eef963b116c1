//! Case 12: throughput where only Redis should bound it: 1,000 tasks on
//! 1,000 keys (one client), and 10 clients of 64 tasks each, fenced and
//! unfenced, against rslock in the same run.

use std::time::Duration;

use lock_runtime::LockClient;

use crate::latency::rslock_cycle;
use crate::report::Report;
use crate::stats::fmt_count;
use crate::throughput::{run_n_tasks, Window};
use crate::unfenced::{self, unfenced};
use crate::Ctx;

/// Tasks of the one-client shape; each keeps its own key, so 1,000 keys.
const WIDE: usize = 1000;
/// Clients of the many-clients shape, and tasks on each.
const CLIENTS: usize = 10;
const PER_CLIENT: usize = 64;

/// One cycle on client `c`'s key for task `t`, fenced or not.
async fn cycle(client: &LockClient, key: String, fence: bool) {
    let request = client.lock(key);
    let request = if fence {
        request
    } else {
        unfenced(request).expect("unfenced locks in this build")
    };
    let guard = request.await.expect("lock");
    guard.release().await.expect("release");
}

pub fn run(ctx: &Ctx, report: &mut Report) {
    let warm = Duration::from_millis(500);
    let window = Duration::from_secs(if ctx.quick { 1 } else { 3 });
    let port = ctx.server.port();
    let has_unfenced = unfenced::available(&ctx.ours);
    let clients: Vec<LockClient> = (0..CLIENTS)
        .map(|_| {
            ctx.rt
                .block_on(LockClient::connect(&ctx.server.url()))
                .expect("connect a client")
        })
        .collect();
    let managers: Vec<rslock::LockManager> = (0..CLIENTS)
        .map(|_| rslock::LockManager::new(vec![ctx.server.url()]))
        .collect();

    let mut rows: Vec<Vec<String>> = Vec::new();
    let mut push = |name: String, w: &Window, rs: Option<f64>| {
        rows.push(vec![
            name,
            fmt_count(w.per_sec),
            rs.map_or("—".into(), |r| format!("{:.2}×", w.per_sec / r)),
            format!("{:.1} µs", w.redis_cpu * 1e6),
            format!("{:.1} µs", w.client_cpu * 1e6),
        ]);
    };

    // 1,000 tasks on 1,000 keys, one client.
    let mgr = ctx.rslock.clone();
    let rs_wide = ctx
        .rt
        .block_on(run_n_tasks(port, WIDE, warm, window, move |t, _| {
            let mgr = mgr.clone();
            async move { rslock_cycle(&mgr, &format!("c12:wide:rs:{t}"), 0).await }
        }));
    push(
        format!("rslock, {WIDE} tasks on {WIDE} keys"),
        &rs_wide,
        None,
    );
    for fence in [true, false] {
        if !fence && !has_unfenced {
            continue;
        }
        let ours = ctx.ours.clone();
        let w = ctx
            .rt
            .block_on(run_n_tasks(port, WIDE, warm, window, move |t, _| {
                let ours = ours.clone();
                async move { cycle(&ours, format!("c12:wide:{fence}:{t}"), fence).await }
            }));
        push(
            format!(
                "ours, {}, {WIDE} tasks on {WIDE} keys",
                if fence { "fenced" } else { "unfenced" }
            ),
            &w,
            Some(rs_wide.per_sec),
        );
    }

    // 10 clients of 64 tasks, a key per task.
    let tasks = CLIENTS * PER_CLIENT;
    let rs_many = ctx.rt.block_on(run_n_tasks(port, tasks, warm, window, {
        let managers = managers.clone();
        move |t, _| {
            let mgr = managers[t / PER_CLIENT].clone();
            async move { rslock_cycle(&mgr, &format!("c12:many:rs:{t}"), 0).await }
        }
    }));
    push(
        format!("rslock, {CLIENTS} managers × {PER_CLIENT} tasks"),
        &rs_many,
        None,
    );
    for fence in [true, false] {
        if !fence && !has_unfenced {
            continue;
        }
        let clients = clients.clone();
        let w = ctx
            .rt
            .block_on(run_n_tasks(port, tasks, warm, window, move |t, _| {
                let client = clients[t / PER_CLIENT].clone();
                async move { cycle(&client, format!("c12:many:{fence}:{t}"), fence).await }
            }));
        push(
            format!(
                "ours, {}, {CLIENTS} clients × {PER_CLIENT} tasks",
                if fence { "fenced" } else { "unfenced" }
            ),
            &w,
            Some(rs_many.per_sec),
        );
    }
    let _: () = redis::cmd("FLUSHALL")
        .query(&mut ctx.server.conn())
        .expect("FLUSHALL");
    for c in clients {
        ctx.rt.block_on(c.close(Duration::from_secs(1)));
    }

    report.heading("Case 12 — throughput at scale: 1,000 keys, 10 clients");
    report.para(&format!(
        "Lock + unlock cycles per second, {}-s window after {} ms warm-up, one round. Each task keeps one key \
         (reused every cycle), so the first shape holds 1,000 keys and the second 640. Ours: one `LockClient` \
         (first shape) or {CLIENTS} `LockClient`s, each its own connection and I/O thread (second shape); \
         rslock: one `LockManager` or {CLIENTS}. Redis and client CPU per cycle as in case 3.",
        window.as_secs(),
        warm.as_millis()
    ));
    report.table(
        &[
            "contender",
            "cycles / s",
            "÷ rslock",
            "Redis CPU / cycle",
            "client CPU / cycle",
        ],
        &rows,
    );
}
