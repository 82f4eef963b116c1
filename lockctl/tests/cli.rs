//! The `lockctl` binary against real servers: what it prints (text and
//! JSON), its exit status (0 found, 1 not found, 2 error), a forced
//! release that serves the waiter, `list` over every primary of a Cluster,
//! TLS with an ACL user, and a clear error for a server that is down or
//! silent.

use std::process::Command;
use std::time::{Duration, Instant};

use lock_runtime::{LockClient, LockError, LockGuard};
use serde_json::Value;
use tests::cluster::{key_slot, Cluster};
use tests::proxy::{Mode, Proxy};
use tests::{eventually, free_port, unique, RedisServer};

/// What one run of `lockctl` did.
#[derive(Debug)]
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
    took: Duration,
}

impl Run {
    /// Every stdout line as JSON.
    fn json(&self) -> Vec<Value> {
        self.stdout
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l:?}: {e}")))
            .collect()
    }

    fn one(&self) -> Value {
        let mut all = self.json();
        assert_eq!(all.len(), 1, "{self:?}");
        all.remove(0)
    }
}

/// Run `lockctl args` (off the async runtime), with `REDIS_URL` set to
/// `env_url` if given and unset otherwise.
async fn lockctl(env_url: Option<&str>, args: &[&str]) -> Run {
    match env_url {
        Some(url) => lockctl_with(&[("REDIS_URL", url)], args).await,
        None => lockctl_with(&[], args).await,
    }
}

/// Run `lockctl args` with exactly these of the deployment variables set.
async fn lockctl_with(vars: &[(&str, &str)], args: &[&str]) -> Run {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_lockctl"));
    cmd.args(args);
    for var in [
        "REDIS_URL",
        "LOCK_REDIS_URL",
        "LOCK_REDIS_SENTINELS",
        "LOCK_REDIS_MASTER",
        "LOCK_REDIS_CLUSTER",
        "LOCK_REDIS_REDLOCK",
    ] {
        cmd.env_remove(var);
    }
    for (k, v) in vars {
        cmd.env(k, v);
    }
    tokio::task::spawn_blocking(move || {
        let started = Instant::now();
        let out = cmd.output().expect("run lockctl");
        Run {
            code: out.status.code().expect("lockctl was killed"),
            stdout: String::from_utf8(out.stdout).unwrap(),
            stderr: String::from_utf8(out.stderr).unwrap(),
            took: started.elapsed(),
        }
    })
    .await
    .unwrap()
}

fn strings(v: &Value) -> Vec<&str> {
    v.as_array()
        .unwrap_or_else(|| panic!("not an array: {v}"))
        .iter()
        .map(|s| s.as_str().unwrap())
        .collect()
}

