//! The model's Lua host against a real `redis-server` (`LOCK_TEST_SERVER`,
//! default `redis-server`): the same scripts and commands on both, replies
//! and whole keyspaces compared after every step. Values that come from the
//! server's clock (tokens, queue deadlines, TTLs) may differ by the time the
//! real server took between two readings of its clock.

use std::collections::BTreeMap;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use lock_model::host::{self, Script};
use lock_model::keyspace::{fmt_double, Data, Keyspace, Reply};
use redis::{Connection, Value};

struct Real {
    child: Child,
    conn: Connection,
    /// Listens on the channels the model counts as subscribed.
    _sub: Connection,
}

impl Drop for Real {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(channels: &[&str]) -> Real {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let server = std::env::var("LOCK_TEST_SERVER").unwrap_or_else(|_| "redis-server".into());
    let child = Command::new(&server)
        .args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .stdout(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {server}: {e}"));
    let url = format!("redis://127.0.0.1:{port}");
    let client = redis::Client::open(url.as_str()).unwrap();
    let started = Instant::now();
    let conn = loop {
        if let Ok(mut c) = client.get_connection() {
            if redis::cmd("PING").query::<String>(&mut c).is_ok() {
                break c;
            }
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{server} did not come up"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut sub = client.get_connection().unwrap();
    for ch in channels {
        redis::cmd("SUBSCRIBE").arg(*ch).exec(&mut sub).unwrap();
    }
    Real {
        child,
        conn,
        _sub: sub,
    }
}

/// One step of a scenario.
enum Step {
    Eval(Script, Vec<String>, Vec<String>),
    Sleep(u64),
}

/// The lock and its server's token counter; the queue, waiters and readers
/// are `l:queue`, `l:waiters`, `l:readers`.
const LOCK: [&str; 2] = ["l", "fence"];
/// `fence_ttl` in ms.
const TTL: &str = "86400000";

fn s(v: &[&str]) -> Vec<String> {
    v.iter().map(|x| x.to_string()).collect()
}

/// An acquire as `node.rs` sends it, fenced: `rejoin` "1" adds the `j`
/// flag, a `floor` (Redlock) goes last.
fn acq(owner: &str, lease: &str, floor: &str, stay: &str, rejoin: &str) -> Step {
    let flags = if rejoin == "1" { "fj" } else { "f" };
    acq_flags(owner, lease, floor, stay, flags)
}

fn acq_flags(owner: &str, lease: &str, floor: &str, stay: &str, flags: &str) -> Step {
    let mut args = s(&[owner, lease, stay, flags, TTL]);
    if !floor.is_empty() {
        args.push(floor.to_string());
    }
    Step::Eval(Script::Acquire, s(&LOCK), args)
}

fn rel(owner: &str) -> Step {
    Step::Eval(Script::Release, s(&LOCK), s(&[owner, "r", TTL]))
}

fn forced_rel(owner: &str) -> Step {
    Step::Eval(Script::Release, s(&LOCK), s(&[owner, "rf", TTL]))
}

fn keep(owner: &str, left: &str) -> Step {
    Step::Eval(Script::Keep, s(&["l", "l:readers"]), s(&[owner, left]))
}

fn renew(lease: &str, front: &str, rest: &str) -> Step {
    Step::Eval(Script::Renew, s(&["l"]), s(&[lease, front, rest]))
}

fn renew_read(lease: &str, front: &str, rest: &str) -> Step {
    Step::Eval(
        Script::RenewRead,
        s(&["l", "l:readers"]),
        s(&[lease, front, rest]),
    )
}

fn cmd(args: &[&str]) -> Step {
    Step::Eval(Script::Command, vec![], s(args))
}

fn real_time(c: &mut Connection) -> u64 {
    let (sec, us): (u64, u64) = redis::cmd("TIME").query(c).unwrap();
    sec * 1000 + us / 1000
}

fn from_redis(v: &Value) -> Reply {
    match v {
        Value::Nil => Reply::Nil,
        Value::Int(i) => Reply::Int(*i),
        Value::BulkString(b) => Reply::Bulk(String::from_utf8_lossy(b).into_owned()),
        Value::Array(a) => Reply::Array(a.iter().map(from_redis).collect()),
        Value::SimpleString(s) => Reply::Status(s.clone()),
        Value::Okay => Reply::Status("OK".into()),
        Value::ServerError(e) => {
            Reply::Error(format!("{} {}", e.code(), e.details().unwrap_or("")))
        }
        other => panic!("unexpected reply {other:?}"),
    }
}

/// Equal, or numbers the clock explains: `slack` ms apart at most (µs
/// values scaled).
fn close_str(m: &str, r: &str, slack: i128) -> bool {
    if m == r {
        return true;
    }
    let (mw, rw): (Vec<&str>, Vec<&str>) = (m.split(' ').collect(), r.split(' ').collect());
    if mw.len() != rw.len() {
        return false;
    }
    mw.iter().zip(&rw).all(|(a, b)| {
        if a == b {
            return true;
        }
        // Redis 7.0 writes doubles as `%.17g`, Valkey in the shortest form.
        if let (Ok(x), Ok(y)) = (a.parse::<f64>(), b.parse::<f64>()) {
            if x == y && (a.contains('.') || b.contains('.')) {
                return true;
            }
        }
        match (a.parse::<i128>(), b.parse::<i128>()) {
            (Ok(x), Ok(y)) => {
                let scale = if x.abs() > 100_000_000_000_000 {
                    1000
                } else {
                    1
                };
                (x - y).abs() <= slack * scale
            }
            _ => false,
        }
    })
}

fn close(m: &Reply, r: &Reply, slack: i128) -> bool {
    match (m, r) {
        (Reply::Int(a), Reply::Int(b)) => close_str(&a.to_string(), &b.to_string(), slack),
        (Reply::Bulk(a), Reply::Bulk(b)) | (Reply::Status(a), Reply::Status(b)) => {
            close_str(a, b, slack)
        }
        // Error texts: the same code (the real one adds the script's name).
        (Reply::Error(a), Reply::Error(b)) => a.split(' ').next() == b.split(' ').next(),
        (Reply::Array(a), Reply::Array(b)) => {
            a.len() == b.len() && a.iter().zip(b).all(|(x, y)| close(x, y, slack))
        }
        (Reply::Nil, Reply::Nil) => true,
        _ => false,
    }
}

/// A keyspace as comparable text: key → (type, items, expiry in ms or -1).
/// Sorted sets list their members by name: a score taken from the clock may
/// be a tick later on the server, which reorders members of equal score.
type Dump = BTreeMap<String, (String, Vec<String>, i64)>;

fn dump_model(ks: &Keyspace, now: u64) -> Dump {
    let mut ks = ks.clone();
    ks.expire(now);
    ks.keys
        .iter()
        .map(|(k, e)| {
            let (t, items) = match &e.data {
                Data::Str(s) => ("string", vec![s.clone()]),
                Data::Hash(h) => (
                    "hash",
                    h.iter().flat_map(|(f, v)| [f.clone(), v.clone()]).collect(),
                ),
                Data::List(l) => ("list", l.clone()),
                Data::ZSet(z) => {
                    let v: BTreeMap<_, _> = z.iter().map(|(m, s)| (m.clone(), *s)).collect();
                    (
                        "zset",
                        v.into_iter()
                            .flat_map(|(m, s)| [m, fmt_double(s.0)])
                            .collect(),
                    )
                }
            };
            (
                k.clone(),
                (t.to_string(), items, e.expires.map_or(-1, |t| t as i64)),
            )
        })
        .collect()
}

fn dump_real(c: &mut Connection) -> Dump {
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(c).unwrap();
    let mut out = Dump::new();
    for k in keys {
        let t: String = redis::cmd("TYPE").arg(&k).query(c).unwrap();
        let items: Vec<String> = match t.as_str() {
            // Expired since KEYS listed it.
            "none" => continue,
            "string" => vec![redis::cmd("GET").arg(&k).query(c).unwrap()],
            "hash" => {
                // In the server's order: a small hash keeps its fields as
                // first set, and the model must too.
                redis::cmd("HGETALL").arg(&k).query(c).unwrap()
            }
            "list" => redis::cmd("LRANGE")
                .arg(&k)
                .arg(0)
                .arg(-1)
                .query(c)
                .unwrap(),
            "zset" => {
                let z: BTreeMap<String, String> = redis::cmd("ZRANGE")
                    .arg(&k)
                    .arg(0)
                    .arg(-1)
                    .arg("WITHSCORES")
                    .query(c)
                    .unwrap();
                z.into_iter().flat_map(|(m, s)| [m, s]).collect()
            }
            other => panic!("type {other}"),
        };
        let exp: i64 = redis::cmd("PEXPIRETIME").arg(&k).query(c).unwrap();
        out.insert(k, (t, items, exp));
    }
    out
}

fn same_dump(m: &Dump, r: &Dump, slack: i128) -> bool {
    m.len() == r.len()
        && m.iter().zip(r).all(|((mk, mv), (rk, rv))| {
            mk == rk
                && mv.0 == rv.0
                && mv.1.len() == rv.1.len()
                && mv.1.iter().zip(&rv.1).all(|(a, b)| close_str(a, b, slack))
                && close_str(&mv.2.to_string(), &rv.2.to_string(), slack)
        })
}

/// Run `steps` on a fresh real server and on the model; every reply, every
/// message published and the keyspace after every step must agree.
fn compare(name: &str, subscribed: &[&str], steps: Vec<Step>) -> usize {
    let mut real = start(subscribed);
    let subs: BTreeMap<String, i64> = subscribed.iter().map(|c| (c.to_string(), 1)).collect();
    let mut ks = Keyspace::default();
    let mut evals = 0;
    let mut slack = 0i128;
    for (i, step) in steps.into_iter().enumerate() {
        let (script, keys, args) = match step {
            Step::Sleep(ms) => {
                std::thread::sleep(Duration::from_millis(ms));
                continue;
            }
            Step::Eval(s, k, a) => (s, k, a),
        };
        let t0 = real_time(&mut real.conn);
        let real_reply = match redis::cmd("EVAL")
            .arg(script.source())
            .arg(keys.len())
            .arg(&keys)
            .arg(&args)
            .query::<Value>(&mut real.conn)
        {
            Ok(v) => from_redis(&v),
            Err(e) => Reply::Error(format!("{} {e}", e.code().unwrap_or("?"))),
        };
        let t1 = real_time(&mut real.conn);
        // Values written by earlier steps carry those steps' slack.
        slack = slack.max((t1 - t0) as i128 + 2);
        let keys_ref: Vec<&str> = keys.iter().map(String::as_str).collect();
        let args_ref: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = host::eval(script, &mut ks, t0, &subs, &keys_ref, &args_ref);
        assert!(
            close(&out.reply, &real_reply, slack),
            "{name}, step {i} ({} {args:?}): the model answered {:?}, Redis {real_reply:?}",
            script.name(),
            out.reply
        );
        let (mut dm, mut dr) = (dump_model(&ks, t1), dump_real(&mut real.conn));
        // A key that expires while the two are read (a stalled test) may be
        // in one and not the other: such keys are not compared this step.
        let t2 = real_time(&mut real.conn) as i128;
        let expiring: Vec<String> = dm
            .iter()
            .chain(&dr)
            .filter(|(_, v)| v.2 >= 0 && i128::from(v.2) <= t2 + slack)
            .map(|(k, _)| k.clone())
            .collect();
        for k in &expiring {
            dm.remove(k);
            dr.remove(k);
        }
        assert!(
            same_dump(&dm, &dr, slack),
            "{name}, step {i} ({} {args:?}): keyspaces differ\nmodel: {dm:#?}\nredis: {dr:#?}",
            script.name()
        );
        evals += 1;
    }
    evals
}

/// The comparison itself: a server whose clock ticked during a step scores
/// a member 1 ms later, after a member that scores equal in the model.
#[test]
fn a_clock_tick_that_reorders_equal_scores_is_within_slack() {
    let mut real = start(&[]);
    redis::cmd("ZADD")
        .arg("z")
        .arg(&["1001", "a", "1000", "b"])
        .exec(&mut real.conn)
        .unwrap();
    let mut ks = Keyspace::default();
    let subs = BTreeMap::new();
    host::eval(
        Script::Command,
        &mut ks,
        0,
        &subs,
        &[],
        &["ZADD", "z", "1000", "a", "1000", "b"],
    );
    let (dm, dr) = (dump_model(&ks, 0), dump_real(&mut real.conn));
    assert!(same_dump(&dm, &dr, 1), "model {dm:?}, redis {dr:?}");
    assert!(
        !same_dump(&dm, &dr, 0),
        "a tick beyond the slack must differ"
    );
}

#[test]
fn writers_queue_and_hand_over_as_on_redis() {
    let n = compare(
        "writers",
        &["l:granted:d"],
        vec![
            acq("c:1", "30000", "", "", ""),
            acq("c:1", "30000", "", "", ""),
            acq("d:1", "30000", "", "", ""),
            acq("d:1", "30000", "", "5000", ""),
            acq("d:1", "30000", "", "5000", "1"),
            acq("e:1", "20000", "", "5000", ""),
            acq("f:1", "20000", "", "5000", ""),
            rel("c:1"),
            rel("c:1"),
            renew("30000", "d:", "1"),
            renew("30000", "c:", "1"),
            rel("d:1"),
            rel("f:1"),
            acq("c:2", "30000", "99999999999999999", "", ""),
            rel("c:2"),
            Step::Eval(
                Script::RaiseFence,
                s(&LOCK),
                s(&["c:2", "200000000000000000", TTL]),
            ),
            acq("c:3", "30000", "", "", ""),
        ],
    );
    assert_eq!(n, 17);
}

#[test]
fn readers_share_queue_behind_writers_and_hand_over_as_on_redis() {
    compare(
        "readers",
        &["l:granted:c", "l:granted:d"],
        vec![
            acq("c:r1", "30000", "", "", ""),
            acq("c:r2", "20000", "", "", ""),
            acq("c:r2", "20000", "", "", ""),
            acq("d:1", "30000", "", "5000", ""),
            acq("c:r3", "30000", "", "5000", ""),
            acq("c:r4", "30000", "", "5000", ""),
            renew_read("40000", "c:", "r1"),
            rel("c:r1"),
            rel("c:r1"),
            rel("c:r2"),
            renew_read("30000", "c:", "r3"),
            rel("d:1"),
            acq("d:2", "30000", "", "5000", ""),
            acq("c:r5", "30000", "", "5000", ""),
            rel("d:2"),
            renew_read("1000", "c:", "r3"),
            rel("c:r3"),
            rel("c:r4"),
            rel("c:r5"),
        ],
    );
}

#[test]
fn leases_and_queue_stays_lapse_as_on_redis() {
    compare(
        "expiry",
        &["l:granted:e"],
        vec![
            acq("c:1", "300", "", "", ""),
            acq("d:1", "30000", "", "400", ""),
            acq("e:1", "30000", "", "5000", ""),
            Step::Sleep(450),
            // d's queue stay ran out with c's lease: e takes it directly,
            // leaves the queue, and marks the lock for d if d still waits.
            acq("e:1", "30000", "", "5000", "1"),
            acq("d:1", "30000", "", "5000", ""),
            renew("250", "e:", "1"),
            Step::Sleep(300),
            rel("e:1"),
            acq("d:1", "30000", "", "5000", "1"),
            acq("c:r1", "200", "", "", ""),
            Step::Sleep(250),
            rel("c:r1"),
        ],
    );
}

#[test]
fn min_hold_releases_and_late_renewals_as_on_redis() {
    compare(
        "keep",
        &["l:granted:d"],
        vec![
            // A writer's hold kept for its min_hold: renamed, shortened,
            // and a renewal (or keep) sent again after it extends nothing.
            acq("c:1", "30000", "", "", ""),
            keep("c:1", "400"),
            renew("30000", "c:", "1"),
            keep("c:1", "400"),
            acq("c:1", "30000", "", "5000", "1"),
            acq("d:1", "30000", "", "5000", ""),
            rel("c:1"),
            Step::Sleep(450),
            acq("d:1", "30000", "", "5000", "1"),
            // Readers: each kept alone, the lock as long as the longest.
            rel("d:1"),
            acq("c:r2", "30000", "", "", ""),
            acq("d:r2", "1000", "", "", ""),
            keep("c:r2", "300"),
            renew_read("30000", "c:", "r2"),
            keep("c:r2", "300"),
            keep("d:r2", "5000"),
            Step::Sleep(350),
            rel("d:r2"),
            // A forced release hands over as the holder's own would, and
            // the holder's release then finds the lock lost.
            acq("c:3", "30000", "", "", ""),
            acq("d:3", "30000", "", "5000", ""),
            forced_rel("c:3"),
            rel("c:3"),
            rel("d:3"),
        ],
    );
}

#[test]
fn unfenced_holds_and_token_counters_as_on_redis() {
    compare(
        "unfenced",
        &["l:granted:d", "l:granted:e"],
        vec![
            // `fence = false`: no token in the value, none handed over.
            acq_flags("c:1", "30000", "", "", ""),
            acq_flags("c:1", "30000", "", "", ""),
            acq_flags("d:1", "30000", "", "5000", ""),
            acq_flags("e:r1", "30000", "", "5000", ""),
            rel("c:1"),
            rel("d:1"),
            // A fenced reader joins an unfenced read hold: the hold gets a
            // token, which the readers after it share.
            acq_flags("c:r2", "30000", "", "", "f"),
            acq_flags("d:r2", "30000", "", "", "f"),
            rel("e:r1"),
            rel("c:r2"),
            rel("d:r2"),
            // The counter expires unused after fence_ttl, and tokens still
            // rise (floored at the clock).
            acq_flags("c:3", "30000", "", "", "f"),
            Step::Eval(
                Script::Acquire,
                s(&LOCK),
                s(&["d:3", "30000", "", "f", "200"]),
            ),
            Step::Sleep(250),
            rel("c:3"),
            acq_flags("c:4", "30000", "", "", "f"),
        ],
    );
}

#[test]
fn foreign_data_and_broken_counters_as_on_redis() {
    compare(
        "errors",
        &[],
        vec![
            cmd(&["hset", "l", "a", "1"]),
            acq("c:1", "30000", "", "", ""),
            acq("c:r1", "30000", "", "", ""),
            rel("c:1"),
            renew("30000", "c:", "1"),
            cmd(&["del", "l"]),
            cmd(&["set", "fence", "abc"]),
            acq("c:1", "30000", "", "", ""),
            acq("c:r1", "30000", "", "", ""),
            cmd(&["del", "fence"]),
            cmd(&["rpush", "fence", "x"]),
            acq("c:1", "30000", "", "", ""),
        ],
    );
}

/// Counters the acquire's fast path compares as strings (16 digits, as
/// long as the clock's) next to the ones it leaves to arithmetic: of
/// another length, ahead of the clock, and 16 characters that are not
/// digits (an error, the counter left as it was, even where they sort
/// below the clock); calls with trailing arguments left out, and a
/// release by the hold's value.
#[test]
fn token_counters_compared_as_strings_as_on_redis() {
    let short = |owner: &str| Step::Eval(Script::Acquire, s(&LOCK), s(&[owner, "30000"]));
    let by_value = |held: &str| Step::Eval(Script::Release, s(&LOCK[..1]), s(&[held]));
    compare(
        "counters",
        &[],
        vec![
            cmd(&["set", "fence", "000000000000000x"]),
            short("c:1"),
            cmd(&["get", "fence"]),
            cmd(&["get", "l"]),
            cmd(&["set", "fence", "12345"]),
            short("c:1"),
            by_value("c:1"),
            cmd(&["set", "fence", "9999999999999990"]),
            short("c:2"),
            cmd(&["get", "fence"]),
            by_value("c:2 9999999999999991"),
            cmd(&["get", "l"]),
            acq("c:3", "30000", "", "5000", ""),
            cmd(&["get", "fence"]),
            by_value("c:3 9999999999999991"),
            rel("c:3"),
            acq_flags("c:4", "30000", "", "", ""),
            by_value("c:4"),
            cmd(&["get", "l"]),
        ],
    );
}

/// A permit as `node/permits.rs` asks for it, fenced.
fn permit(owner: &str, lease: &str, stay: &str) -> Step {
    Step::Eval(Script::Permit, s(&LOCK), s(&[owner, lease, stay, "f", TTL]))
}

fn rel_permit(owner: &str, flags: &str) -> Step {
    Step::Eval(Script::ReleasePermit, s(&LOCK), s(&[owner, flags, TTL]))
}

#[test]
fn permits_queue_hand_over_lapse_and_are_kept_as_on_redis() {
    compare(
        "permits",
        &["l:granted:c", "l:granted:d", "l:granted:e", "l:released"],
        vec![
            // Two of two, a repeat, a third queued, a fourth just told.
            permit("c:s2.1", "30000", ""),
            permit("d:s2.1", "30000", ""),
            permit("c:s2.1", "30000", ""),
            permit("e:s2.1", "30000", "5000"),
            permit("e:s2.1", "30000", "5000"),
            permit("f:s2.1", "30000", ""),
            Step::Eval(Script::InspectPermits, s(&["l"]), vec![]),
            // A release hands its permit to the queue's head; a repeat of
            // it finds nothing.
            rel_permit("c:s2.1", ""),
            rel_permit("c:s2.1", ""),
            permit("e:s2.1", "30000", "5000"),
            // Renewals: held, not held.
            Step::Eval(
                Script::RenewPermits,
                s(&["l", "l"]),
                s(&["20000", "d:", "s2.1", "s2.9"]),
            ),
            // A waiter of N = 1 queues and holds back one of N = 3 behind it
            // (strict FIFO); it gives up; the one behind it asks again.
            permit("g:s1.1", "30000", "5000"),
            permit("c:s3.2", "30000", "5000"),
            rel_permit("g:s1.1", ""),
            permit("c:s3.2", "30000", "5000"),
            // min_hold: renamed, shortened, counted; a renewal of it finds
            // nothing, a repeat of the keep its work done.
            Step::Eval(Script::KeepPermit, s(&["l"]), s(&["d:s2.1", "300"])),
            Step::Eval(Script::KeepPermit, s(&["l"]), s(&["d:s2.1", "300"])),
            Step::Eval(Script::RenewPermits, s(&["l"]), s(&["20000", "d:", "s2.1"])),
            Step::Eval(Script::InspectPermits, s(&["l"]), vec![]),
            // Redlock: raise a permit's token, publish on release.
            Step::Eval(
                Script::RaisePermitFence,
                s(&LOCK),
                s(&["e:s2.1", "99999999999999999", TTL]),
            ),
            Step::Sleep(350),
            permit("h:s2.1", "200", "w5000"),
            rel_permit("e:s2.1", "a"),
            rel_permit("c:s3.2", "af"),
            Step::Sleep(250),
            // The kept and short leases lapsed: their entries count for
            // nothing, and go when met.
            permit("c:s1.3", "30000", ""),
            rel_permit("h:s2.1", ""),
            rel_permit("c:s1.3", ""),
            // A lock and a semaphore of one key exclude each other.
            acq("c:4", "30000", "", "", ""),
            permit("d:s2.4", "30000", "5000"),
            rel_permit("d:s2.4", ""),
            rel("c:4"),
            permit("d:s2.5", "30000", ""),
            acq("c:5", "30000", "", "5000", ""),
            rel("c:5"),
            rel_permit("d:s2.5", ""),
            Step::Eval(Script::InspectPermits, s(&["l"]), vec![]),
            // A lock's owner id is not a permit's.
            permit("c:6", "30000", ""),
        ],
    );
}

#[test]
fn every_shimmed_command_answers_as_on_redis() {
    let c = |a: &[&str]| cmd(a);
    compare(
        "commands",
        &["ch"],
        vec![
            c(&["set", "s", "v"]),
            c(&["set", "s", "w", "NX"]),
            c(&["set", "s", "w", "XX", "GET"]),
            c(&["set", "s", "x", "NX", "GET"]),
            c(&["set", "t", "1", "PX", "60000"]),
            c(&["set", "t", "2", "KEEPTTL"]),
            c(&["set", "t", "2", "PX", "1.5"]),
            c(&["set", "t", "2", "PX", "0"]),
            c(&["set", "t", "2", "PX", "10", "KEEPTTL"]),
            c(&["get", "t"]),
            c(&["pttl", "t"]),
            c(&["pttl", "s"]),
            c(&["pttl", "none"]),
            c(&["pexpiretime", "t"]),
            c(&["expiretime", "t"]),
            c(&["pexpiretime", "s"]),
            c(&["pexpire", "s", "50000", "GT"]),
            c(&["pexpire", "s", "50000", "LT"]),
            c(&["pexpire", "s", "60000", "GT"]),
            c(&["pexpire", "s", "40000", "GT"]),
            c(&["pexpire", "s", "40000", "LT"]),
            c(&["pexpire", "s", "1000", "NX"]),
            c(&["pexpire", "s", "70000", "XX"]),
            c(&["pexpire", "s", "x"]),
            c(&["pexpire", "none", "100"]),
            c(&["incr", "n"]),
            c(&["incr", "n"]),
            c(&["incr", "s"]),
            c(&["exists", "s", "n", "none", "s"]),
            c(&["type", "s"]),
            c(&["type", "none"]),
            c(&["hset", "h", "a", "1", "b", "2"]),
            c(&["hset", "h", "a", "3"]),
            c(&["hget", "h", "a"]),
            c(&["hget", "h", "z"]),
            c(&["hexists", "h", "b"]),
            c(&["hlen", "h"]),
            c(&["hdel", "h", "a", "z"]),
            c(&["get", "h"]),
            c(&["hset", "h", "a"]),
            // Fields in the order first set, an update kept in place, a
            // deleted one gone from its place.
            c(&["hset", "g", "z", "1", "b", "2", "m", "3"]),
            c(&["hset", "g", "b", "4"]),
            c(&["hgetall", "g"]),
            c(&["hdel", "g", "z"]),
            c(&["hset", "g", "z", "5"]),
            c(&["hgetall", "g"]),
            c(&["hkeys", "g"]),
            c(&["hvals", "g"]),
            c(&["hmget", "g", "m", "none", "z"]),
            c(&["hmget", "none", "a", "b"]),
            c(&["hgetall", "none"]),
            c(&["hkeys", "none"]),
            c(&["hsetnx", "g", "m", "9"]),
            c(&["hsetnx", "g", "n", "9"]),
            c(&["hsetnx", "fresh", "a", "1"]),
            c(&["hincrby", "g", "n", "-10"]),
            c(&["hincrby", "g", "new", "3"]),
            c(&["hincrby", "g", "new", "x"]),
            c(&["hset", "g", "s", "abc"]),
            c(&["hincrby", "g", "s", "1"]),
            c(&["hincrby", "g", "big", "9223372036854775807"]),
            c(&["hincrby", "g", "big", "1"]),
            c(&["hincrby", "nohash", "a", "x"]),
            c(&["exists", "nohash"]),
            c(&["hgetall", "g"]),
            c(&["hgetall", "s"]),
            c(&["hmget", "s", "a"]),
            c(&["hsetnx", "s", "a", "1"]),
            c(&["hincrby", "s", "a", "1"]),
            c(&["hdel", "g", "z", "b", "m", "n", "new", "s", "big"]),
            c(&["type", "g"]),
            c(&["exists", "g"]),
            c(&["rpush", "q", "a", "b"]),
            c(&["lpush", "q", "c", "d"]),
            c(&["rpush", "q", "a"]),
            c(&["lrange", "q", "0", "-1"]),
            c(&["lrange", "q", "1", "2"]),
            c(&["lrange", "q", "-2", "100"]),
            c(&["lpos", "q", "a"]),
            c(&["lpos", "q", "a", "RANK", "2"]),
            c(&["lpos", "q", "a", "RANK", "-1"]),
            c(&["lpos", "q", "a", "COUNT", "0"]),
            c(&["lpos", "q", "z"]),
            c(&["lpos", "none", "z"]),
            c(&["lindex", "q", "0"]),
            c(&["lindex", "q", "-1"]),
            c(&["lindex", "q", "9"]),
            c(&["llen", "q"]),
            c(&["type", "q"]),
            c(&["lrem", "q", "-1", "a"]),
            c(&["lrem", "q", "0", "zz"]),
            c(&["lpop", "q"]),
            c(&["lpop", "q", "2"]),
            c(&["lpop", "q", "5"]),
            c(&["lpop", "q"]),
            c(&["exists", "q"]),
            c(&["lpop", "none", "2"]),
            c(&["zadd", "z", "5", "a", "3", "b"]),
            c(&["zadd", "z", "GT", "CH", "4", "a", "9", "b"]),
            c(&["zadd", "z", "LT", "1", "a"]),
            c(&["zadd", "z", "NX", "2", "a", "7", "c"]),
            c(&["zadd", "z", "XX", "0.1", "c", "8", "d"]),
            c(&["zadd", "z", "x", "a"]),
            c(&["zscore", "z", "c"]),
            c(&["zscore", "z", "none"]),
            c(&["zcard", "z"]),
            c(&["type", "z"]),
            c(&["zrange", "z", "0", "-1", "WITHSCORES"]),
            c(&["zrange", "z", "-1", "-1", "WITHSCORES"]),
            c(&["zrange", "z", "0", "0"]),
            c(&["zremrangebyscore", "z", "-inf", "(1"]),
            c(&["zremrangebyscore", "z", "1", "+inf"]),
            c(&["exists", "z"]),
            c(&["zrem", "none", "a"]),
            c(&["zadd", "y", "1", "a"]),
            c(&["zrem", "y", "a", "b"]),
            c(&["get", "y"]),
            c(&["publish", "ch", "hello"]),
            c(&["publish", "nobody", "hello"]),
            c(&["spublish", "nobody", "hello"]),
            c(&["del", "s", "n", "none"]),
            c(&["get"]),
        ],
    );
}
