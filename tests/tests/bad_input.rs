//! Bad input and hostile Redis replies, as one table: every case must be a
//! clear, typed error within 5 s, must not run an attributed body, and must
//! leave nothing in Redis.
//!
//! Covered elsewhere, not repeated here:
//! - macro misuse (not async, wrong return type, unknown key parameter,
//!   malformed or zero `lease`/`wait`, bad `on_lost`, ...): compile-fail UI
//!   tests under `tests-build/ui`;
//! - an attributed call before `init`: `global_init.rs`;
//! - a paused Redis on the manual API, `SCRIPT FLUSH` before a lock:
//!   `redis_faults.rs` (`paused_redis_times_out_instead_of_hanging`,
//!   `flushed_scripts_are_reloaded`).

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use lock_runtime::{distributed_lock, LockClient, LockError};
use tests::{eventually, free_port, unique, RedisServer};

const BOUND: Duration = Duration::from_secs(5);

#[derive(Debug)]
enum AppError {
    Lock(LockError),
}

impl From<LockError> for AppError {
    fn from(e: LockError) -> Self {
        AppError::Lock(e)
    }
}

static RAN: AtomicBool = AtomicBool::new(false);

#[distributed_lock(key = "{key}", wait = "0s")]
async fn guarded(key: &str) -> Result<(), AppError> {
    RAN.store(true, Ordering::SeqCst);
    Ok(())
}

/// What a case expects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    Config,
    InvalidKey,
    Backend,
    /// Busy: `Timeout` after the wait.
    Busy,
    /// Works (a recovery case): `Ok`.
    Works,
}

fn kind(e: &LockError) -> Expect {
    match e {
        LockError::Config(_) => Expect::Config,
        LockError::InvalidKey { .. } => Expect::InvalidKey,
        LockError::Backend(_) => Expect::Backend,
        LockError::Timeout { .. } => Expect::Busy,
        _ => Expect::Works, // never expected: shows up as a mismatch
    }
}

struct Row {
    case: String,
    expect: Expect,
    got: String,
    took: Duration,
    body_ran: Option<bool>,
    left: Vec<String>,
    problems: Vec<String>,
}

/// Lock names in `server`, minus the token counter and `keep`.
fn left_in(server: &RedisServer, keep: &[String]) -> Vec<String> {
    server
        .keys("lock:*")
        .into_iter()
        .filter(|k| k != "lock:fence" && !keep.contains(k))
        .collect()
}

/// Where a case runs: the server to inspect afterwards (keys in `keep`
/// were put there by the case), and whether it calls an attributed fn.
#[derive(Clone, Copy)]
struct On<'a> {
    server: Option<&'a RedisServer>,
    keep: &'a [String],
    attributed: bool,
}

fn on(server: Option<&RedisServer>) -> On<'_> {
    On {
        server,
        keep: &[],
        attributed: false,
    }
}

impl<'a> On<'a> {
    fn attr(self) -> Self {
        On {
            attributed: true,
            ..self
        }
    }

    fn keep(self, keep: &'a [String]) -> Self {
        On { keep, ..self }
    }
}

struct Table {
    rows: Vec<Row>,
}