/// A lock held by `guard`, as lockctl's JSON shows it.
fn assert_shows(v: &Value, guard: &LockGuard, waiters: u64) {
    assert_eq!(v["key"], guard.key());
    assert_eq!(v["mode"], "write");
    assert_eq!(strings(&v["holders"]), [guard.holder()]);
    assert_eq!(v["waiters"], waiters);
    assert_eq!(v["fence"], guard.fence());
    let ttl = v["ttl_ms"].as_u64().expect("a lease left");
    assert!(ttl > 0 && ttl <= 30_000, "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn show_list_and_release_on_one_redis() {
    let server = RedisServer::start();
    let url = server.url();
    let (a, b) = (
        LockClient::connect(&url).await.unwrap(),
        LockClient::connect(&url).await.unwrap(),
    );
    let base = unique("cli");
    let (held, read, fenced) = (
        format!("{base}:held"),
        format!("{base}:read"),
        format!("{base}:fence-only"),
    );

    // Nothing there: status 1, and nothing on stdout in JSON.
    let run = lockctl(Some(&url), &["show", &held]).await;
    assert_eq!(
        (run.code, run.stdout.trim()),
        (1, &*format!("{held}: not held, nobody waits")),
        "{run:?}"
    );
    let run = lockctl(None, &["--url", &url, "--json", "show", &held]).await;
    assert_eq!((run.code, run.stdout.as_str()), (1, ""), "{run:?}");
    let run = lockctl(Some(&url), &["list", &format!("{base}:*"), "--json"]).await;
    assert_eq!((run.code, run.stdout.as_str()), (1, ""), "{run:?}");

    // A held key with a waiter of another client; a read-held key; a key
    // whose only trace is its fence counter.
    let holder = a.lock(&held).lease(Duration::from_secs(30)).await.unwrap();
    let waiter = {
        let (b, held) = (b.clone(), held.clone());
        tokio::spawn(async move { b.lock(&held).wait(Duration::from_secs(30)).await })
    };
    assert!(eventually(Duration::from_secs(10), || b.waiting_here(&held) == 1).await);
    let r1 = a.read_lock(&read).await.unwrap();
    let r2 = b.read_lock(&read).await.unwrap();
    a.lock(&fenced).await.unwrap().release().await.unwrap();

    // `--json` before or after the subcommand; the URL from $REDIS_URL or
    // --url.
    let run = lockctl(Some(&url), &["--json", "show", &held]).await;
    assert_eq!(run.code, 0, "{run:?}");
    assert_shows(&run.one(), &holder, 1);
    let run = lockctl(None, &["show", &held, "--json", "--url", &url]).await;
    assert_eq!(run.code, 0, "{run:?}");
    assert_shows(&run.one(), &holder, 1);
    let run = lockctl(Some(&url), &["--json", "show", &read]).await;
    let v = run.one();
    assert_eq!(v["mode"], "read");
    let mut readers = strings(&v["holders"]);
    readers.sort();
    let mut expected = [r1.holder(), r2.holder()];
    expected.sort();
    assert_eq!(readers, expected);
    assert_eq!(v["fence"], r1.fence());

    let run = lockctl(Some(&url), &["list", &format!("{base}:*"), "--json"]).await;
    assert_eq!(run.code, 0, "{run:?}");
    let listed = run.json();
    let keys: Vec<&str> = listed.iter().map(|v| v["key"].as_str().unwrap()).collect();
    assert_eq!(keys, [held.as_str(), read.as_str()], "{run:?}");
    assert_shows(&listed[0], &holder, 1);
    // Text: a header and one aligned row per lock.
    let run = lockctl(Some(&url), &["list", &format!("{base}:*")]).await;
    assert_eq!(run.code, 0, "{run:?}");
    let lines: Vec<&str> = run.stdout.lines().collect();
    assert_eq!(lines.len(), 3, "{run:?}");
    assert!(
        lines[0].starts_with("KEY") && lines[0].contains("HOLDERS"),
        "{run:?}"
    );
    assert!(
        lines[1].starts_with(&held) && lines[1].contains(holder.holder()),
        "{run:?}"
    );
    assert!(
        lines[2].starts_with(&read) && lines[2].contains(" read "),
        "{run:?}"
    );

    // Without --force: refused, and nothing changed.
    let run = lockctl(Some(&url), &["release", &held]).await;
    assert_eq!(run.code, 2, "{run:?}");
    assert!(run.stderr.contains("--force"), "{run:?}");
    assert!(!holder.is_lost());
    assert_eq!(
        a.inspect(&held).await.unwrap().unwrap().holders,
        [holder.holder()]
    );

    // With it: the waiter holds the lock when lockctl returns.
    let run = lockctl(Some(&url), &["--json", "release", &held, "--force"]).await;
    assert_eq!(run.code, 0, "{run:?}");
    let v = run.one();
    assert_eq!(v["released"], true);
    assert_eq!(strings(&v["before"]["holders"]), [holder.holder()]);
    let next = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the waiter was not served")
        .unwrap()
        .unwrap();
    assert_eq!(strings(&v["after"]["holders"]), [next.holder()]);
    assert_eq!(v["after"]["fence"], next.fence());
    assert!(matches!(
        holder.release().await,
        Err(LockError::Lost { .. })
    ));
    next.release().await.unwrap();

    // Nothing left to release: status 1.
    let run = lockctl(Some(&url), &["release", "--force", &held]).await;
    assert_eq!(run.code, 1, "{run:?}");
    assert!(run.stdout.contains("nothing released"), "{run:?}");

    // Another prefix is another set of locks.
    let app = LockClient::builder()
        .key_prefix("app:")
        .connect(&url)
        .await
        .unwrap();
    let other = app.lock(&held).await.unwrap();
    let run = lockctl(Some(&url), &["--json", "show", &held]).await;
    assert_eq!(run.code, 1, "{run:?}");
    let run = lockctl(Some(&url), &["--prefix", "app:", "--json", "show", &held]).await;
    assert_eq!(run.code, 0, "{run:?}");
    assert_shows(&run.one(), &other, 0);

    // Bad usage is an error too.
    let run = lockctl(Some(&url), &["show"]).await;
    assert_eq!(run.code, 2, "{run:?}");
    let run = lockctl(Some(&url), &["show", ""]).await;
    assert_eq!(run.code, 2, "{run:?}");
    assert!(run.stderr.contains("invalid lock key"), "{run:?}");
    for g in [other, r1, r2] {
        g.release().await.unwrap();
    }
}

/// A server that is down, or up but silent, is status 2 with a message
/// that says what failed, well before anyone would give up on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_server_is_a_clear_error() {
    let down = format!("redis://127.0.0.1:{}", free_port());
    let run = lockctl(Some(&down), &["list"]).await;
    println!("down: {:?} {}", run.took, run.stderr.trim());
    assert_eq!(run.code, 2, "{run:?}");
    assert!(
        run.stderr.contains("cannot reach the lock service"),
        "{run:?}"
    );
    assert!(run.stderr.contains("127.0.0.1"), "{run:?}");

    let server = RedisServer::start();
    let proxy = Proxy::for_server(&server);
    proxy.set(Mode::Blackhole);
    let run = lockctl(
        None,
        &["--url", &proxy.url(), "--timeout", "1s", "show", "k"],
    )
    .await;
    println!("silent: {:?} {}", run.took, run.stderr.trim());
    assert_eq!(run.code, 2, "{run:?}");
    assert!(run.stderr.contains("no answer within"), "{run:?}");
    // Bounded by the timeouts (connect + first answer), not hanging.
    assert!(run.took < Duration::from_secs(20), "{run:?}");

    let run = lockctl(None, &["list"]).await;
    assert_eq!(run.code, 2, "{run:?}");
    assert!(run.stderr.contains("REDIS_URL"), "{run:?}");
}

