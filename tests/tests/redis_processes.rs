//! Several OS processes contending through one `redis-server`.

use std::collections::HashSet;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use lock_runtime::{LockClient, LockError};
use tests::{spawn_tied, unique, RedisServer};

fn worker(args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_lock_worker"));
    cmd.args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    cmd
}

#[test]
fn mutual_exclusion_across_processes() {
    let server = RedisServer::start();
    let key = unique("procs");
    let (procs, rounds) = (4, 150);
    let children: Vec<_> = (0..procs)
        .map(|_| {
            spawn_tied(worker(&[
                "increment",
                &server.url(),
                &key,
                &rounds.to_string(),
            ]))
            .unwrap()
        })
        .collect();
    let mut fences = Vec::new();
    for child in children {
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "worker failed: {:?}", out.status);
        for line in String::from_utf8(out.stdout).unwrap().lines() {
            fences.push(line.strip_prefix("FENCE ").unwrap().parse::<u64>().unwrap());
        }
    }
    let count: i64 = server.cmd(&["GET", &format!("{key}:counter")]);
    assert_eq!(
        count,
        procs * rounds,
        "lost updates: the lock let two holders in"
    );
    assert_eq!(fences.len(), (procs * rounds) as usize);
    let unique_fences: HashSet<_> = fences.iter().collect();
    assert_eq!(
        unique_fences.len(),
        fences.len(),
        "two holders got the same fence"
    );
    // Nothing of the locks is left but the token counter.
    assert_eq!(server.keys("lock:*"), ["lock:fence"]);
}

#[tokio::test]
async fn killed_holder_frees_the_lock_after_its_lease() {
    let server = RedisServer::start();
    let key = unique("crash");
    let lease_ms = 1500;
    let mut child = spawn_tied(worker(&[
        "hold",
        &server.url(),
        &key,
        &lease_ms.to_string(),
    ]))
    .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(line.starts_with("HELD "), "holder said {line:?}");

    let client = LockClient::connect(&server.url()).await.unwrap();
    // Alive and renewing: held well past its lease.
    tokio::time::sleep(Duration::from_millis(lease_ms * 2)).await;
    let err = client.lock(&key).wait(Duration::ZERO).await.unwrap_err();
    assert!(matches!(err, LockError::Timeout { .. }), "{err:?}");

    child.kill().unwrap();
    let killed_at = Instant::now();
    child.wait().unwrap();
    let guard = client
        .lock(&key)
        .wait(Duration::from_secs(10))
        .await
        .expect("lock never came free after the holder died");
    let freed_after = killed_at.elapsed();
    // Free within about one lease (plus a retry), never before the lease
    // the holder last renewed could have run out.
    assert!(
        freed_after < Duration::from_millis(lease_ms + 2500),
        "took {freed_after:?}"
    );
    assert!(guard.fence() >= 2);
    guard.release().await.unwrap();
}
