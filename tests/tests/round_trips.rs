//! Round trips per operation, counted by Redis itself (`INFO commandstats`):
//! lock, reentry, inner and outer release, a renewal tick, an idle client;
//! and the commands Redis runs for one uncontended lock + unlock.
//! Its own binary: nothing else may talk to this server while it counts.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use lock_runtime::{distributed_lock, LockClient, LockError};
use tests::RedisServer;

static SEEN: AtomicU64 = AtomicU64::new(0);

/// Calls sent since the last reset: client commands only (scripts, a bare
/// `SET`, a native compare-and-delete); the commands the scripts run
/// inside Redis are not round trips.
fn sent(server: &RedisServer) -> u64 {
    ["evalsha", "eval", "delifeq", "delex"]
        .iter()
        .map(|c| server.calls(c))
        .sum()
}

/// The server's own compare-and-delete, if it has one (`DELIFEQ` on Valkey
/// 9, `DELEX` on Redis 8.4): the runtime releases with it.
fn native_delete(server: &RedisServer) -> Option<&'static str> {
    let info: Vec<redis::Value> = server.cmd(&["COMMAND", "INFO", "DELIFEQ", "DELEX"]);
    let known = |i: usize| !matches!(info.get(i), None | Some(redis::Value::Nil));
    if known(0) {
        Some("delifeq")
    } else if known(1) {
        Some("delex")
    } else {
        None
    }
}

#[distributed_lock(key = "rt:{id}", lease = "30s")]
async fn outer(server: &RedisServer, id: u64) -> Result<Vec<(String, u64)>, LockError> {
    let mut rows = vec![("lock (fresh)".to_owned(), sent(server))];
    server.reset_stats();
    inner(server, id).await?;
    rows.push(("reentry + its release".to_owned(), sent(server)));
    server.reset_stats();
    Ok(rows)
}

#[distributed_lock(key = "rt:{id}")]
async fn inner(server: &RedisServer, id: u64) -> Result<(), LockError> {
    SEEN.store(lock_runtime::current_fence().unwrap_or(0), Ordering::SeqCst);
    let _ = server;
    Ok(())
}