/// On a Cluster `list` scans every primary: keys spread over the slots of
/// all three are listed, each once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_on_a_cluster_covers_every_primary() {
    let cluster = Cluster::start(3, 0, 5000);
    let urls = cluster.urls();
    let client = LockClient::cluster(&urls).await.unwrap();
    let base = unique("cli-slots");
    // Four keys on each primary (names hash anywhere: pick them so).
    let mut per_primary = [0; 3];
    let mut keys: Vec<String> = (0..)
        .map(|i| format!("{base}:{i}"))
        .filter(|k| {
            let n = &mut per_primary[cluster.slot_owner(key_slot(&format!("lock:{{{k}}}")))];
            *n += 1;
            *n <= 4
        })
        .take(12)
        .collect();
    keys.sort();
    let mut guards = Vec::new();
    for k in &keys {
        // A short lease: the forced release below is noticed at the next
        // renewal, a second away.
        guards.push(client.lock(k).lease(Duration::from_secs(3)).await.unwrap());
    }
    let primaries: std::collections::BTreeSet<usize> = keys
        .iter()
        .map(|k| cluster.slot_owner(key_slot(&format!("lock:{{{k}}}"))))
        .collect();
    assert_eq!(primaries.len(), 3, "keys on {primaries:?} only");
    let run = lockctl(
        None,
        &[
            "--cluster",
            "--url",
            &urls[0],
            "--json",
            "list",
            &format!("{base}:*"),
        ],
    )
    .await;
    assert_eq!(run.code, 0, "{run:?}");
    let listed: Vec<String> = run
        .json()
        .iter()
        .map(|v| v["key"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(listed, keys);
    let run = lockctl(
        None,
        &[
            "--cluster",
            "--url",
            &urls.join(","),
            "--json",
            "show",
            &keys[5],
        ],
    )
    .await;
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(strings(&run.one()["holders"]), [guards[5].holder()]);
    let run = lockctl(
        None,
        &[
            "--cluster",
            "--url",
            &urls[1],
            "release",
            "--force",
            &keys[5],
        ],
    )
    .await;
    assert_eq!(run.code, 0, "{run:?}");
    assert!(
        tokio::time::timeout(Duration::from_secs(10), guards[5].lost())
            .await
            .is_ok()
    );
    for g in guards {
        let _ = g.release().await;
    }
}

/// `rediss://user:password@…` with a private CA (`--tls-ca`), as the
/// library takes it; a wrong password is status 2, and never printed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_and_an_acl_user() {
    use tests::tls::{tls_server, Certs, PASSWORD, USER};
    let certs = Certs::make();
    let (_server, tls_port) = tls_server(&certs);
    let ca = certs.path("ca.crt");
    let url = format!("rediss://{USER}:{PASSWORD}@127.0.0.1:{tls_port}");
    let client = LockClient::builder()
        .tls_root_ca(&std::fs::read(&ca).unwrap())
        .connect(&url)
        .await
        .unwrap();
    let k = unique("tls");
    let g = client.lock(&k).await.unwrap();
    let run = lockctl(Some(&url), &["--tls-ca", &ca, "--json", "show", &k]).await;
    assert_eq!(run.code, 0, "{run:?}");
    assert_shows(&run.one(), &g, 0);
    let wrong = format!("rediss://{USER}:not-the-pw@127.0.0.1:{tls_port}");
    let run = lockctl(Some(&wrong), &["--tls-ca", &ca, "show", &k]).await;
    assert_eq!(run.code, 2, "{run:?}");
    assert!(!run.stderr.contains("not-the-pw"), "{run:?}");
    g.release().await.unwrap();
}

