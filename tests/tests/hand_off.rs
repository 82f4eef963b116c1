//! Hand-off through the lock's queue, against real Redis servers (and the
//! in-memory backend, which keeps the same queue): a contended acquisition
//! costs two script calls whatever the number of clients; waiters are
//! served in the order they queued; a waiter that died, gave up or was
//! dropped does not stall the lock nor leave anything behind; a waiter
//! whose subscription was cut still gets the lock.

use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lock_runtime::{LockClient, LockError};
use tests::proxy::Proxy;
use tests::{eventually, spawn_tied, unique, RedisServer};

async fn clients(server: &RedisServer, n: usize) -> Vec<LockClient> {
    let mut v = Vec::new();
    for _ in 0..n {
        v.push(LockClient::connect(&server.url()).await.unwrap());
    }
    v
}

fn queued(server: &RedisServer, key: &str) -> i64 {
    server.cmd(&["HLEN", &format!("lock:{{{key}}}:waiters")])
}

/// Script calls (EVALSHA and EVAL) Redis answered since the last reset.
fn script_calls(server: &RedisServer) -> u64 {
    server.calls("evalsha") + server.calls("eval")
}

/// 16 tasks over 4 clients take turns on one key, each holding it for a
/// moment, 25 times each. Every acquisition costs its failed attempt (which
/// queued it) and its holder's release (which handed it over): two script
/// calls, whatever the number of clients.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_contended_acquisition_costs_two_script_calls() {
    tests::init_tracing();
    let server = RedisServer::start();
    // A waiter that waits longer than `retry_delay` asks again on a timer:
    // a stalled machine must not add those to what this counts.
    let mut clients = Vec::new();
    for _ in 0..4 {
        let c = LockClient::builder()
            .retry_delay(Duration::from_secs(60))
            .connect(&server.url())
            .await
            .unwrap();
        clients.push(c);
    }
    let key = unique("contended");
    const TASKS: usize = 16;
    const ROUNDS: usize = 25;
    // Everyone queues behind one holder first, so that every acquisition
    // in the window is contended.
    let first = clients[0]
        .lock(&key)
        .wait(Duration::from_secs(5))
        .await
        .unwrap();
    server.reset_stats();
    let mut tasks = Vec::new();
    for t in 0..TASKS {
        let c = clients[t % clients.len()].clone();
        let key = key.clone();
        tasks.push(tokio::spawn(async move {
            for _ in 0..ROUNDS {
                let g = c.lock(&key).wait(Duration::from_secs(30)).await?;
                tokio::time::sleep(Duration::from_micros(300)).await;
                g.release().await?;
            }
            Ok::<(), LockError>(())
        }));
    }
    // ...and every client listens for its grants (a waiter whose client
    // does not listen yet is passed over and asks again: that first-wait
    // race is not what this counts).
    let all_queued = eventually(Duration::from_secs(10), || {
        let listening: Vec<String> =
            server.cmd(&["PUBSUB", "CHANNELS", &format!("lock:{{{key}}}:granted:*")]);
        queued(&server, &key) == TASKS as i64 && listening.len() == clients.len()
    })
    .await;
    assert!(all_queued, "the 16 tasks did not all queue and listen");
    first.release().await.unwrap();
    for t in tasks {
        t.await.unwrap().unwrap();
    }
    let acquisitions = (TASKS * ROUNDS) as f64;
    // The first holder's release is counted in the window; its acquire is
    // not.
    let calls = script_calls(&server) as f64 - 1.0;
    let handoffs = server.calls("publish");
    println!(
        "{acquisitions} contended acquisitions: {calls} script calls ({:.3} each), {handoffs} grants published, {} Redis commands",
        calls / acquisitions,
        server.all_calls()
    );
    assert!(
        calls / acquisitions <= 2.0,
        "{calls} script calls for {acquisitions} contended acquisitions"
    );
    assert!(
        !server.exists(&format!("lock:{{{key}}}:queue"))
            && !server.exists(&format!("lock:{{{key}}}")),
        "the lock or its queue is left: {:?}",
        server.keys(&format!("lock:{{{key}}}*"))
    );
}