/// 300 holds of one client with a 900 ms lease (a tick every 300 ms),
/// counted over 1.5 s from between two ticks: the renew calls sent, and
/// the renewals Redis ran (`PEXPIRE` of a write hold, `ZADD` of a read
/// hold). The holds are released after.
async fn renewal_ticks(server: &RedisServer, client: &LockClient, read: bool) -> (u64, u64) {
    let mut guards = Vec::new();
    for i in 0..300 {
        let key = format!("rt:many:{read}:{i}");
        let request = if read {
            client.read_lock(key)
        } else {
            client.lock(key)
        };
        guards.push(request.lease(Duration::from_millis(900)).await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(150)).await;
    server.reset_stats();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let calls = sent(server);
    let renewed = server.calls(if read { "zadd" } else { "pexpire" });
    for g in guards {
        g.release().await.unwrap();
    }
    (calls, renewed)
}

#[tokio::test]
async fn round_trips_per_operation_counted_by_redis() {
    let server = tests::global::redis().await;
    server.reset_stats();
    let mut rows = outer(server, 7).await.unwrap();
    rows.push(("release (outermost)".to_owned(), sent(server)));

    // Redis-side work: every command Redis ran, scripts' inner calls
    // included, for one lock + unlock with nobody waiting.
    let client = lock_runtime::client().unwrap();
    server.reset_stats();
    client
        .lock("rt:work")
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let work = server.all_calls();
    let native = native_delete(server);
    let by_command: Vec<(&str, u64)> = [
        "evalsha",
        "set",
        "time",
        "hdel",
        "get",
        "del",
        native.unwrap_or("delifeq"),
        "publish",
    ]
    .into_iter()
    .map(|c| (c, server.calls(c)))
    .collect();
    assert!(
        SEEN.load(Ordering::SeqCst) > 0,
        "the inner body saw no fence"
    );

    // A renewal tick: 300 held locks, lease 900 ms (a tick every 300 ms).
    let (ticks_window, renewed) = renewal_ticks(server, &client, false).await;
    server.reset_stats();
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let idle = sent(server);

    println!("\n== round trips per operation (INFO commandstats) ==");
    for (what, n) in &rows {
        println!("  {what:<38} {n}");
    }
    println!(
        "  {:<38} {ticks_window} calls for {renewed} renewals in 1.5 s (~5 ticks of 300 locks)",
        "renewal ticks"
    );
    println!("  {:<38} {idle}", "idle client, 1 s");
    println!(
        "  {:<38} {work} {by_command:?}",
        "Redis commands, lock + unlock"
    );

    assert_eq!(rows[0].1, 1, "a fresh lock is one EVALSHA");
    assert_eq!(
        rows[1].1, 0,
        "a reentry and its release are counted in the process"
    );
    assert_eq!(rows[2].1, 1, "the outermost release is one EVALSHA");
    // 300 locks fit one renew call: one call per tick, about five ticks.
    assert!(
        (3..=7).contains(&ticks_window),
        "{ticks_window} renew calls in 1.5 s for 300 locks"
    );
    assert!(
        renewed >= 2 * 300,
        "only {renewed} renewals of 300 locks in 1.5 s"
    );
    assert_eq!(idle, 0, "an idle client sent lock commands");
    // Lock: EVALSHA, TIME, SET counter GET (the slot's one token counter),
    // SET NX PX, HDEL (a request that may wait leaves the queue an earlier
    // send of its attempt may have joined). Unlock: the server's own
    // compare-and-delete where it has one, else EVALSHA, GET, DEL. Nobody
    // waits, so nothing is published.
    let expected = match native {
        Some(n) => vec![
            ("evalsha", 1),
            ("set", 2),
            ("time", 1),
            ("hdel", 1),
            ("get", 0),
            ("del", 0),
            (n, 1),
            ("publish", 0),
        ],
        None => vec![
            ("evalsha", 2),
            ("set", 2),
            ("time", 1),
            ("hdel", 1),
            ("get", 1),
            ("del", 1),
            ("delifeq", 0),
            ("publish", 0),
        ],
    };
    assert_eq!(
        by_command, expected,
        "Redis commands for one lock + unlock, by command"
    );
    let total = if native.is_some() { 6 } else { 8 };
    assert_eq!(work, total, "Redis commands for one lock + unlock");

    // The same without a token: a bare SET NX PX GET, and the release.
    server.reset_stats();
    client
        .lock("rt:unfenced")
        .fence(false)
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let unfenced = server.all_calls();
    let bare_set = server.calls("set");
    println!(
        "  {:<38} {unfenced}",
        "Redis commands, unfenced lock + unlock"
    );
    assert_eq!(bare_set, 1, "an unfenced lock is one bare SET");
    assert_eq!(
        unfenced,
        if native.is_some() { 2 } else { 4 },
        "Redis commands for one unfenced lock + unlock (SET; and DELIFEQ, or EVALSHA GET DEL)"
    );
}

/// What a read lock costs Redis: one EVALSHA to take it, one to release
/// it, and the watchdog's one call per tick for all of a client's read
/// holds.
#[tokio::test]
async fn read_lock_round_trips_counted_by_redis() {
    let server = RedisServer::start();
    let client = LockClient::connect(&server.url()).await.unwrap();
    let other = LockClient::connect(&server.url()).await.unwrap();
    // A key a writer held before (its fence counter exists); then fresh,
    // joining a read-held key, and the two releases.
    client
        .write_lock("rt:doc")
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    server.reset_stats();
    let a = client.read_lock("rt:doc").await.unwrap();
    let fresh = (sent(&server), server.all_calls());
    server.reset_stats();
    let b = other.read_lock("rt:doc").await.unwrap();
    let join = (sent(&server), server.all_calls());
    server.reset_stats();
    b.release().await.unwrap();
    let leave = (sent(&server), server.all_calls());
    server.reset_stats();
    a.release().await.unwrap();
    let last = (sent(&server), server.all_calls());

    // 300 read holds of one client, lease 900 ms: one call per tick.
    let (ticks_window, renewed) = renewal_ticks(&server, &client, true).await;

    println!("\n== read locks: (EVALSHA, Redis commands) per operation ==");
    for (what, n) in [
        ("read lock, fresh", fresh),
        ("read lock, joining readers", join),
        ("read release, others remain", leave),
        ("read release, the last reader", last),
    ] {
        println!("  {what:<38} {n:?}");
    }
    println!(
        "  {:<38} {ticks_window} calls for {renewed} renewals in 1.5 s",
        "read renewal ticks"
    );
    for (what, (calls, _)) in [
        ("fresh", fresh),
        ("join", join),
        ("leave", leave),
        ("last", last),
    ] {
        assert_eq!(calls, 1, "{what}: one EVALSHA");
    }
    // Fresh: EVALSHA, GET lock, TIME, SET counter GET (the hold's token,
    // floored at the clock), DEL + SET + ZADD + PEXPIRE, HDEL (see above).
    // The last release: EVALSHA, GET, ZREM, ZCARD, DEL.
    assert_eq!(fresh.1, 9, "Redis commands for a fresh read lock");
    assert_eq!(last.1, 5, "Redis commands for the last reader's release");
    assert!(
        (3..=7).contains(&ticks_window),
        "{ticks_window} renew calls in 1.5 s for 300 read holds"
    );
    assert!(
        renewed >= 2 * 300,
        "only {renewed} reader renewals of 300 in 1.5 s"
    );
}

/// What a writer-to-writer hand-off costs Redis: the release that hands
/// the lock to the queued writer pops it from the queue without looking
/// first (only a run of readers looks, to stop at the next writer).
#[tokio::test]
async fn a_hand_off_between_writers_counted_by_redis() {
    let server = RedisServer::start();
    let a = LockClient::connect(&server.url()).await.unwrap();
    // The waiter does not ask again while Redis counts.
    let b = LockClient::builder()
        .retry_delay(Duration::from_secs(30))
        .connect(&server.url())
        .await
        .unwrap();
    let held = a.lock("rt:handoff").await.unwrap();
    let waiter = {
        let b = b.clone();
        tokio::spawn(async move { b.lock("rt:handoff").wait(Duration::from_secs(20)).await })
    };
    // Queued and listening for the release.
    assert!(
        tests::eventually(Duration::from_secs(10), || b.waiting_here("rt:handoff")
            == 1)
        .await,
        "the second writer did not queue"
    );
    server.reset_stats();
    held.release().await.unwrap();
    let by_command: Vec<(&str, u64)> = [
        "evalsha", "get", "time", "lindex", "lpop", "hget", "hdel", "publish", "llen", "set",
    ]
    .into_iter()
    .map(|c| (c, server.calls(c)))
    .collect();
    let g = waiter
        .await
        .unwrap()
        .expect("the queued writer was handed the lock");
    g.release().await.unwrap();
    println!("\n== writer-to-writer hand-off, Redis commands of the release ==\n  {by_command:?}");
    // EVALSHA; GET lock; LPOP, HGET, HDEL the head; TIME, SET counter GET
    // (the new holder's token); PUBLISH the grant; LLEN (anyone left?);
    // SET lock.
    assert_eq!(
        by_command,
        vec![
            ("evalsha", 1),
            ("get", 1),
            ("time", 1),
            ("lindex", 0),
            ("lpop", 1),
            ("hget", 1),
            ("hdel", 1),
            ("publish", 1),
            ("llen", 1),
            ("set", 2)
        ],
        "Redis commands for a release that hands the lock to a writer"
    );
}