/// `release --force --holder ID` clears only that holder: after the holder
/// `show` printed gave the lock up and another took it, the call leaves the
/// new holder alone (status 1); with the new holder's id it clears it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_of_one_holder_leaves_a_holder_that_took_over() {
    let server = RedisServer::start();
    let url = server.url();
    let a = LockClient::connect(&url).await.unwrap();
    let b = LockClient::connect(&url).await.unwrap();
    let key = unique("ctl-holder");

    let first = a.lock(&key).await.unwrap();
    let run = lockctl(Some(&url), &["--json", "show", &key]).await;
    assert_eq!(run.code, 0, "{run:?}");
    let seen = strings(&run.one()["holders"])[0].to_owned();
    assert_eq!(seen, first.holder());
    first.release().await.unwrap();
    let next = b.lock(&key).await.unwrap();

    let run = lockctl(Some(&url), &["release", &key, "--force", "--holder", &seen]).await;
    assert_eq!(run.code, 1, "{run:?}");
    assert!(run.stdout.contains("does not hold it"), "{run:?}");
    assert_eq!(
        a.inspect(&key).await.unwrap().expect("still held").holders,
        [next.holder()],
        "the holder that took over was cleared"
    );

    let run = lockctl(
        Some(&url),
        &[
            "--json",
            "release",
            &key,
            "--force",
            "--holder",
            next.holder(),
        ],
    )
    .await;
    assert_eq!(run.code, 0, "{run:?}");
    let v = run.one();
    assert_eq!(v["released"], true);
    assert_eq!(v["holder"], next.holder());
    assert!(v["after"].is_null(), "{v}");
    assert!(matches!(next.release().await, Err(LockError::Lost { .. })));
}

