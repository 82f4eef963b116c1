//! A connection-kill storm: `CLIENT KILL` of the normal (script) and
//! pub/sub connections every few hundred milliseconds while holders hold
//! and waiters wait on a few hot keys, from several clients. With wait
//! budget left, a waiter never fails; no hold is lost; two holders never
//! overlap; a waiter gets the lock within a second of its release.
//! Bounded by default; `FAULT_FULL=1` runs it for a minute.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lock_runtime::{LockClient, LockError};
use tests::{unique, RedisServer};

fn full() -> bool {
    std::env::var("FAULT_FULL").is_ok_and(|v| v != "0" && !v.is_empty())
}

const CLIENTS: usize = 4;
const TASKS_PER_CLIENT: usize = 4;
const KEYS: usize = 3;
const WAIT: Duration = Duration::from_secs(10);

#[derive(Default)]
struct Figures {
    acquired: AtomicU64,
    waiter_errors: AtomicU64,
    timeouts: AtomicU64,
    lost: AtomicU64,
    overlaps: AtomicU64,
    kills: AtomicU64,
    killed_connections: AtomicU64,
    samples: Mutex<Vec<String>>,
    /// Release → the next holder's body, for acquisitions that were waiting
    /// when the release happened.
    handoffs: Mutex<Vec<Duration>>,
}

/// Per key: who is inside, and when the last holder released.
#[derive(Default)]
struct KeyState {
    inside: AtomicU64,
    released: Mutex<Option<Instant>>,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_kill_storm_under_holders_and_waiters() {
    tests::init_tracing();
    let server = RedisServer::start();
    let run_for = if full() {
        Duration::from_secs(60)
    } else {
        Duration::from_secs(6)
    };
    let mut clients = Vec::new();
    for _ in 0..CLIENTS {
        clients.push(
            LockClient::builder()
                .wait(Duration::ZERO) // tries once unless a request says otherwise
                .lease(Duration::from_secs(2))
                .connect(&server.url())
                .await
                .unwrap(),
        );
    }
    let keys: Vec<String> = (0..KEYS).map(|_| unique("storm")).collect();
    let state: Arc<HashMap<String, KeyState>> = Arc::new(
        keys.iter()
            .map(|k| (k.clone(), KeyState::default()))
            .collect(),
    );
    let figures = Arc::new(Figures::default());
    let stop = Arc::new(AtomicBool::new(false));

    let mut tasks = Vec::new();
    for client in &clients {
        for t in 0..TASKS_PER_CLIENT {
            let (client, keys, state, figures, stop) = (
                client.clone(),
                keys.clone(),
                state.clone(),
                figures.clone(),
                stop.clone(),
            );
            tasks.push(tokio::spawn(async move {
                let mut i = t;
                while !stop.load(Ordering::Relaxed) {
                    i += 1;
                    let key = &keys[i % keys.len()];
                    let st = &state[key];
                    let asked = Instant::now();
                    let guard = match client.lock(key).wait(WAIT).await {
                        Ok(g) => g,
                        Err(LockError::Timeout { .. }) => {
                            figures.timeouts.fetch_add(1, Ordering::Relaxed);
                            continue;
                        }
                        Err(e) => {
                            let left = WAIT.saturating_sub(asked.elapsed());
                            figures.waiter_errors.fetch_add(1, Ordering::Relaxed);
                            figures
                                .samples
                                .lock()
                                .unwrap()
                                .push(format!("{e} ({left:?} of the wait left)"));
                            continue;
                        }
                    };
                    let got = Instant::now();
                    if st.inside.fetch_add(1, Ordering::SeqCst) != 0 {
                        figures.overlaps.fetch_add(1, Ordering::Relaxed);
                    }
                    if let Some(released) = *st.released.lock().unwrap() {
                        if released > asked {
                            figures.handoffs.lock().unwrap().push(got - released);
                        }
                    }
                    figures.acquired.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(fastrand::u64(5..40))).await;
                    st.inside.fetch_sub(1, Ordering::SeqCst);
                    *st.released.lock().unwrap() = Some(Instant::now());
                    match guard.release().await {
                        Ok(()) => {}
                        Err(LockError::Lost { key }) => {
                            figures.lost.fetch_add(1, Ordering::Relaxed);
                            figures.samples.lock().unwrap().push(format!("lost {key}"));
                        }
                        Err(e) => {
                            figures
                                .samples
                                .lock()
                                .unwrap()
                                .push(format!("release: {e}"));
                        }
                    }
                }
            }));
        }
    }

    // The storm: kill every normal, then every pub/sub connection, every
    // 200-400 ms.
    let started = Instant::now();
    let mut normal = true;
    while started.elapsed() < run_for {
        tokio::time::sleep(Duration::from_millis(fastrand::u64(200..400))).await;
        let kind = if normal { "normal" } else { "pubsub" };
        normal = !normal;
        let n: i64 = server.cmd(&["CLIENT", "KILL", "TYPE", kind]);
        figures.kills.fetch_add(1, Ordering::Relaxed);
        figures
            .killed_connections
            .fetch_add(n as u64, Ordering::Relaxed);
    }
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        tokio::time::timeout(WAIT * 2, t)
            .await
            .expect("a task hung")
            .unwrap();
    }

    let f = &figures;
    let mut handoffs = f.handoffs.lock().unwrap().clone();
    handoffs.sort();
    let pct = |p: f64| -> Duration {
        handoffs
            .get(((handoffs.len() as f64 - 1.0) * p) as usize)
            .copied()
            .unwrap_or_default()
    };
    println!("\n== connection-kill storm ({run_for:?}, {CLIENTS} clients x {TASKS_PER_CLIENT} tasks, {KEYS} keys) ==");
    println!(
        "  kills {} ({} connections), acquisitions {}, waiter errors {}, timeouts {}, lost holds {}, overlaps {}",
        f.kills.load(Ordering::Relaxed),
        f.killed_connections.load(Ordering::Relaxed),
        f.acquired.load(Ordering::Relaxed),
        f.waiter_errors.load(Ordering::Relaxed),
        f.timeouts.load(Ordering::Relaxed),
        f.lost.load(Ordering::Relaxed),
        f.overlaps.load(Ordering::Relaxed),
    );
    println!(
        "  hand-off release -> waiter: {} samples, p50 {:?}, p99 {:?}, max {:?}",
        handoffs.len(),
        pct(0.5),
        pct(0.99),
        handoffs.last().copied().unwrap_or_default()
    );
    let samples = f.samples.lock().unwrap();
    for s in samples.iter().take(10) {
        println!("  sample: {s}");
    }
    assert!(
        f.killed_connections.load(Ordering::Relaxed) > 0,
        "the storm killed nothing"
    );
    assert!(
        f.acquired.load(Ordering::Relaxed) > 100,
        "too little work to judge"
    );
    assert_eq!(f.waiter_errors.load(Ordering::Relaxed), 0, "{samples:?}");
    assert_eq!(f.timeouts.load(Ordering::Relaxed), 0, "a waiter starved");
    assert_eq!(f.lost.load(Ordering::Relaxed), 0, "{samples:?}");
    assert_eq!(
        f.overlaps.load(Ordering::Relaxed),
        0,
        "two holders overlapped"
    );
    assert!(
        handoffs.last().copied().unwrap_or_default() < Duration::from_secs(1),
        "a waiter got the lock {:?} after its release",
        handoffs.last()
    );
}
