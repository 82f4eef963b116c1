//! A job scheduled on every instance that must run once per period: three
//! instances (three clients, each with its own connections) tick every
//! period with clocks that disagree by up to 150 ms, and each takes the
//! job's lock with `wait = 0`, skip-if-busy and a `min_hold` of most of the
//! period (ShedLock's lockAtLeastFor). The job itself takes 20 ms: without
//! `min_hold`, an instance whose clock runs late would find the lock free
//! again and run the job a second time in the same period.
//!
//! `cargo run -p examples --bin scheduled-job` (uses `REDIS_URL`, else a
//! temporary `redis-server` if one is on `PATH`, else the in-memory
//! backend).
//!
//! With the attribute, the job is
//! `#[distributed_lock(key = "job:report", lease = "2s", wait = "0s", on_busy = "skip", min_hold = "800ms", max_hold = "5s")]`
//! on an `async fn report() -> Result<(), AppError>`; here each instance
//! needs its own client, so the job is run with `LockRequest::run_or_skip`,
//! which is what the attribute expands to.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use examples::instances::Instances;
use lock_runtime::LockError;

const PERIOD: Duration = Duration::from_secs(1);
const PERIODS: u32 = 5;
const INSTANCES: u32 = 3;

#[tokio::main]
async fn main() -> Result<(), LockError> {
    let Instances {
        clients,
        on,
        redis: temp,
    } = Instances::connect(INSTANCES as usize).await?;
    println!(
        "{INSTANCES} instances, a run every {PERIOD:?} for {PERIODS} periods, on {}",
        on
    );

    // (period, instance) of every run.
    let runs: Arc<Mutex<Vec<(u32, u32)>>> = Arc::default();
    let start = Instant::now() + Duration::from_millis(200);
    let mut instances = Vec::new();
    for (i, client) in clients.into_iter().enumerate() {
        let runs = runs.clone();
        // This instance's clock is `skew` late.
        let skew = Duration::from_millis(75 * i as u64);
        instances.push(tokio::spawn(async move {
            let mut ticks = tokio::time::interval_at((start + skew).into(), PERIOD);
            for period in 0..PERIODS {
                ticks.tick().await;
                let ran = client
                    .lock("job:report")
                    .lease(Duration::from_secs(2))
                    .wait(Duration::ZERO)
                    .min_hold(PERIOD * 8 / 10)
                    .max_hold(Duration::from_secs(5))
                    .run_or_skip(async {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        runs.lock().unwrap().push((period, i as u32));
                    })
                    .await?;
                let what = if ran.is_some() {
                    "ran the job"
                } else {
                    "skipped: another instance has it"
                };
                println!("  period {period}, instance {i}: {what}");
            }
            Ok::<(), LockError>(())
        }));
    }
    for i in instances {
        i.await.expect("instance panicked")?;
    }

    let runs = runs.lock().unwrap();
    let per_period: Vec<usize> = (0..PERIODS)
        .map(|p| runs.iter().filter(|(q, _)| *q == p).count())
        .collect();
    let once = per_period.iter().all(|&n| n == 1);
    println!(
        "runs per period: {per_period:?} -> {}",
        if once {
            format!(
                "ran exactly once per period ({} runs in {PERIODS} periods)",
                runs.len()
            )
        } else {
            "NOT once per period".to_owned()
        }
    );
    drop(temp);
    if once {
        Ok(())
    } else {
        std::process::exit(1)
    }
}
