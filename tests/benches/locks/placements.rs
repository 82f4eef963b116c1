//! Case 2, by placement: one uncontended lock + unlock against two raw
//! `EVALSHA` round trips sent from the same place. A lock is held to what
//! the `redis` crate costs where its caller runs: a task of a multi-thread
//! runtime, a current-thread runtime, a multi-thread runtime's `block_on`
//! (where a raw connection's replies cross threads, and ours come from the
//! client's I/O thread).

use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, Instant};

use lock_runtime::LockClient;
use redis::aio::{ConnectionManager, MultiplexedConnection};

use crate::captured::Captured;
use crate::report::Report;
use crate::stats::{fmt_opt, ratio, Samples};
use crate::Ctx;

const LEASE: Duration = Duration::from_secs(30);

#[derive(Clone, Copy, PartialEq, Eq)]
enum Place {
    Task,
    CurrentThread,
    BlockOn,
}

impl Place {
    const ALL: [Place; 3] = [Place::Task, Place::CurrentThread, Place::BlockOn];

    fn label(self) -> &'static str {
        match self {
            Place::Task => "a task of a multi-thread runtime",
            Place::CurrentThread => "a current-thread runtime",
            Place::BlockOn => "a multi-thread runtime's `block_on`",
        }
    }
}

/// What one placement measured: one raw EVALSHA over a
/// `ConnectionManager` and over a bare `MultiplexedConnection` (what our
/// client sends on), ours fenced, unfenced.
#[derive(Default)]
struct Measured {
    evalsha: Samples,
    evalsha_mux: Samples,
    fenced: Samples,
    unfenced: Samples,
}

type Job = Pin<Box<dyn Future<Output = [Samples; 4]> + Send>>;

/// `per` samples of each, interleaved in blocks of 50 so that a slow spell
/// of the machine lands on all three alike.
fn job(
    client: LockClient,
    (conn, mux): (ConnectionManager, MultiplexedConnection),
    acquire: Captured,
    tag: &'static str,
    first: u64,
    per: usize,
) -> Job {
    Box::pin(async move {
        let (mut e, mut x, mut f, mut u) = (
            Samples::with_capacity(per),
            Samples::with_capacity(per),
            Samples::with_capacity(per),
            Samples::with_capacity(per),
        );
        let mut k = first;
        while e.len() < per {
            for _ in 0..50 {
                let mut c = conn.clone();
                let t0 = Instant::now();
                let reply: redis::Value = acquire
                    .cmd_for(&format!("c2p:{tag}:raw:{k}"))
                    .query_async(&mut c)
                    .await
                    .expect("floor acquire");
                e.push(t0.elapsed());
                assert!(Captured::took(&reply), "floor acquire hit a held key");
                k += 1;
            }
            for _ in 0..50 {
                let mut c = mux.clone();
                let t0 = Instant::now();
                let reply: redis::Value = acquire
                    .cmd_for(&format!("c2p:{tag}:mux:{k}"))
                    .query_async(&mut c)
                    .await
                    .expect("floor acquire");
                x.push(t0.elapsed());
                assert!(Captured::took(&reply), "floor acquire hit a held key");
                k += 1;
            }
            for fence in [true, false] {
                for _ in 0..50 {
                    let key = format!("c2p:{tag}:{fence}:{k}");
                    let t0 = Instant::now();
                    let guard = client
                        .lock(key)
                        .lease(LEASE)
                        .fence(fence)
                        .await
                        .expect("lock");
                    guard.release().await.expect("release");
                    if fence { &mut f } else { &mut u }.push(t0.elapsed());
                    k += 1;
                }
            }
        }
        [e, x, f, u]
    })
}