/// A service whose environment has both `REDIS_URL` and `LOCK_REDIS_URL`
/// (two different servers): `lockctl` without `--url` looks at the one
/// `LockClient::from_env` locks on, and finds the service's lock there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_url_lockctl_reads_the_environment_as_the_library_does() {
    let (general, locks) = (RedisServer::start(), RedisServer::start());
    let vars = [
        ("REDIS_URL", general.url()),
        ("LOCK_REDIS_URL", locks.url()),
    ];
    // The library, as a service configured so would build it (no other
    // test of this binary reads these variables in-process).
    for (k, v) in &vars {
        std::env::set_var(k, v);
    }
    let service = LockClient::from_env().await;
    for (k, _) in &vars {
        std::env::remove_var(k);
    }
    let service = service.unwrap();
    let key = unique("cli-env");
    let guard = service.lock(&key).await.unwrap();
    assert!(
        locks.exists(&format!("lock:{{{key}}}")),
        "the library locks on LOCK_REDIS_URL"
    );
    let vars: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let run = lockctl_with(&vars, &["--json", "show", &key]).await;
    assert_eq!(run.code, 0, "lockctl looked elsewhere: {run:?}");
    assert_shows(&run.one(), &guard, 0);
    // `--url` still comes first.
    let run = lockctl_with(&vars, &["--url", &general.url(), "show", &key]).await;
    assert_eq!(run.code, 1, "{run:?}");
    guard.release().await.unwrap();
}