/// Waiters of three clients queue one after the other behind a holder;
/// each release hands the lock to the next in that order, with a higher
/// token each time.
async fn served_in_queue_order(clients: &[LockClient], queued: impl Fn(&str) -> i64) {
    let key = unique("fifo");
    let holder = clients[0].lock(&key).await.unwrap();
    let order: Arc<Mutex<Vec<(usize, u64)>>> = Arc::default();
    let mut tasks = Vec::new();
    for i in 0..6 {
        let (c, k, order) = (
            clients[i % clients.len()].clone(),
            key.clone(),
            order.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let g = c.lock(&k).wait(Duration::from_secs(20)).await?;
            order.lock().unwrap().push((i, g.fence()));
            g.release().await
        }));
        // The next one asks only once this one is in the queue.
        let in_queue = eventually(Duration::from_secs(10), || queued(&key) == i as i64 + 1).await;
        assert!(in_queue, "waiter {i} did not queue");
    }
    let first_fence = holder.fence();
    holder.release().await.unwrap();
    for t in tasks {
        t.await.unwrap().unwrap();
    }
    let order = order.lock().unwrap().clone();
    let who: Vec<usize> = order.iter().map(|o| o.0).collect();
    assert_eq!(who, (0..6).collect::<Vec<_>>(), "not served in queue order");
    let mut last = first_fence;
    for (i, fence) in order {
        assert!(fence > last, "waiter {i} got token {fence} after {last}");
        last = fence;
    }
}

#[tokio::test]
async fn waiters_are_served_in_the_order_they_queued() {
    let server = RedisServer::start();
    let clients = clients(&server, 3).await;
    // Queued and listening: a release reaches every one of them.
    let listening = clients.clone();
    served_in_queue_order(&clients, |key| {
        let here: usize = listening.iter().map(|c| c.waiting_here(key)).sum();
        queued(&server, key).min(here as i64)
    })
    .await;
}

#[tokio::test]
async fn in_memory_waiters_are_served_in_the_order_they_queued() {
    let client = LockClient::memory();
    let c = client.clone();
    served_in_queue_order(&[client], move |key| c.waiting_here(key) as i64).await;
}

/// A waiter whose process died while queued is skipped at once by the
/// release (its client no longer listens), not after its lease: the next
/// waiter gets the lock promptly.
#[tokio::test]
async fn a_dead_waiter_does_not_stall_the_lock() {
    let server = RedisServer::start();
    let clients = clients(&server, 2).await;
    let key = unique("dead-waiter");
    let holder = clients[0].lock(&key).await.unwrap();
    // Another process queues for the key with a 30-s lease...
    let mut worker = spawn_tied({
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_lock_worker"));
        cmd.args(["hold", &server.url(), &key, "30000"])
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        cmd
    })
    .unwrap();
    assert!(
        eventually(Duration::from_secs(10), || queued(&server, &key) == 1).await,
        "the worker did not queue"
    );
    // ...then a waiter of this process queues behind it...
    let next = {
        let c = clients[1].clone();
        let key = key.clone();
        tokio::spawn(async move {
            let asked = Instant::now();
            let g = c.lock(&key).wait(Duration::from_secs(20)).await?;
            Ok::<_, LockError>((g, asked.elapsed()))
        })
    };
    assert!(
        eventually(Duration::from_secs(10), || queued(&server, &key) == 2
            && clients[1].waiting_here(&key) == 1)
        .await,
        "the second waiter did not queue"
    );
    // ...and the worker dies.
    worker.kill().unwrap();
    worker.wait().unwrap();
    let released = Instant::now();
    holder.release().await.unwrap();
    let (guard, _) = next.await.unwrap().unwrap();
    let after_release = released.elapsed();
    assert!(
        after_release < Duration::from_secs(5),
        "the live waiter got the lock {after_release:?} after the release (the dead one's lease is 30 s)"
    );
    assert_eq!(
        server.owner_of(&format!("lock:{{{key}}}")).as_deref(),
        Some(guard.holder())
    );
    guard.release().await.unwrap();
    assert_eq!(
        server.keys(&format!("lock:{{{key}}}*")),
        Vec::<String>::new(),
        "something of the lock is left"
    );
}