impl Table {
    /// Run one case: `run` gives the outcome; `needle` must appear in the
    /// error message; Redis must hold nothing new within a second.
    async fn case<F>(&mut self, case: &str, expect: Expect, needle: &str, on: On<'_>, run: F)
    where
        F: Future<Output = Result<(), LockError>>,
    {
        let On {
            server,
            keep,
            attributed,
        } = on;
        RAN.store(false, Ordering::SeqCst);
        let started = Instant::now();
        let out = tokio::time::timeout(BOUND * 2, run).await;
        let took = started.elapsed();
        let mut problems = Vec::new();
        let got = match &out {
            Err(_) => {
                problems.push(format!("no answer within {:?}", BOUND * 2));
                "hung".to_owned()
            }
            Ok(Ok(())) => {
                if expect != Expect::Works {
                    problems.push(format!("expected {expect:?}, got Ok"));
                }
                "Ok".to_owned()
            }
            Ok(Err(e)) => {
                if kind(e) != expect {
                    problems.push(format!("expected {expect:?}, got {e:?}"));
                }
                let msg = e.to_string();
                if !needle.is_empty() && !msg.to_lowercase().contains(&needle.to_lowercase()) {
                    problems.push(format!("the message does not mention `{needle}`"));
                }
                format!("{:?}: {msg}", kind(e))
            }
        };
        if took >= BOUND {
            problems.push(format!("took {took:?} (bound {BOUND:?})"));
        }
        let body_ran = attributed.then(|| RAN.load(Ordering::SeqCst));
        if body_ran == Some(true) && expect != Expect::Works {
            problems.push("the body ran".into());
        }
        let left = match server {
            Some(s) => {
                // Clean-up after a failed attempt runs in the background.
                eventually(Duration::from_secs(1), || left_in(s, keep).is_empty()).await;
                left_in(s, keep)
            }
            None => Vec::new(),
        };
        if !left.is_empty() {
            problems.push(format!("left behind: {left:?}"));
        }
        self.rows.push(Row {
            case: case.to_owned(),
            expect,
            got,
            took,
            body_ran,
            left,
            problems,
        });
    }

    fn print_and_assert(&self) {
        println!("\n== bad input ==");
        println!(
            "  {:<46} {:<10} {:>9} {:<5} {:<5} error",
            "case", "expected", "time", "body", "left"
        );
        for r in &self.rows {
            let mut got = r.got.clone();
            if got.len() > 150 {
                got.truncate(150);
                got.push('…');
            }
            println!(
                "  {:<46} {:<10} {:>9} {:<5} {:<5} {}{}",
                r.case,
                format!("{:?}", r.expect),
                format!("{:.0?}", r.took),
                r.body_ran.map_or("-", |b| if b { "RAN" } else { "no" }),
                r.left.len(),
                got,
                if r.problems.is_empty() {
                    String::new()
                } else {
                    format!("  <-- {}", r.problems.join("; "))
                }
            );
        }
        let bad: Vec<String> = self
            .rows
            .iter()
            .filter(|r| !r.problems.is_empty())
            .map(|r| format!("{}: {}", r.case, r.problems.join("; ")))
            .collect();
        assert!(
            bad.is_empty(),
            "{} case(s) failed:\n{}",
            bad.len(),
            bad.join("\n")
        );
    }
}

async fn lock_once(
    client: &LockClient,
    key: impl Into<String>,
    lease: Option<Duration>,
) -> Result<(), LockError> {
    // Tries once, as the attribute cases (`wait = "0s"`) do.
    let mut req = client.lock(key).wait(Duration::ZERO);
    if let Some(l) = lease {
        req = req.lease(l);
    }
    req.await?.release().await
}

#[tokio::test]
async fn bad_input_table() {
    let global = tests::global::redis().await;
    let client = lock_runtime::client().unwrap();
    let mut t = Table { rows: Vec::new() };
    let g = Some(global);

    // Malformed durations at run time (the attribute rejects them at compile time).
    t.case(
        "zero lease (manual)",
        Expect::Config,
        "lease",
        on(g),
        lock_once(&client, unique("z"), Some(Duration::ZERO)),
    )
    .await;
    t.case(
        "lease longer than a year (manual)",
        Expect::Config,
        "lease",
        on(g),
        lock_once(
            &client,
            unique("y"),
            Some(Duration::from_secs(400 * 24 * 3600)),
        ),
    )
    .await;
    t.case(
        "wait = Duration::MAX on a free lock",
        Expect::Works,
        "",
        on(g),
        async {
            client
                .lock(unique("max"))
                .wait(Duration::MAX)
                .await?
                .release()
                .await
        },
    )
    .await;
    t.case(
        "builder: zero default lease",
        Expect::Config,
        "lease",
        on(None),
        async {
            LockClient::builder()
                .lease(Duration::ZERO)
                .connect(&global.url())
                .await
                .map(drop)
        },
    )
    .await;
    t.case(
        "builder: zero op timeout",
        Expect::Config,
        "timeout",
        on(None),
        async {
            LockClient::builder()
                .op_timeout(Duration::ZERO)
                .connect(&global.url())
                .await
                .map(drop)
        },
    )
    .await;

    // Keys.
    t.case(
        "empty key (manual)",
        Expect::InvalidKey,
        "empty",
        on(g),
        lock_once(&client, "", None),
    )
    .await;
    t.case(
        "empty key (attribute)",
        Expect::InvalidKey,
        "empty",
        on(g).attr(),
        async { guarded("").await.map_err(|AppError::Lock(e)| e) },
    )
    .await;
    t.case(
        "key starting with `}` (manual)",
        Expect::InvalidKey,
        "}",
        on(g),
        lock_once(&client, "}x", None),
    )
    .await;
    t.case(
        "key starting with `}` (attribute)",
        Expect::InvalidKey,
        "}",
        on(g).attr(),
        async { guarded("}order").await.map_err(|AppError::Lock(e)| e) },
    )
    .await;
    let long = "k".repeat(2000);
    t.case(
        "key of 2000 bytes (attribute)",
        Expect::InvalidKey,
        "1024",
        on(g).attr(),
        async { guarded(&long).await.map_err(|AppError::Lock(e)| e) },
    )
    .await;

    // URLs and connections.
    for url in [
        "not a url",
        "http://127.0.0.1:6379",
        "redis://127.0.0.1:notaport",
        "",
    ] {
        t.case(
            &format!("malformed URL {url:?}"),
            Expect::Config,
            "URL",
            on(None),
            async { LockClient::connect(url).await.map(drop) },
        )
        .await;
    }
    let port = free_port();
    t.case(
        "Redis down (nothing listens)",
        Expect::Backend,
        &port.to_string(),
        on(None),
        async {
            LockClient::connect(&format!("redis://127.0.0.1:{port}"))
                .await
                .map(drop)
        },
    )
    .await;
    let secured = RedisServer::start_with(&["--requirepass", "secret", "--save", ""]);
    t.case("wrong password", Expect::Backend, "", on(None), async {
        LockClient::connect(&format!("redis://:wrong@127.0.0.1:{}", secured.port()))
            .await
            .map(drop)
    })
    .await;
    t.case(
        "no password where one is required",
        Expect::Backend,
        "auth",
        on(None),
        async { LockClient::connect(&secured.url()).await.map(drop) },
    )
    .await;
    drop(secured);
    t.case(
        "wrong DB (/9999)",
        Expect::Backend,
        "database",
        on(g),
        async {
            LockClient::connect(&format!("{}/9999", global.url()))
                .await
                .map(drop)
        },
    )
    .await;

    // Redis replies with errors.
    let primary = RedisServer::start();
    let replica = RedisServer::start_with(&[
        "--replicaof",
        "127.0.0.1",
        &primary.port().to_string(),
        "--save",
        "",
    ]);
    t.case(
        "read-only replica (READONLY)",
        Expect::Backend,
        "read only",
        on(Some(&replica)),
        async {
            let c = LockClient::connect(&replica.url()).await?;
            lock_once(&c, unique("ro"), None).await
        },
    )
    .await;
    drop((replica, primary));

    let key = unique("wrongtype");
    let _: i64 = global.cmd(&["HSET", &format!("lock:{{{key}}}"), "not", "a lock"]);
    let keep = [format!("lock:{{{key}}}")];
    // Another type at the lock's name (a lock of an older layout during a
    // rolling upgrade, or foreign data) is somebody's: busy, never ours.
    t.case(
        "lock key holds a hash, manual",
        Expect::Busy,
        "held by another holder",
        on(g).keep(&keep),
        lock_once(&client, &key, None),
    )
    .await;
    t.case(
        "lock key holds a hash, attribute",
        Expect::Busy,
        "held by another holder",
        on(g).keep(&keep).attr(),
        async { guarded(&key).await.map_err(|AppError::Lock(e)| e) },
    )
    .await;
    let _: i64 = global.cmd(&["DEL", &keep[0]]);

    // The token counter holds something else: the attempt fails and
    // writes no lock.
    let key = unique("badfence");
    let _: () = global.cmd(&["SET", "lock:fence", "not a number"]);
    t.case(
        "fence counter not an integer (manual)",
        Expect::Backend,
        "integer",
        on(g),
        lock_once(&client, &key, None),
    )
    .await;
    t.case(
        "fence counter not an integer (attribute)",
        Expect::Backend,
        "integer",
        on(g).attr(),
        async { guarded(&key).await.map_err(|AppError::Lock(e)| e) },
    )
    .await;
    // Sixteen characters, as long as a token, that sort below the clock:
    // the string comparison of the fast path does not take them for one.
    let _: () = global.cmd(&["SET", "lock:fence", "000000000000000x"]);
    t.case(
        "fence counter of a token's length, not an integer",
        Expect::Backend,
        "integer",
        on(g),
        lock_once(&client, &key, None),
    )
    .await;
    let counter: String = global.cmd(&["GET", "lock:fence"]);
    assert_eq!(counter, "000000000000000x", "the counter is left as it was");
    let _: i64 = global.cmd(&["DEL", "lock:fence"]);

    // Out of memory: every write refused.
    let _: () = global.cmd(&["CONFIG", "SET", "maxmemory-policy", "noeviction"]);
    let _: () = global.cmd(&["CONFIG", "SET", "maxmemory", "1"]);
    let key = unique("oom");
    t.case(
        "maxmemory reached (OOM), manual",
        Expect::Backend,
        "OOM",
        on(g),
        lock_once(&client, &key, None),
    )
    .await;
    t.case(
        "maxmemory reached (OOM), attribute",
        Expect::Backend,
        "OOM",
        on(g).attr(),
        async { guarded(&key).await.map_err(|AppError::Lock(e)| e) },
    )
    .await;
    let _: () = global.cmd(&["CONFIG", "SET", "maxmemory", "0"]);

    // Scripts flushed while a lock is held: renewals and release reload them.
    let key = unique("flushed");
    t.case(
        "SCRIPT FLUSH while held (recovers)",
        Expect::Works,
        "",
        on(g),
        async {
            let guard = client.lock(&key).lease(Duration::from_millis(1500)).await?;
            let _: String = global.cmd(&["SCRIPT", "FLUSH"]);
            // Two leases: only renewals after the flush can have kept it.
            tokio::time::sleep(Duration::from_millis(3000)).await;
            guard.release().await
        },
    )
    .await;

    // Redis stops answering under an attributed call.
    global.pause();
    let key = unique("paused");
    t.case(
        "Redis paused (attribute)",
        Expect::Backend,
        "",
        on(None).attr(),
        async { guarded(&key).await.map_err(|AppError::Lock(e)| e) },
    )
    .await;
    global.resume();
    // What the paused attempt may have written is taken back once Redis answers.
    let clean = eventually(Duration::from_secs(3), || left_in(global, &[]).is_empty()).await;
    assert!(clean, "a paused attempt left {:?}", left_in(global, &[]));

    t.print_and_assert();
    assert_eq!(client.held_count(), 0);
}
