//! Case 5: Redlock over 5 local masters, each behind a proxy that adds 1 ms
//! of one-way latency in each direction.

use std::time::{Duration, Instant};

use lock_runtime::LockClient;

use crate::latency::ping;
use crate::proxy::Proxy;
use crate::report::Report;
use crate::stats::{fmt_opt, ratio, Samples};
use crate::Ctx;
use tests::RedisServer;

const MASTERS: usize = 5;
const ONE_WAY: Duration = Duration::from_millis(1);
const LEASE: Duration = Duration::from_secs(30);

pub fn run(ctx: &Ctx, report: &mut Report) {
    let (rounds, per) = if ctx.quick { (1, 50) } else { (3, 200) };
    let servers: Vec<RedisServer> = (0..MASTERS).map(|_| RedisServer::start()).collect();
    let proxies: Vec<Proxy> = servers
        .iter()
        .map(|s| Proxy::start(s.port(), ONE_WAY).expect("start proxy"))
        .collect();
    let urls: Vec<String> = proxies.iter().map(Proxy::url).collect();
    let refs: Vec<&str> = urls.iter().map(String::as_str).collect();

    let rt = &ctx.rt;
    let ours_rl = rt.block_on(redlock_client(&refs[..]));
    let ours_one = rt
        .block_on(LockClient::connect(&urls[0]))
        .expect("connect through the proxy");
    let rs_rl = rslock::LockManager::new(urls.clone());
    let rs_one = rslock::LockManager::new(vec![urls[0].clone()]);
    let floor_conn = rt.block_on(ctx.floor_conn(proxies[0].port));

    let mut ping_s = Samples::default();
    let (mut a, mut b, mut c, mut d) = (
        Samples::default(),
        Samples::default(),
        Samples::default(),
        Samples::default(),
    );
    let ours_rl = match ours_rl {
        Ok(c) => Some(c),
        Err(e) => {
            report.para(&format!("Case 5: `LockClient::redlock` failed: {e}"));
            None
        }
    };
    rt.block_on(async {
        // Warm-up: connections, scripts.
        for i in 0..10u64 {
            ping(&floor_conn).await;
            if let Some(rl) = &ours_rl {
                rl.lock(format!("c5warm:rl:{i}"))
                    .await
                    .expect("redlock")
                    .release()
                    .await
                    .expect("release");
            }
            ours_one
                .lock(format!("c5warm:one:{i}"))
                .await
                .expect("lock")
                .release()
                .await
                .expect("release");
            rs_rl
                .lock(format!("c5warm:rsrl:{i}").as_str(), LEASE)
                .await
                .expect("rslock")
                .release()
                .await;
            rs_one
                .lock(format!("c5warm:rs1:{i}").as_str(), LEASE)
                .await
                .expect("rslock")
                .release()
                .await;
        }
        for r in 0..rounds {
            for _ in 0..per {
                let t = Instant::now();
                ping(&floor_conn).await;
                ping_s.push(t.elapsed());
            }
            if let Some(rl) = &ours_rl {
                for i in 0..per as u64 {
                    let t = Instant::now();
                    let g = rl
                        .lock(format!("c5:rl:{r}:{i}"))
                        .lease(LEASE)
                        .await
                        .expect("redlock lock");
                    a.push(t.elapsed());
                    g.release().await.expect("redlock release");
                }
            }
            for i in 0..per as u64 {
                let t = Instant::now();
                let g = ours_one
                    .lock(format!("c5:one:{r}:{i}"))
                    .lease(LEASE)
                    .await
                    .expect("lock");
                b.push(t.elapsed());
                g.release().await.expect("release");
            }
            for i in 0..per as u64 {
                let key = format!("c5:rsrl:{r}:{i}");
                let t = Instant::now();
                let l = rs_rl
                    .lock(key.as_str(), LEASE)
                    .await
                    .expect("rslock redlock");
                c.push(t.elapsed());
                rs_rl.unlock(&l).await;
            }
            for i in 0..per as u64 {
                let key = format!("c5:rs1:{r}:{i}");
                let t = Instant::now();
                let l = rs_one.lock(key.as_str(), LEASE).await.expect("rslock");
                d.push(t.elapsed());
                rs_one.unlock(&l).await;
            }
        }
    });

    report.heading("Case 5 — Redlock: 5 local masters, each behind a proxy adding 1 ms each way");
    report.para(&format!(
        "Acquire latency only (lock granted → guard in hand), a fresh key each time, {} samples per contender in \
         {rounds} interleaved rounds. Each master sits behind a small TCP proxy in this process that delivers every \
         chunk 1 ms after it read it, in each direction; `PING` through one proxy is the floor. Single-master rows \
         use master 1 through its proxy.",
        b.len()
    ));
    let base = b.p50().unwrap_or(0) as f64;
    let row = |name: &str, masters: usize, s: &Samples| {
        vec![
            name.to_string(),
            masters.to_string(),
            fmt_opt(s.p50()),
            fmt_opt(s.p99()),
            if s.is_empty() {
                "n/a".into()
            } else {
                ratio(s.p50().unwrap_or(0) as f64, base)
            },
        ]
    };
    report.table(
        &[
            "contender",
            "masters",
            "acquire p50",
            "acquire p99",
            "p50 ÷ ours single-master",
        ],
        &[
            row("floor: `PING` through one proxy", 1, &ping_s),
            if ours_rl.is_some() {
                row("ours, `LockClient::redlock`", MASTERS, &a)
            } else {
                vec![
                    "ours, `LockClient::redlock` (failed)".into(),
                    MASTERS.to_string(),
                    "n/a".into(),
                    "n/a".into(),
                    "n/a".into(),
                ]
            },
            row("ours, `LockClient::connect` (single master)", 1, &b),
            row("rslock `LockManager` (Redlock)", MASTERS, &c),
            row("rslock `LockManager` (single master)", 1, &d),
        ],
    );
    let (a50, c50) = (a.p50().map(|x| x as f64), c.p50().map(|x| x as f64));
    report.target(
        "5",
        "ours Redlock acquire p50 ≤ 1.3 × ours single-master",
        a50.map_or("n/a".into(), |x| {
            format!(
                "{} ({} vs {})",
                ratio(x, base),
                fmt_opt(a.p50()),
                fmt_opt(b.p50())
            )
        }),
        a50.map(|x| x <= 1.3 * base),
    );
    report.target(
        "5",
        "ours Redlock acquire p50 ≤ 1.0 × rslock's",
        match (a50, c50) {
            (Some(x), Some(y)) => format!(
                "{} of rslock ({} vs {})",
                ratio(x, y),
                fmt_opt(a.p50()),
                fmt_opt(c.p50())
            ),
            _ => "n/a".into(),
        },
        a50.zip(c50).map(|(x, y)| x <= y),
    );
    if let (Some(x), Some(y), Some(b50), Some(d50)) = (a50, c50, b.p50(), d.p50()) {
        report.why(format!(
            "ours takes {} longer than rslock across {MASTERS} masters, and {} longer on one master ({}): \
             each node runs our acquire script (which hands out the fencing token) where rslock sends \
             `SET NX PX`, and here {MASTERS} servers and their proxies share 2 cores, so the nodes' script \
             time adds up. What would meet it: a per-node acquire as cheap as `SET NX PX`, which a fencing \
             token that survives a majority rules out.",
            fmt_opt(Some((x - y).max(0.0) as u64)),
            fmt_opt(Some(b50.saturating_sub(d50))),
            ratio(b50 as f64, d50 as f64)
        ));
    }
    drop(servers);
}

async fn redlock_client(urls: &[&str]) -> Result<LockClient, String> {
    LockClient::redlock(urls).await.map_err(|e| e.to_string())
}