/// Clients whose waiters ask again only after a minute: within a test, a
/// waiter gets the lock by a hand-off or not at all.
async fn patient_clients(server: &RedisServer, n: usize) -> Vec<LockClient> {
    let mut v = Vec::new();
    for _ in 0..n {
        let c = LockClient::builder()
            .retry_delay(Duration::from_secs(60))
            .connect(&server.url())
            .await
            .unwrap();
        v.push(c);
    }
    v
}

/// Queues a reader whose client nobody hears (it died, or does not listen
/// yet) behind `key`'s holder: its queue entry, written by `acquire.lua`
/// as the client's attempt would have.
fn queue_a_dead_reader(server: &RedisServer, key: &str) {
    assert_eq!(
        Scripts::new(server, key).acquire("dead:r1"),
        0,
        "the dead reader queues"
    );
}

/// A reader at the head of the queue whose client nobody hears (dead, or
/// not subscribed yet) is passed over by the release, and the writer
/// queued behind it is handed the lock by that same release: it does not
/// wait a `retry_delay` (a minute here) for its next attempt, and no
/// barging reader gets in first.
#[tokio::test]
async fn a_writer_behind_a_reader_nobody_hears_is_served_at_once() {
    let server = RedisServer::start();
    let clients = patient_clients(&server, 2).await;
    let key = unique("dead-reader");
    let lock = format!("lock:{{{key}}}");
    let holder = clients[0].lock(&key).await.unwrap();
    queue_a_dead_reader(&server, &key);
    let writer = {
        let (c, key) = (clients[1].clone(), key.clone());
        tokio::spawn(async move { c.lock(&key).wait(Duration::from_secs(30)).await })
    };
    let ready = eventually(Duration::from_secs(10), || {
        let listening: Vec<String> =
            server.cmd(&["PUBSUB", "CHANNELS", &format!("{lock}:granted:*")]);
        queued(&server, &key) == 2 && listening.len() == 1
    })
    .await;
    assert!(ready, "the writer did not queue behind the dead reader");
    server.reset_stats();
    let first = holder.fence();
    let released = Instant::now();
    holder.release().await.unwrap();
    // The release itself handed the lock over.
    let owner = server.owner_of(&lock).unwrap_or_default();
    assert!(
        owner.starts_with(&format!("{}:", clients[1].id())) && !owner.contains(":r"),
        "after the release the lock is {owner:?}, not the queued writer's: {:?}",
        server.keys(&format!("{lock}*"))
    );
    let g = tokio::time::timeout(Duration::from_secs(5), writer)
        .await
        .expect("the writer was not granted within 5 s")
        .unwrap()
        .unwrap();
    let granted = released.elapsed();
    println!("the writer behind a dead reader was granted {granted:?} after the release");
    assert_eq!(g.holder(), owner);
    assert!(g.fence() > first, "tokens must rise");
    // By the hand-off, not by an attempt of its own.
    assert_eq!(script_calls(&server), 1, "the writer asked again");
    assert!(
        granted < Duration::from_secs(2),
        "granted {granted:?} after the release"
    );
    assert_eq!(queued(&server, &key), 0, "the dead reader is still queued");
    g.release().await.unwrap();
    assert_eq!(
        server.keys(&format!("{lock}*")),
        Vec::<String>::new(),
        "something of the lock is left"
    );
}