/// A semaphore: `show` and `list` give its mode, its size and every permit
/// holder; `release --force --holder` frees that permit only (the waiter
/// gets it), `release --force` every permit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_semaphore_shows_every_permit_and_releases_one_or_all() {
    let server = RedisServer::start();
    let url = server.url();
    let (a, b) = (
        LockClient::connect(&url).await.unwrap(),
        LockClient::connect(&url).await.unwrap(),
    );
    let base = unique("ctl-sem");
    let key = format!("{base}:render");
    let p1 = a.semaphore(&key, 3).await.unwrap();
    let p2 = b.semaphore(&key, 3).await.unwrap();
    let p3 = a.semaphore(&key, 3).await.unwrap();
    let waiter = {
        let (b, key) = (b.clone(), key.clone());
        tokio::spawn(async move { b.semaphore(&key, 3).wait(Duration::from_secs(30)).await })
    };
    assert!(eventually(Duration::from_secs(10), || b.waiting_here(&key) == 1).await);
    let mut held = [p1.holder(), p2.holder(), p3.holder()];
    held.sort();
    let highest = p1.fence().max(p2.fence()).max(p3.fence());

    let run = lockctl(Some(&url), &["--json", "show", &key]).await;
    assert_eq!(run.code, 0, "{run:?}");
    let v = run.one();
    assert_eq!(
        (&v["mode"], &v["permits"]),
        (&"semaphore".into(), &3.into()),
        "{v}"
    );
    let mut shown = strings(&v["holders"]);
    shown.sort();
    assert_eq!(shown, held);
    assert_eq!(v["waiters"], 1);
    assert_eq!(v["fence"], highest);

    // Text: the mode with its size, every holder on a line of its own.
    let run = lockctl(Some(&url), &["show", &key]).await;
    assert_eq!(run.code, 0, "{run:?}");
    let lines: Vec<&str> = run.stdout.lines().collect();
    assert!(
        lines.contains(&"mode     semaphore, 3 of 3 permits held"),
        "{run:?}"
    );
    for h in held {
        assert_eq!(
            lines
                .iter()
                .filter(|l| l.trim_start_matches("holders").trim() == h)
                .count(),
            1,
            "{h} not on a line of its own: {run:?}"
        );
    }
    let run = lockctl(Some(&url), &["list", &format!("{base}:*")]).await;
    assert_eq!(run.code, 0, "{run:?}");
    let row = run.stdout.lines().nth(1).unwrap_or_default().to_owned();
    assert!(
        row.starts_with(&key) && row.contains(" semaphore(3) "),
        "{run:?}"
    );
    assert!(held.iter().all(|h| row.contains(h)), "{run:?}");
    let run = lockctl(Some(&url), &["--json", "list", &format!("{base}:*")]).await;
    assert_eq!(run.one()["permits"], 3, "{run:?}");

    // One holder's permit: the waiter is served, the others keep theirs.
    let run = lockctl(
        Some(&url),
        &[
            "--json",
            "release",
            &key,
            "--force",
            "--holder",
            p2.holder(),
        ],
    )
    .await;
    assert_eq!(run.code, 0, "{run:?}");
    let v = run.one();
    assert_eq!(v["released"], true);
    let next = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the waiter was not served")
        .unwrap()
        .unwrap();
    let mut after = strings(&v["after"]["holders"]);
    after.sort();
    let mut expected = [p1.holder(), p3.holder(), next.holder()];
    expected.sort();
    assert_eq!(after, expected, "{v}");
    assert!(matches!(p2.release().await, Err(LockError::Lost { .. })));

    // Every permit.
    let run = lockctl(Some(&url), &["release", &key, "--force"]).await;
    assert_eq!(run.code, 0, "{run:?}");
    assert!(
        run.stdout
            .starts_with(&format!("{key}: released 3 permits, of ")),
        "{run:?}"
    );
    assert_eq!(a.inspect(&key).await.unwrap(), None);
    for g in [p1, p3, next] {
        assert!(matches!(g.release().await, Err(LockError::Lost { .. })));
    }
    let run = lockctl(Some(&url), &["release", &key, "--force"]).await;
    assert_eq!(run.code, 1, "{run:?}");
}

/// `--url postgres://…` goes to the PostgreSQL engine: show, list, and a
/// forced release that hands the lock to the waiter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn show_list_and_release_on_postgres() {
    let server = tests::postgres::PostgresServer::shared();
    let url = server.url_for(&server.fresh_database());
    let (a, b) = (
        LockClient::connect(&url).await.unwrap(),
        LockClient::connect(&url).await.unwrap(),
    );
    let key = unique("pg-cli");
    let run = lockctl(None, &["--url", &url, "--json", "show", &key]).await;
    assert_eq!((run.code, run.stdout.as_str()), (1, ""), "{run:?}");
    let holder = a.lock(&key).await.unwrap();
    let waiter = {
        let (b, key) = (b.clone(), key.clone());
        tokio::spawn(async move { b.lock(&key).wait(Duration::from_secs(30)).await })
    };
    assert!(eventually(Duration::from_secs(10), || b.waiting_here(&key) == 1).await);
    let run = lockctl(None, &["--url", &url, "--json", "show", &key]).await;
    assert_eq!(run.code, 0, "{run:?}");
    assert_shows(&run.one(), &holder, 1);
    let run = lockctl(None, &["--url", &url, "--json", "list", "pg-cli*"]).await;
    assert_eq!(run.code, 0, "{run:?}");
    assert_shows(&run.one(), &holder, 1);
    let run = lockctl(None, &["--url", &url, "release", &key, "--force"]).await;
    assert_eq!(run.code, 0, "{run:?}");
    let next = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("the waiter was handed the lock")
        .unwrap()
        .unwrap();
    assert!(next.fence() > holder.fence());
    assert!(matches!(
        holder.release().await,
        Err(LockError::Lost { .. })
    ));
    next.release().await.unwrap();
}