pub fn run(ctx: &Ctx, report: &mut Report) {
    let (rounds, per, warm) = if ctx.quick {
        (2, 200, 100)
    } else {
        (5, 1000, 200)
    };
    let ct = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("current-thread runtime");
    // Each placement's raw connection is driven where its caller runs
    // (`block_on`'s by the multi-thread runtime's workers, as there).
    let mux = || async {
        redis::Client::open(ctx.server.url())
            .expect("url")
            .get_multiplexed_async_connection()
            .await
            .expect("floor connection")
    };
    let mt_conn = (
        ctx.rt.block_on(ctx.floor_conn(ctx.server.port())),
        ctx.rt.block_on(mux()),
    );
    let ct_conn = (
        ct.block_on(ctx.floor_conn(ctx.server.port())),
        ct.block_on(mux()),
    );
    let go = |place: Place, first: u64, n: usize| {
        let (client, acquire) = (ctx.ours.clone(), ctx.acquire.clone());
        match place {
            Place::Task => {
                let j = job(client, mt_conn.clone(), acquire, "task", first, n);
                ctx.rt
                    .block_on(async { tokio::spawn(j).await })
                    .expect("task")
            }
            Place::CurrentThread => {
                ct.block_on(job(client, ct_conn.clone(), acquire, "ct", first, n))
            }
            Place::BlockOn => {
                ctx.rt
                    .block_on(job(client, mt_conn.clone(), acquire, "blockon", first, n))
            }
        }
    };
    for place in Place::ALL {
        go(place, 10_000_000, warm);
    }
    let mut m: Vec<Measured> = Place::ALL.iter().map(|_| Measured::default()).collect();
    for r in 0..rounds {
        for (i, place) in Place::ALL.into_iter().enumerate() {
            let [e, x, f, u] = go(place, (r * per * 4) as u64, per);
            m[i].evalsha.append(e);
            m[i].evalsha_mux.append(x);
            m[i].fenced.append(f);
            m[i].unfenced.append(u);
        }
    }

    report.para(&format!(
        "By placement: the same cycle sent from three places, each against two raw `EVALSHA acquire` round \
         trips (case 1's command) from the same place, over a connection driven where that caller runs: a \
         `ConnectionManager` (case 1's) and a bare `MultiplexedConnection`, the transport our client itself \
         sends on (no reconnecting layer). The target holds ours to the lower of the two. {} samples of each \
         in {rounds} rounds, in blocks of 50 so that the machine's slow spells land on all alike. Under \
         `block_on` our commands go over the client's I/O thread (its replies cross one thread, as the raw \
         connection's do to reach a thread outside the runtime's workers).",
        m[0].evalsha.len()
    ));
    let mut rows = Vec::new();
    for (i, place) in Place::ALL.into_iter().enumerate() {
        let two_of = |s: &Samples| s.p50().map_or(f64::NAN, |x| 2.0 * x as f64);
        let two = two_of(&m[i].evalsha).min(two_of(&m[i].evalsha_mux));
        let f50 = m[i].fenced.p50().unwrap_or(0) as f64;
        let u50 = m[i].unfenced.p50().unwrap_or(0) as f64;
        rows.push(vec![
            place.label().into(),
            fmt_opt(m[i].evalsha.p50().map(|x| 2 * x)),
            fmt_opt(m[i].evalsha_mux.p50().map(|x| 2 * x)),
            format!("{} ({})", fmt_opt(m[i].fenced.p50()), ratio(f50, two)),
            format!("{} ({})", fmt_opt(m[i].unfenced.p50()), ratio(u50, two)),
        ]);
        report.target(
            "2",
            format!(
                "lock + unlock p50 ≤ 1.05 × two raw EVALSHA round trips from {}",
                place.label()
            ),
            format!(
                "{} fenced ({} vs {}); {} `fence(false)`",
                ratio(f50, two),
                fmt_opt(m[i].fenced.p50()),
                fmt_opt(Some(two as u64)),
                ratio(u50, two)
            ),
            Some(f50 <= 1.05 * two),
        );
    }
    report.table(
        &[
            "caller",
            "2 × raw EVALSHA p50, `ConnectionManager`",
            "2 × raw EVALSHA p50, `MultiplexedConnection`",
            "ours, fenced p50 (÷ the lower raw)",
            "ours, `fence(false)` p50 (÷ the lower raw)",
        ],
        &rows,
    );
}