/// Passing a dead reader over keeps the queue's order: a live reader
/// behind it is served (with the readers right behind it), and the writer
/// queued after them waits for their release, which then hands it the
/// lock.
#[tokio::test]
async fn a_live_reader_behind_a_dead_one_is_served_before_the_writer_behind_it() {
    let server = RedisServer::start();
    let clients = patient_clients(&server, 3).await;
    let key = unique("dead-then-live-reader");
    let lock = format!("lock:{{{key}}}");
    let holder = clients[0].lock(&key).await.unwrap();
    queue_a_dead_reader(&server, &key);
    let wait = Duration::from_secs(30);
    let reader = {
        let (c, key) = (clients[1].clone(), key.clone());
        tokio::spawn(async move { c.read_lock(&key).wait(wait).await })
    };
    assert!(
        eventually(Duration::from_secs(10), || queued(&server, &key) == 2
            && clients[1].waiting_here(&key) == 1)
        .await,
        "the reader did not queue"
    );
    let writer = {
        let (c, key) = (clients[2].clone(), key.clone());
        tokio::spawn(async move { c.lock(&key).wait(wait).await })
    };
    assert!(
        eventually(Duration::from_secs(10), || queued(&server, &key) == 3
            && clients[2].waiting_here(&key) == 1)
        .await,
        "the writer did not queue"
    );
    server.reset_stats();
    let first = holder.fence();
    holder.release().await.unwrap();
    let r = tokio::time::timeout(Duration::from_secs(5), reader)
        .await
        .expect("the live reader was not granted")
        .unwrap()
        .unwrap();
    assert!(r.fence() >= first);
    assert_eq!(server.owner_of(&lock).as_deref(), Some("~r"));
    assert_eq!(queued(&server, &key), 1, "the writer stays queued");
    assert!(!writer.is_finished(), "the writer got in beside a reader");
    let read = r.fence();
    r.release().await.unwrap();
    let w = tokio::time::timeout(Duration::from_secs(5), writer)
        .await
        .expect("the writer was not granted after the reader left")
        .unwrap()
        .unwrap();
    assert!(w.fence() > read, "tokens must rise");
    // Two releases, each a hand-off: no waiter asked again.
    assert_eq!(script_calls(&server), 2, "a waiter asked again");
    w.release().await.unwrap();
    assert_eq!(
        server.keys(&format!("{lock}*")),
        Vec::<String>::new(),
        "something of the lock is left"
    );
}

/// A waiter that gives up and one whose future is dropped leave the queue
/// at once; the holder's release then goes to the one still waiting, and
/// nothing is left after it releases.
#[tokio::test]
async fn waiters_that_give_up_or_are_dropped_leave_the_queue() {
    let server = RedisServer::start();
    let clients = clients(&server, 3).await;
    let key = unique("leavers");
    let holder = clients[0].lock(&key).await.unwrap();
    let dropped = {
        let (c, key) = (clients[1].clone(), key.clone());
        tokio::spawn(async move { c.lock(&key).wait(Duration::from_secs(60)).await })
    };
    assert!(eventually(Duration::from_secs(10), || queued(&server, &key) == 1).await);
    let gives_up = {
        let (c, key) = (clients[2].clone(), key.clone());
        tokio::spawn(async move { c.lock(&key).wait(Duration::from_secs(3)).await })
    };
    assert!(eventually(Duration::from_secs(10), || queued(&server, &key) == 2).await);
    let stays = {
        let (c, key) = (clients[2].clone(), key.clone());
        tokio::spawn(async move { c.lock(&key).wait(Duration::from_secs(60)).await })
    };
    assert!(eventually(Duration::from_secs(10), || queued(&server, &key) == 3).await);
    dropped.abort();
    assert!(matches!(
        gives_up.await.unwrap(),
        Err(LockError::Timeout { .. })
    ));
    let left = eventually(Duration::from_secs(5), || queued(&server, &key) == 1).await;
    assert!(
        left,
        "the leavers are still queued: {}",
        queued(&server, &key)
    );
    let len: i64 = server.cmd(&["LLEN", &format!("lock:{{{key}}}:queue")]);
    assert_eq!(len, 1, "the leavers are still in the queue list");
    holder.release().await.unwrap();
    let g = tokio::time::timeout(Duration::from_secs(5), stays)
        .await
        .expect("the waiter still queued was not handed the lock")
        .unwrap()
        .unwrap();
    g.release().await.unwrap();
    assert_eq!(
        server.keys(&format!("lock:{{{key}}}*")),
        Vec::<String>::new(),
        "something of the lock is left"
    );
}

