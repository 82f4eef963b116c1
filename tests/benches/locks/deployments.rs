//! Case 7: acquire latency of every deployment, as a ratio to one Redis, in
//! one run on local servers (no added latency): what the extra safety of
//! each deployment costs per lock.

use std::time::{Duration, Instant};

use lock_runtime::LockClient;
use tests::cluster::Cluster;
use tests::sentinel::{start_replica, wait_replicas_online, Sentinels, Timing};
use tests::RedisServer;

use crate::report::Report;
use crate::stats::{fmt_opt, ratio, Samples};
use crate::Ctx;

const MASTER: &str = "benchmaster";

struct Contender {
    name: &'static str,
    setup: &'static str,
    client: LockClient,
    acquire: Samples,
    release: Samples,
}

pub fn run(ctx: &Ctx, report: &mut Report) {
    let (rounds, per) = if ctx.quick { (1, 100) } else { (3, 500) };
    let rt = &ctx.rt;

    // Every deployment on servers of its own, started before any sample.
    let single = RedisServer::start();
    let primary = RedisServer::start();
    let replica = start_replica(primary.port());
    wait_replicas_online(&primary, 1, Duration::from_secs(20));
    let sentinels = Sentinels::start(3, MASTER, &primary, Timing::default());
    sentinels.wait_ready(1, Duration::from_secs(20));
    let cluster = Cluster::start(3, 1, 5000);
    let masters: Vec<RedisServer> = (0..5).map(|_| RedisServer::start()).collect();
    let urls: Vec<String> = masters.iter().map(RedisServer::url).collect();

    let mut contenders: Vec<Contender> = Vec::new();
    let mut add = |name, setup, client: Result<LockClient, lock_runtime::LockError>| match client {
        Ok(client) => contenders.push(Contender {
            name,
            setup,
            client,
            acquire: Samples::default(),
            release: Samples::default(),
        }),
        Err(e) => eprintln!("case 7: {name} failed to connect: {e}"),
    };
    add(
        "one Redis (`connect`)",
        "1 server",
        rt.block_on(LockClient::connect(&single.url())),
    );
    add(
        "in-memory (`memory`)",
        "this process",
        Ok(LockClient::memory()),
    );
    add(
        "Sentinel (`sentinel`)",
        "primary + 1 replica, 3 sentinels",
        rt.block_on(LockClient::sentinel(sentinels.urls(), MASTER)),
    );
    add(
        "Sentinel + `replica_acks(1, 1 s)`",
        "primary + 1 replica, 3 sentinels",
        rt.block_on(
            LockClient::builder()
                .replica_acks(1, Duration::from_secs(1))
                .sentinel(sentinels.urls(), MASTER),
        ),
    );
    add(
        "Redis Cluster (`cluster`)",
        "3 primaries + 3 replicas",
        rt.block_on(LockClient::cluster(cluster.urls())),
    );
    add(
        "Redlock, 3 masters (`redlock`)",
        "3 independent servers",
        rt.block_on(LockClient::redlock(&urls[..3])),
    );
    add(
        "Redlock, 5 masters (`redlock`)",
        "5 independent servers",
        rt.block_on(LockClient::redlock(&urls)),
    );

    rt.block_on(async {
        for c in &contenders {
            for i in 0..20 {
                let g = c.client.lock(format!("c7warm:{i}")).await.expect("warm-up");
                g.release().await.expect("warm-up release");
            }
        }
        // Interleaved rounds: a slow spell of the machine hits every row.
        for round in 0..rounds {
            for (n, c) in contenders.iter_mut().enumerate() {
                for i in 0..per {
                    let key = format!("c7:{round}:{n}:{i}");
                    let t0 = Instant::now();
                    let g = c.client.lock(key).await.expect("acquire");
                    let t1 = Instant::now();
                    g.release().await.expect("release");
                    c.acquire.push(t1 - t0);
                    c.release.push(t1.elapsed());
                }
            }
        }
    });
    drop(replica);

    report.heading("Case 7 — acquire latency by deployment");
    report.para(&format!(
        "One task, a fresh key per lock, {} acquire + release pairs per deployment in {rounds} interleaved \
         round(s), every server local (no added latency). Acquire = `lock(k).await` until the guard is in hand; \
         release = `guard.release().await`. The ratio compares each deployment's acquire p50 with one Redis \
         measured in the same rounds.",
        rounds * per
    ));
    let base = contenders
        .iter()
        .find(|c| c.name.starts_with("one Redis"))
        .and_then(|c| c.acquire.p50())
        .unwrap_or(0) as f64;
    let rows: Vec<Vec<String>> = contenders
        .iter()
        .map(|c| {
            vec![
                c.name.to_string(),
                c.setup.to_string(),
                fmt_opt(c.acquire.p50()),
                fmt_opt(c.acquire.p99()),
                ratio(c.acquire.p50().unwrap_or(0) as f64, base),
                fmt_opt(c.release.p50()),
            ]
        })
        .collect();
    report.table(
        &[
            "deployment",
            "servers",
            "acquire p50",
            "acquire p99",
            "p50 ÷ one Redis",
            "release p50",
        ],
        &rows,
    );
}