/// `waiting_here` counts a waiter from when a release reaches it: while
/// its SUBSCRIBE is still on the way (here held back 1 s, within the 2 s
/// op_timeout a subscription is given), a release would
/// pass it over, so a test that releases once it sees the waiter counted
/// must find Redis listening.
#[tokio::test]
async fn a_waiter_counts_as_waiting_once_it_listens() {
    let server = RedisServer::start();
    let proxy = Proxy::for_server(&server);
    let client = LockClient::connect(&proxy.url()).await.unwrap();
    let key = unique("counted-listening");
    let holder = client.lock(&key).await.unwrap();
    proxy.slow_connection_of(b"SUBSCRIBE", Duration::from_secs(1), Duration::ZERO);
    let waiter = {
        let (c, key) = (client.clone(), key.clone());
        tokio::spawn(async move { c.lock(&key).wait(Duration::from_secs(20)).await })
    };
    assert!(eventually(Duration::from_secs(10), || client.waiting_here(&key) == 1).await);
    let listening: Vec<String> =
        server.cmd(&["PUBSUB", "CHANNELS", &format!("lock:{{{key}}}:granted:*")]);
    assert_eq!(
        listening.len(),
        1,
        "counted as waiting before Redis had it listening"
    );
    proxy.end_slow_spell();
    server.reset_stats();
    holder.release().await.unwrap();
    let g = waiter.await.unwrap().unwrap();
    // Handed over by the release: the waiter sent no attempt after it.
    assert_eq!(script_calls(&server), 1, "the waiter was passed over");
    g.release().await.unwrap();
}

/// The connection a waiter's client listens on is cut while it waits: the
/// waiter asks again when its client reconnects, and gets the lock after
/// the holder's release, well within its wait.
#[tokio::test]
async fn a_waiter_whose_subscription_was_cut_still_gets_the_lock() {
    let server = RedisServer::start();
    let clients = clients(&server, 2).await;
    let key = unique("cut-subscriber");
    let holder = clients[0].lock(&key).await.unwrap();
    let waiter = {
        let (c, key) = (clients[1].clone(), key.clone());
        tokio::spawn(async move { c.lock(&key).wait(Duration::from_secs(20)).await })
    };
    assert!(
        eventually(Duration::from_secs(10), || clients[1].waiting_here(&key)
            == 1)
        .await
    );
    let killed: i64 = server.cmd(&["CLIENT", "KILL", "TYPE", "pubsub"]);
    assert!(killed >= 1, "no subscriber connection to cut");
    holder.release().await.unwrap();
    let released = Instant::now();
    let g = waiter.await.unwrap().unwrap();
    assert!(
        released.elapsed() < Duration::from_secs(5),
        "the waiter got the lock {:?} after the release",
        released.elapsed()
    );
    g.release().await.unwrap();
}

/// The lock scripts, run by hand: what a client sends, step by step.
struct Scripts {
    conn: redis::Connection,
    key: String,
}

impl Scripts {
    fn new(server: &RedisServer, key: &str) -> Self {
        Scripts {
            conn: server.conn(),
            key: format!("lock:{{{key}}}"),
        }
    }

    /// `acquire.lua` for `owner`, queuing for 10 s if busy; the reply's
    /// first number.
    fn acquire(&mut self, owner: &str) -> i64 {
        tests::scripts::acquire(&mut self.conn, &self.key, owner, 30_000, "10000", "f")[0]
    }

    /// `release.lua` for `owner`; 1 released, 0 absent, -1 another's.
    fn release(&mut self, owner: &str) -> i64 {
        tests::scripts::release(&mut self.conn, &self.key, owner, "r")
    }
}

/// A release whose reply was lost is sent again after it already handed
/// the lock over (the cluster client re-sends on its own, unseen): the
/// repeat says released, not "held by another", which would report a
/// lock that was never lost as lost.
#[tokio::test]
async fn a_release_sent_again_after_handing_over_says_released() {
    let server = RedisServer::start();
    let key = unique("resent-release");
    let mut s = Scripts::new(&server, &key);
    assert_eq!(s.acquire("a:1"), 1);
    assert_eq!(s.acquire("b:1"), 0, "b queues");
    // b's client listens on its grant channel.
    let mut sub = server.conn();
    let _: () = redis::cmd("SUBSCRIBE")
        .arg(format!("lock:{{{key}}}:granted:b"))
        .query(&mut sub)
        .unwrap();
    assert_eq!(s.release("a:1"), 1, "a releases, handing over to b");
    assert_eq!(
        server.owner_of(&format!("lock:{{{key}}}")).as_deref(),
        Some("b:1")
    );
    assert_eq!(s.release("a:1"), 1, "the same release, sent again");
    assert_eq!(
        server.owner_of(&format!("lock:{{{key}}}")).as_deref(),
        Some("b:1"),
        "the repeat touched b's lock"
    );
    assert_eq!(
        s.release("c:1"),
        -1,
        "a stranger's release is still refused"
    );
}

/// The release that passed a dead reader over and handed the lock to the
/// writer behind it is sent again (its reply was lost): the repeat says
/// released and leaves the writer's hold as it is.
#[tokio::test]
async fn a_release_that_passed_a_dead_reader_over_is_safe_to_send_again() {
    let server = RedisServer::start();
    let key = unique("resent-past-dead-reader");
    let lock = format!("lock:{{{key}}}");
    let mut s = Scripts::new(&server, &key);
    assert_eq!(s.acquire("a:1"), 1);
    assert_eq!(s.acquire("dead:r1"), 0, "the dead reader queues");
    assert_eq!(s.acquire("b:1"), 0, "b queues behind it");
    let mut sub = server.conn();
    let _: () = redis::cmd("SUBSCRIBE")
        .arg(format!("{lock}:granted:b"))
        .query(&mut sub)
        .unwrap();
    assert_eq!(s.release("a:1"), 1, "a releases, handing over to b");
    assert_eq!(
        server.owner_of(&lock).as_deref(),
        Some("b:1"),
        "after the release: {:?}",
        server.keys(&format!("{lock}*"))
    );
    let held: String = server.cmd(&["GET", &lock]);
    assert_eq!(s.release("a:1"), 1, "the same release, sent again");
    let again: String = server.cmd(&["GET", &lock]);
    assert_eq!(again, held, "the repeat touched b's lock");
    assert_eq!(s.release("b:1"), 1);
    assert_eq!(
        server.keys(&format!("{lock}*")),
        Vec::<String>::new(),
        "something of the lock is left"
    );
}

/// A waiter that gives up leaves the queue whatever the lock looks like:
/// here the lock expired while it waited, and a newcomer took it without
/// anyone queued behind (an unmarked lock). Left in the queue, the next
/// release would hand the lock to an owner nobody waits as.
#[tokio::test]
async fn a_waiter_leaves_the_queue_also_behind_an_unmarked_lock() {
    let server = RedisServer::start();
    let key = unique("leave-unmarked");
    let mut s = Scripts::new(&server, &key);
    assert_eq!(s.acquire("a:1"), 1);
    assert_eq!(s.acquire("b:1"), 0, "b queues");
    // a's lease runs out; d takes the free lock.
    let _: i64 = server.cmd(&["DEL", &format!("lock:{{{key}}}")]);
    assert_eq!(s.acquire("d:1"), 1);
    assert_eq!(
        server.owner_of(&format!("lock:{{{key}}}")).as_deref(),
        Some("d:1")
    );
    // b gives up.
    assert_eq!(s.release("b:1"), -1);
    assert_eq!(
        server.keys(&format!("lock:{{{key}}}:*")),
        Vec::<String>::new(),
        "b is still queued"
    );
}

/// The queue holds an entry of a client that no request of that client
/// stands behind (its attempt's answer was lost and its withdrawal failed,
/// say): the release hands the lock to it, since the client listens. The
/// client passes the grant nobody claims on within about a second, instead
/// of leaving the lock to that owner for its 30-s lease.
#[tokio::test]
async fn a_grant_nobody_claims_is_passed_on() {
    let server = RedisServer::start();
    let clients = clients(&server, 2).await;
    let key = unique("unclaimed");
    let holder = clients[0].lock(&key).await.unwrap();
    let stray = format!("{}:999999", clients[1].id());
    assert_eq!(
        Scripts::new(&server, &key).acquire(&stray),
        0,
        "the stray entry queues"
    );
    let waiter = {
        let (c, key) = (clients[1].clone(), key.clone());
        tokio::spawn(async move { c.lock(&key).wait(Duration::from_secs(20)).await })
    };
    let ready = eventually(Duration::from_secs(10), || {
        let listening: Vec<String> =
            server.cmd(&["PUBSUB", "CHANNELS", &format!("lock:{{{key}}}:granted:*")]);
        queued(&server, &key) == 2 && listening.len() == 1
    })
    .await;
    assert!(ready, "the waiter did not queue behind the stray entry");
    let released = Instant::now();
    holder.release().await.unwrap();
    let g = waiter.await.unwrap().unwrap();
    assert!(
        released.elapsed() < Duration::from_secs(5),
        "the waiter got the lock {:?} after the release",
        released.elapsed()
    );
    g.release().await.unwrap();
}
