//! A TCP fault proxy between lock clients and one `redis-server`.
//!
//! Clients connect to [`Proxy::url`]; every connection is forwarded to the
//! upstream port, and the test switches what the "network" does at any
//! moment with [`Proxy::set`]:
//!
//! | mode | existing connections | new connections |
//! |---|---|---|
//! | [`Mode::Pass`] | bytes forwarded at once | accepted, forwarded |
//! | [`Mode::Delay`] | every chunk delivered `d` after it was read (order kept) | same |
//! | [`Mode::Drop`] | bytes read and thrown away; a connection that lost bytes is closed when the mode ends (a TCP stream with a hole in it cannot go on) | same |
//! | [`Mode::Blackhole`] | held open, nothing read or forwarded; when the mode ends, what was sent meanwhile is delivered | accepted, then silent |
//! | [`Mode::Refuse`] | closed | closed at once (as if Redis were down) |
//!
//! | [`Mode::DelayReplies`] | replies (Redis -> client) delivered `d` late, requests at once | same |
//!
//! [`Proxy::cut`] closes every open connection once and leaves the mode as
//! it is. [`Proxy::lose_reply_to`] arms a one-shot reply loss: the next
//! command matching a pattern runs on Redis, but its reply is thrown away
//! and the connection closed, so the client cannot know the outcome.
//! [`Proxy::lose_replies`] does the same to a random share of the commands
//! matching a pattern, until turned off.
//!
//! Faults on one connection while the others stay fast:
//! [`Proxy::slow_connection_of`] makes the connection that sends the next
//! matching command slow (its requests, its replies or both, by a fixed
//! extra delay, order kept) until [`Proxy::end_slow_spell`]; and
//! [`Proxy::resend`] plays a transport that sends a command again: a copy
//! of the next matching command reaches Redis once more, later, on a
//! connection of its own (its reply is read and thrown away).
//! [`Proxy::spare_pubsub`] keeps every fault off subscription connections
//! (those that sent a `SUBSCRIBE`), so grant messages stay fast while
//! commands are slow or cut.
//!
//! The proxy runs on a thread and runtime of its own, so it keeps
//! forwarding (and faulting) while the test's runtime is busy or blocked.

use std::net::TcpListener as StdListener;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot, watch, Notify};
use tokio::time::Instant;

/// What the proxy does to traffic; see the module docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Pass,
    Delay(Duration),
    Drop,
    Blackhole,
    Refuse,
    /// Replies (Redis -> client) delivered `d` after they were read;
    /// requests forwarded at once.
    DelayReplies(Duration),
}

/// Counters, for the figures a test prints.
#[derive(Debug, Default, Clone, Copy)]
pub struct ProxyStats {
    pub accepted: u64,
    pub refused: u64,
    pub open: usize,
    pub cut: u64,
    pub bytes_forwarded: u64,
    pub bytes_dropped: u64,
    pub replies_lost: u64,
    /// Connections made slow by [`Proxy::slow_connection_of`].
    pub slowed: u64,
    /// Commands sent again by [`Proxy::resend`].
    pub resent: u64,
}

struct Shared {
    mode: watch::Sender<Mode>,
    /// Bumped by every cut; each connection closes when it changes.
    cuts: watch::Sender<u64>,
    accepted: AtomicU64,
    refused: AtomicU64,
    open: AtomicUsize,
    cut: AtomicU64,
    forwarded: AtomicU64,
    dropped: AtomicU64,
    /// The armed reply-loss pattern; taken (under the lock) by the one
    /// connection it fires on.
    lose: Mutex<Option<Vec<u8>>>,
    /// What happens once the armed loss fires.
    then: Mutex<Option<Then>>,
    /// Replies lost at random: to requests containing the pattern, this
    /// share of them.
    lose_share: Mutex<Option<(Vec<u8>, f64)>>,
    lost: AtomicU64,
    /// Faults leave subscription connections alone.
    spare_pubsub: AtomicBool,
    /// The armed slow connection: pattern, extra delay of its requests and
    /// of its replies.
    slow: Mutex<Option<(Vec<u8>, Duration, Duration)>>,
    /// Bumped by [`Proxy::end_slow_spell`]: a connection is slow while
    /// its spell number is the current one.
    spell: AtomicU64,
    slowed: AtomicU64,
    /// The armed re-send: pattern, and how long after the original.
    resend: Mutex<Option<(Vec<u8>, Duration)>>,
    /// How many re-sent copies reached Redis and were answered.
    resent: watch::Sender<u64>,
}

/// What the proxy does once an armed reply loss fired.
#[derive(Debug, Clone)]
enum Then {
    /// Switch to this mode.
    Mode(Mode),
    /// Make the next connection whose request contains the pattern slow
    /// (see [`Proxy::slow_connection_of`]).
    Slow(Vec<u8>, Duration, Duration),
}

/// Whether `chunk` contains `pattern` (an empty pattern matches anything).
fn matches(chunk: &[u8], pattern: &[u8]) -> bool {
    pattern.is_empty() || chunk.windows(pattern.len()).any(|w| w == pattern)
}

/// The first whole RESP command (an array of bulk strings, as clients send
/// them) in `chunk` that contains `pattern`; the whole chunk if it cannot
/// be split that way.
fn command_with(chunk: &[u8], pattern: &[u8]) -> Vec<u8> {
    fn line(b: &[u8], at: usize) -> Option<(usize, usize)> {
        let end = at + b.get(at..)?.windows(2).position(|w| w == b"\r\n")?;
        let n = std::str::from_utf8(&b[at + 1..end]).ok()?.parse().ok()?;
        Some((n, end + 2))
    }
    let mut at = 0;
    while at < chunk.len() {
        let start = at;
        if chunk[at] != b'*' {
            break;
        }
        let Some((items, mut next)) = line(chunk, at) else {
            break;
        };
        let mut whole = true;
        for _ in 0..items {
            match line(chunk, next) {
                Some((len, body))
                    if chunk.get(next) == Some(&b'$') && body + len + 2 <= chunk.len() =>
                {
                    next = body + len + 2;
                }
                _ => {
                    whole = false;
                    break;
                }
            }
        }
        if !whole {
            break;
        }
        at = next;
        if matches(&chunk[start..at], pattern) {
            return chunk[start..at].to_vec();
        }
    }
    chunk.to_vec()
}

impl Shared {
    /// Switch the mode; `Refuse` also closes every open connection.
    fn switch(&self, mode: Mode) {
        self.mode.send_replace(mode);
        if mode == Mode::Refuse {
            self.cut_all();
        }
    }

    fn cut_all(&self) {
        self.cut.fetch_add(1, Ordering::Relaxed);
        self.cuts.send_modify(|n| *n += 1);
    }

    /// Whether `chunk` fires the armed reply loss; disarms it if so, so
    /// only one connection fires per arming.
    fn take_loss(&self, chunk: &[u8]) -> bool {
        let mut armed = self.lose.lock().unwrap();
        let hit = armed.as_deref().is_some_and(|p| matches(chunk, p));
        if hit {
            *armed = None;
        }
        hit
    }

    /// Whether `chunk` draws a random reply loss.
    fn draws_loss(&self, chunk: &[u8]) -> bool {
        let share = self.lose_share.lock().unwrap();
        share
            .as_ref()
            .is_some_and(|(p, f)| matches(chunk, p) && fastrand::f64() < *f)
    }

    /// The extra delays (requests, replies) if `chunk` fires the armed
    /// slow connection; disarms it if so.
    fn take_slow(&self, chunk: &[u8]) -> Option<(Duration, Duration)> {
        let mut armed = self.slow.lock().unwrap();
        let (p, to_redis, to_client) = armed.as_ref()?;
        if !matches(chunk, p) {
            return None;
        }
        let out = (*to_redis, *to_client);
        *armed = None;
        self.slowed.fetch_add(1, Ordering::Relaxed);
        Some(out)
    }

    /// The command to send again and when, if `chunk` fires the armed
    /// re-send; disarms it if so.
    fn take_resend(&self, chunk: &[u8]) -> Option<(Vec<u8>, Duration)> {
        let mut armed = self.resend.lock().unwrap();
        let (p, after) = armed.as_ref()?;
        if !matches(chunk, p) {
            return None;
        }
        let out = (command_with(chunk, p), *after);
        *armed = None;
        Some(out)
    }
}

/// A fault-injecting TCP proxy on `127.0.0.1`; stops when dropped.
pub struct Proxy {
    port: u16,
    upstream: u16,
    shared: Arc<Shared>,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Proxy {
    /// Forward a free local port (from the lane's range, see
    /// [`free_port`](crate::free_port)) to `127.0.0.1:upstream`, in
    /// [`Mode::Pass`].
    pub fn start(upstream: u16) -> Proxy {
        let listener = StdListener::bind(("127.0.0.1", crate::free_port())).expect("proxy: bind");
        listener.set_nonblocking(true).expect("proxy: nonblocking");
        let port = listener.local_addr().expect("proxy: addr").port();
        let shared = Arc::new(Shared {
            mode: watch::channel(Mode::Pass).0,
            cuts: watch::channel(0).0,
            accepted: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            open: AtomicUsize::new(0),
            cut: AtomicU64::new(0),
            forwarded: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
            lose: Mutex::new(None),
            then: Mutex::new(None),
            lose_share: Mutex::new(None),
            lost: AtomicU64::new(0),
            spare_pubsub: AtomicBool::new(false),
            slow: Mutex::new(None),
            spell: AtomicU64::new(0),
            slowed: AtomicU64::new(0),
            resend: Mutex::new(None),
            resent: watch::channel(0).0,
        });
        let (stop, stopped) = oneshot::channel();
        let sh = shared.clone();
        let thread = std::thread::Builder::new()
            .name(format!("fault-proxy-{port}"))
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("proxy runtime");
                rt.block_on(accept_loop(listener, upstream, sh, stopped));
                // Dropping the runtime closes every connection.
            })
            .expect("proxy thread");
        Proxy {
            port,
            upstream,
            shared,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    /// A proxy in front of a test server (it follows the server across
    /// restarts, which keep the port).
    pub fn for_server(server: &crate::RedisServer) -> Proxy {
        Self::start(server.port())
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn upstream(&self) -> u16 {
        self.upstream
    }

    /// `redis://127.0.0.1:<proxy port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Switch what the network does, from now on. `Refuse` also cuts the
    /// open connections.
    pub fn set(&self, mode: Mode) {
        self.shared.switch(mode);
    }

    pub fn mode(&self) -> Mode {
        *self.shared.mode.borrow()
    }

    /// Close every open connection now (clients see the peer hang up).
    pub fn cut(&self) {
        self.shared.cut_all();
    }

    /// Arm a one-shot reply loss: the next request (client -> Redis bytes)
    /// that contains `pattern` is forwarded to Redis; the next reply bytes
    /// Redis sends back on that same connection after it (which prove the
    /// command ran) are thrown away and that connection is closed in both
    /// directions, so the client cannot know the outcome. Disarmed once it
    /// fires.
    ///
    /// The match is a substring search in one chunk read from the client
    /// (an empty pattern matches any chunk). With pipelined commands the
    /// reply thrown away may be an earlier command's, read after the match
    /// was forwarded; the matching command has run either way. A request
    /// dropped by [`Mode::Drop`] does not fire. If the connection ends
    /// before Redis answers, nothing is counted lost.
    pub fn lose_reply_to(&self, pattern: &[u8]) {
        *self.shared.lose.lock().unwrap() = Some(pattern.to_vec());
    }

    /// Like [`Proxy::lose_reply_to`], and once the reply is lost the proxy
    /// switches to `mode` as [`set`](Self::set) does (`Mode::Refuse`: every
    /// open connection is closed and the client cannot reconnect, so it
    /// cannot learn the outcome either).
    pub fn lose_reply_to_then(&self, pattern: &[u8], mode: Mode) {
        *self.shared.then.lock().unwrap() = Some(Then::Mode(mode));
        self.lose_reply_to(pattern);
    }

    /// Like [`Proxy::lose_reply_to`], and once the reply is lost, the
    /// connection that next sends `pattern` (the client sending the
    /// command again, say) is made slow as
    /// [`slow_connection_of`](Self::slow_connection_of) says.
    pub fn lose_reply_to_then_slow(&self, pattern: &[u8], to_redis: Duration, to_client: Duration) {
        *self.shared.then.lock().unwrap() = Some(Then::Slow(pattern.to_vec(), to_redis, to_client));
        self.lose_reply_to(pattern);
    }

    /// From now on, each request containing `pattern` (empty: any) loses
    /// its reply with probability `share`, as
    /// [`lose_reply_to`](Self::lose_reply_to) says: the command runs on
    /// Redis, its reply is thrown away and the connection closed. Spared
    /// subscription connections (see [`spare_pubsub`](Self::spare_pubsub))
    /// keep their replies. A share of 0 turns this off. An armed one-shot
    /// loss and its follow-up are not disturbed.
    pub fn lose_replies(&self, pattern: &[u8], share: f64) {
        *self.shared.lose_share.lock().unwrap() = (share > 0.0).then(|| (pattern.to_vec(), share));
    }

    /// Disarm without firing.
    pub fn disarm(&self) {
        *self.shared.lose.lock().unwrap() = None;
        *self.shared.then.lock().unwrap() = None;
        *self.shared.resend.lock().unwrap() = None;
    }

    /// Whether an armed loss is still waiting for its command.
    pub fn armed(&self) -> bool {
        self.shared.lose.lock().unwrap().is_some()
    }

    /// From now on, faults (modes, cuts, slow connections) leave
    /// subscription connections alone: a connection that sent a
    /// `SUBSCRIBE` keeps passing bytes at once, and grant messages arrive
    /// while commands are cut or slow. (A subscription connection made
    /// while the proxy refuses connections is refused all the same.)
    pub fn spare_pubsub(&self) {
        self.shared.spare_pubsub.store(true, Ordering::Relaxed);
    }

    /// Arm a one-shot slow connection: the connection that next sends a
    /// request containing `pattern` (empty: any command connection) delays
    /// that request and every later one by `to_redis`, and every reply from
    /// then on by `to_client`, order kept, until
    /// [`end_slow_spell`](Self::end_slow_spell). Other connections, and
    /// new ones, stay as fast as the mode says.
    pub fn slow_connection_of(&self, pattern: &[u8], to_redis: Duration, to_client: Duration) {
        *self.shared.slow.lock().unwrap() = Some((pattern.to_vec(), to_redis, to_client));
    }

    /// Every slow connection is fast again (bytes already delayed still
    /// arrive when due); an armed one that never fired is disarmed.
    pub fn end_slow_spell(&self) {
        *self.shared.slow.lock().unwrap() = None;
        self.shared.spell.fetch_add(1, Ordering::SeqCst);
    }

    /// Arm a one-shot transport re-send: the next request containing
    /// `pattern` is forwarded as usual, and `after` later a copy of that
    /// command reaches Redis again on a connection of its own (as a
    /// client that lost its connection sends it again on a new one); the
    /// copy's reply is thrown away. See [`resent`](Self::resent).
    pub fn resend(&self, pattern: &[u8], after: Duration) {
        *self.shared.resend.lock().unwrap() = Some((pattern.to_vec(), after));
    }

    /// Whether an armed re-send is still waiting for its command.
    pub fn resend_armed(&self) -> bool {
        self.shared.resend.lock().unwrap().is_some()
    }

    /// Resolves once `n` re-sent copies ran on Redis (their replies came
    /// back), or after `limit`; says whether they did.
    pub async fn resent(&self, n: u64, limit: Duration) -> bool {
        let mut rx = self.shared.resent.subscribe();
        tokio::time::timeout(limit, rx.wait_for(|&k| k >= n))
            .await
            .is_ok_and(|r| r.is_ok())
    }

    /// How many replies were thrown away by [`Proxy::lose_reply_to`] since
    /// the proxy started.
    pub fn replies_lost(&self) -> u64 {
        self.shared.lost.load(Ordering::Relaxed)
    }

    pub fn stats(&self) -> ProxyStats {
        let s = &self.shared;
        ProxyStats {
            accepted: s.accepted.load(Ordering::Relaxed),
            refused: s.refused.load(Ordering::Relaxed),
            open: s.open.load(Ordering::Relaxed),
            cut: s.cut.load(Ordering::Relaxed),
            bytes_forwarded: s.forwarded.load(Ordering::Relaxed),
            bytes_dropped: s.dropped.load(Ordering::Relaxed),
            replies_lost: s.lost.load(Ordering::Relaxed),
            slowed: s.slowed.load(Ordering::Relaxed),
            resent: *s.resent.borrow(),
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

async fn accept_loop(
    listener: StdListener,
    upstream: u16,
    shared: Arc<Shared>,
    mut stopped: oneshot::Receiver<()>,
) {
    let listener = TcpListener::from_std(listener).expect("proxy: listener");
    loop {
        let sock = tokio::select! {
            _ = &mut stopped => return,
            r = listener.accept() => match r {
                Ok((sock, _)) => sock,
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    continue;
                }
            },
        };
        if *shared.mode.borrow() == Mode::Refuse {
            shared.refused.fetch_add(1, Ordering::Relaxed);
            drop(sock);
            continue;
        }
        shared.accepted.fetch_add(1, Ordering::Relaxed);
        tokio::spawn(serve(sock, upstream, shared.clone()));
    }
}

/// Send `command` to Redis on a connection of its own and read (and throw
/// away) its reply: a transport's second send of a command.
async fn send_again(command: Vec<u8>, after: Duration, upstream: u16, shared: Arc<Shared>) {
    tokio::time::sleep(after).await;
    let Ok(Ok(mut up)) = tokio::time::timeout(
        Duration::from_secs(2),
        TcpStream::connect(("127.0.0.1", upstream)),
    )
    .await
    else {
        return;
    };
    if up.write_all(&command).await.is_err() {
        return;
    }
    let mut reply = [0u8; 512];
    if let Ok(Ok(n)) = tokio::time::timeout(Duration::from_secs(5), up.read(&mut reply)).await {
        if n > 0 {
            shared.resent.send_modify(|k| *k += 1);
        }
    }
}

struct OpenGuard(Arc<Shared>);

impl Drop for OpenGuard {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Reply-loss progress of one connection.
const LOSS_NONE: u8 = 0;
/// A request matched; it is queued for Redis.
const LOSS_QUEUED: u8 = 1;
/// The matching request was written to Redis: the next reply chunk read is
/// thrown away.
const LOSS_SENT: u8 = 2;

/// What the two directions of one connection share.
struct Conn {
    poisoned: AtomicBool,
    loss: AtomicU8,
    /// The pending loss is the armed one (not a random one): its
    /// follow-up ([`Then`]) happens when it fires.
    armed_loss: AtomicBool,
    /// Notified when a reply was lost: the connection closes at once.
    closed: Notify,
    /// This connection sent a `SUBSCRIBE`.
    pubsub: AtomicBool,
    /// Slow during this spell (see [`Shared::spell`]; `u64::MAX`: never
    /// made slow), by these extra delays in ms (requests, replies).
    slow_spell: AtomicU64,
    slow_to_redis: AtomicU64,
    slow_to_client: AtomicU64,
}

impl Conn {
    /// Whether `chunk`, about to be forwarded to Redis, fires the armed
    /// reply loss or draws a random one; one pending loss per connection at
    /// most.
    fn fires(&self, shared: &Shared, chunk: &[u8]) -> bool {
        if self.loss.load(Ordering::SeqCst) != LOSS_NONE {
            return false;
        }
        let armed = shared.take_loss(chunk);
        if !armed && (self.spared(shared) || !shared.draws_loss(chunk)) {
            return false;
        }
        self.armed_loss.store(armed, Ordering::SeqCst);
        self.loss.store(LOSS_QUEUED, Ordering::SeqCst);
        true
    }

    /// Whether faults leave this connection alone.
    fn spared(&self, shared: &Shared) -> bool {
        self.pubsub.load(Ordering::Relaxed) && shared.spare_pubsub.load(Ordering::Relaxed)
    }

    /// The extra delay of a chunk going `dir` now.
    fn slowness(&self, shared: &Shared, dir: Dir) -> Duration {
        if self.slow_spell.load(Ordering::SeqCst) != shared.spell.load(Ordering::SeqCst) {
            return Duration::ZERO;
        }
        Duration::from_millis(match dir {
            Dir::ToRedis => self.slow_to_redis.load(Ordering::SeqCst),
            Dir::ToClient => self.slow_to_client.load(Ordering::SeqCst),
        })
    }
}

/// Which way a [`pipe`] carries bytes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Dir {
    ToRedis,
    ToClient,
}

async fn serve(client: TcpStream, upstream: u16, shared: Arc<Shared>) {
    shared.open.fetch_add(1, Ordering::Relaxed);
    let _open = OpenGuard(shared.clone());
    let mut cuts = shared.cuts.subscribe();
    cuts.mark_unchanged();
    let up = tokio::select! {
        r = tokio::time::timeout(Duration::from_secs(2), TcpStream::connect(("127.0.0.1", upstream))) => match r {
            Ok(Ok(s)) => s,
            // Redis is down: the client sees its connection closed.
            _ => return,
        },
        _ = cuts.changed() => return,
    };
    let _ = client.set_nodelay(true);
    let _ = up.set_nodelay(true);
    let (cr, cw) = client.into_split();
    let (ur, uw) = up.into_split();
    let conn = Arc::new(Conn {
        poisoned: AtomicBool::new(false),
        loss: AtomicU8::new(LOSS_NONE),
        armed_loss: AtomicBool::new(false),
        closed: Notify::new(),
        pubsub: AtomicBool::new(false),
        slow_spell: AtomicU64::new(u64::MAX),
        slow_to_redis: AtomicU64::new(0),
        slow_to_client: AtomicU64::new(0),
    });
    let cut = async {
        loop {
            if cuts.changed().await.is_err() || !conn.spared(&shared) {
                return;
            }
        }
    };
    tokio::select! {
        _ = pipe(cr, uw, shared.clone(), conn.clone(), Dir::ToRedis, upstream) => {}
        _ = pipe(ur, cw, shared.clone(), conn.clone(), Dir::ToClient, upstream) => {}
        _ = conn.closed.notified() => {}
        _ = cut => {}
    }
}

/// One direction of one connection: a reader that applies the mode, and a
/// writer that delivers each chunk at its due time, in order. Ends when the
/// source closes (after delivering what it sent), the sink fails, or the
/// stream lost bytes and the drop is over.
///
/// Reply loss relies on the proxy's runtime being single-threaded: the
/// writer marks the matching request sent right after writing it, so a
/// reply read that sees the mark was read after the request reached Redis.
async fn pipe(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    shared: Arc<Shared>,
    conn: Arc<Conn>,
    dir: Dir,
    upstream: u16,
) {
    // Each chunk: when it is due, its bytes, and whether it fires a loss.
    let (tx, mut rx) = mpsc::unbounded_channel::<(Instant, Vec<u8>, bool)>();
    let sh = shared.clone();
    let c = conn.clone();
    let writer = async move {
        while let Some((due, chunk, fires)) = rx.recv().await {
            // A timer rounds up to the next millisecond: only sleep if delayed.
            if due > Instant::now() {
                tokio::time::sleep_until(due).await;
            }
            if to.write_all(&chunk).await.is_err() {
                return;
            }
            sh.forwarded
                .fetch_add(chunk.len() as u64, Ordering::Relaxed);
            if fires {
                c.loss.store(LOSS_SENT, Ordering::SeqCst);
            }
        }
    };
    let reader = async move {
        let mut mode_rx = shared.mode.subscribe();
        let mut buf = vec![0u8; 64 * 1024];
        // What the mode means for this connection (a spared one passes).
        let effective = |m: Mode, conn: &Conn| if conn.spared(&shared) { Mode::Pass } else { m };
        loop {
            // A black hole reads nothing: the bytes wait in the kernel.
            let mode = match mode_rx
                .wait_for(|m| effective(*m, &conn) != Mode::Blackhole)
                .await
            {
                Ok(m) => effective(*m, &conn),
                Err(_) => return,
            };
            if conn.poisoned.load(Ordering::Relaxed) && mode != Mode::Drop {
                return;
            }
            let n = tokio::select! {
                r = from.read(&mut buf) => match r {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                },
                _ = mode_rx.changed() => continue,
            };
            if dir == Dir::ToRedis
                && !conn.pubsub.load(Ordering::Relaxed)
                && matches(&buf[..n], b"SUBSCRIBE")
            {
                conn.pubsub.store(true, Ordering::Relaxed);
            }
            let mut mode = effective(*mode_rx.borrow_and_update(), &conn);
            if mode == Mode::Blackhole {
                // Read just as the hole opened: hold the chunk until it closes.
                mode = match mode_rx
                    .wait_for(|m| effective(*m, &conn) != Mode::Blackhole)
                    .await
                {
                    Ok(m) => effective(*m, &conn),
                    Err(_) => return,
                };
            }
            if mode == Mode::Refuse {
                // Read as the proxy began refusing: the connection is being
                // closed, and nothing more gets through it.
                return;
            }
            if dir == Dir::ToClient && conn.loss.load(Ordering::SeqCst) == LOSS_SENT {
                // Redis answered the matching request: lose the answer and
                // hang up both ways.
                shared.lost.fetch_add(1, Ordering::Relaxed);
                let then = if conn.armed_loss.load(Ordering::SeqCst) {
                    shared.then.lock().unwrap().take()
                } else {
                    None
                };
                match then {
                    Some(Then::Mode(next)) => shared.switch(next),
                    Some(Then::Slow(p, to_redis, to_client)) => {
                        *shared.slow.lock().unwrap() = Some((p, to_redis, to_client));
                    }
                    None => {}
                }
                conn.closed.notify_one();
                return;
            }
            let chunk = buf[..n].to_vec();
            if dir == Dir::ToRedis && !conn.spared(&shared) && mode != Mode::Drop {
                if let Some((to_redis, to_client)) = shared.take_slow(&chunk) {
                    conn.slow_to_redis
                        .store(to_redis.as_millis() as u64, Ordering::SeqCst);
                    conn.slow_to_client
                        .store(to_client.as_millis() as u64, Ordering::SeqCst);
                    conn.slow_spell
                        .store(shared.spell.load(Ordering::SeqCst), Ordering::SeqCst);
                }
                if let Some((command, after)) = shared.take_resend(&chunk) {
                    tokio::spawn(send_again(command, after, upstream, shared.clone()));
                }
            }
            let delay = match mode {
                Mode::Delay(d) => d,
                Mode::DelayReplies(d) if dir == Dir::ToClient => d,
                _ => Duration::ZERO,
            } + conn.slowness(&shared, dir);
            match mode {
                Mode::Drop => {
                    conn.poisoned.store(true, Ordering::Relaxed);
                    shared.dropped.fetch_add(n as u64, Ordering::Relaxed);
                }
                _ => {
                    let fires = dir == Dir::ToRedis && conn.fires(&shared, &chunk);
                    let _ = tx.send((Instant::now() + delay, chunk, fires));
                }
            }
        }
        // `tx` drops here: the writer delivers what is queued, then ends.
    };
    let writer = tokio::spawn(writer);
    reader.await;
    let _ = writer.await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    /// An echo server on a free port.
    fn echo() -> u16 {
        let l = StdListener::bind(("127.0.0.1", crate::free_port())).unwrap();
        let port = l.local_addr().unwrap().port();
        std::thread::spawn(move || {
            for s in l.incoming() {
                let Ok(mut s) = s else { return };
                std::thread::spawn(move || {
                    let mut b = [0u8; 1024];
                    while let Ok(n) = s.read(&mut b) {
                        if n == 0 || s.write_all(&b[..n]).is_err() {
                            return;
                        }
                    }
                });
            }
        });
        port
    }

    fn connect(p: &Proxy) -> std::net::TcpStream {
        let s = std::net::TcpStream::connect(("127.0.0.1", p.port())).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s
    }

    fn roundtrip(s: &mut std::net::TcpStream, msg: &[u8]) -> std::io::Result<Vec<u8>> {
        s.write_all(msg)?;
        let mut got = vec![0u8; msg.len()];
        s.read_exact(&mut got)?;
        Ok(got)
    }

    /// A lost reply that switches the proxy to `Refuse` closes the other
    /// open connections too, as `set(Refuse)` does: the client cannot ask
    /// Redis about the outcome over a connection it already had.
    #[test]
    fn refuse_after_a_lost_reply_closes_every_connection() {
        let p = Proxy::start(echo());
        let mut other = connect(&p);
        assert_eq!(roundtrip(&mut other, b"open").unwrap(), b"open");
        let mut s = connect(&p);
        p.lose_reply_to_then(b"lose", Mode::Refuse);
        assert!(roundtrip(&mut s, b"lose").is_err(), "the reply came");
        assert_eq!(p.mode(), Mode::Refuse);
        assert!(
            roundtrip(&mut other, b"asks").is_err(),
            "an open connection still reached the server"
        );
    }

    /// The proxy and the echo server take their ports from the lane's
    /// range (`LOCK_TEST_PORTS`, else below the ephemeral range), as every
    /// server a test starts does, not from the kernel's ephemeral ports.
    #[test]
    fn ports_come_from_the_lane_s_range() {
        let Some((lo, hi)) = crate::server_ports() else {
            return;
        };
        let upstream = echo();
        let p = Proxy::start(upstream);
        for port in [upstream, p.port()] {
            assert!((lo..hi).contains(&port), "port {port} outside {lo}..{hi}");
        }
    }

    #[test]
    fn modes_do_what_they_say() {
        let p = Proxy::start(echo());
        let mut s = connect(&p);
        assert_eq!(roundtrip(&mut s, b"hello").unwrap(), b"hello");

        p.set(Mode::Delay(Duration::from_millis(150)));
        let t = std::time::Instant::now();
        assert_eq!(roundtrip(&mut s, b"slow").unwrap(), b"slow");
        // Delayed on the way there and on the way back.
        assert!(
            t.elapsed() >= Duration::from_millis(300),
            "{:?}",
            t.elapsed()
        );

        p.set(Mode::Blackhole);
        s.write_all(b"held").unwrap();
        s.set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        let mut b = [0u8; 4];
        assert!(s.read_exact(&mut b).is_err(), "a black hole answered");
        p.set(Mode::Pass);
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.read_exact(&mut b).unwrap();
        assert_eq!(
            &b, b"held",
            "bytes sent into the black hole arrive when it closes"
        );

        p.set(Mode::Drop);
        s.write_all(b"lost").unwrap();
        s.set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        assert!(s.read_exact(&mut b).is_err(), "dropped bytes arrived");
        p.set(Mode::Pass);
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        // The stream had a hole: the proxy closed it.
        assert!(matches!(s.read(&mut b), Ok(0) | Err(_)));
        let mut s = connect(&p);
        assert_eq!(roundtrip(&mut s, b"fresh").unwrap(), b"fresh");

        p.cut();
        assert!(
            matches!(s.read(&mut b), Ok(0) | Err(_)),
            "cut left the connection open"
        );
        p.set(Mode::Refuse);
        let mut r = connect(&p);
        assert!(
            matches!(r.read(&mut b), Ok(0) | Err(_)),
            "refused connection stayed open"
        );
        p.set(Mode::Pass);
        let mut s = connect(&p);
        assert_eq!(roundtrip(&mut s, b"again").unwrap(), b"again");
        let st = p.stats();
        assert!(
            st.cut >= 2 && st.refused >= 1 && st.bytes_dropped >= 4,
            "{st:?}"
        );
    }

    fn redis_conn(p: &Proxy) -> redis::Connection {
        let c = redis::Client::open(p.url()).unwrap();
        c.get_connection_with_timeout(Duration::from_secs(5))
            .unwrap()
    }

    fn incr(c: &mut redis::Connection, key: &str) -> redis::RedisResult<i64> {
        c.set_read_timeout(Some(Duration::from_secs(5)))?;
        redis::cmd("INCR").arg(key).query(c)
    }

    #[test]
    fn lost_reply_ran_on_redis_but_the_client_cannot_tell() {
        let server = crate::RedisServer::start();
        let p = Proxy::for_server(&server);
        let mut other = redis_conn(&p);
        p.lose_reply_to(b"INCR");
        assert!(p.armed());
        let mut c = redis_conn(&p);
        let r = incr(&mut c, "k");
        assert!(r.is_err(), "the reply got through: {r:?}");
        assert_eq!(server.cmd::<i64>(&["GET", "k"]), 1, "INCR did not run");
        assert_eq!(p.replies_lost(), 1);
        assert!(!p.armed());
        // The connection is gone for good.
        assert!(incr(&mut c, "k").is_err());
        // Fired once: other connections, newer or older, are served as usual.
        let mut c = redis_conn(&p);
        assert_eq!(incr(&mut c, "k").unwrap(), 2);
        assert_eq!(incr(&mut other, "k").unwrap(), 3);
        assert_eq!(p.stats().replies_lost, 1);
        assert_eq!(server.cmd::<i64>(&["GET", "k"]), 3);

        // Delayed, the matching request waits in the proxy's queue: the
        // loss waits for the reply that follows it, not one before.
        p.set(Mode::Delay(Duration::from_millis(100)));
        p.lose_reply_to(b"INCR");
        assert!(incr(&mut c, "k").is_err());
        assert_eq!(server.cmd::<i64>(&["GET", "k"]), 4);
        assert_eq!(p.replies_lost(), 2);
    }

    #[test]
    fn armed_pattern_that_never_comes_disturbs_nothing() {
        let server = crate::RedisServer::start();
        let p = Proxy::for_server(&server);
        p.lose_reply_to(b"NEVER-SENT");
        let mut c = redis_conn(&p);
        for i in 1..=5 {
            assert_eq!(incr(&mut c, "n").unwrap(), i);
        }
        let _: () = redis::cmd("SET").arg("s").arg("v").query(&mut c).unwrap();
        let v: String = redis::cmd("GET").arg("s").query(&mut c).unwrap();
        assert_eq!(v, "v");
        assert!(p.armed());
        assert_eq!(p.replies_lost(), 0);
        p.disarm();
        assert!(!p.armed());
        assert_eq!(incr(&mut c, "n").unwrap(), 6);
        assert_eq!(p.stats().replies_lost, 0);
    }

    #[test]
    fn one_slow_connection_leaves_the_others_fast() {
        let server = crate::RedisServer::start();
        let p = Proxy::for_server(&server);
        let mut fast = redis_conn(&p);
        let mut slow = redis_conn(&p);
        p.slow_connection_of(b"slow-key", Duration::ZERO, Duration::from_millis(400));
        let t = std::time::Instant::now();
        assert_eq!(incr(&mut slow, "slow-key").unwrap(), 1);
        assert!(
            t.elapsed() >= Duration::from_millis(400),
            "{:?}",
            t.elapsed()
        );
        // The command ran at once; only its reply was late.
        let t = std::time::Instant::now();
        assert_eq!(incr(&mut fast, "fast-key").unwrap(), 1);
        assert!(
            t.elapsed() < Duration::from_millis(400),
            "the other connection was slow too"
        );
        // Still slow until the spell ends.
        let t = std::time::Instant::now();
        assert_eq!(incr(&mut slow, "slow-key").unwrap(), 2);
        assert!(t.elapsed() >= Duration::from_millis(400));
        p.end_slow_spell();
        let t = std::time::Instant::now();
        assert_eq!(incr(&mut slow, "slow-key").unwrap(), 3);
        assert!(
            t.elapsed() < Duration::from_millis(400),
            "the spell did not end"
        );
        assert_eq!(p.stats().slowed, 1);
    }

    #[test]
    fn a_resent_command_runs_twice_and_its_copy_answers_nobody() {
        let server = crate::RedisServer::start();
        let p = Proxy::for_server(&server);
        let mut c = redis_conn(&p);
        p.resend(b"twice", Duration::from_millis(50));
        // Pipelined with another command: only the matching one is copied.
        let (a, b): (i64, i64) = redis::pipe()
            .cmd("INCR")
            .arg("once")
            .cmd("INCR")
            .arg("twice")
            .query(&mut c)
            .unwrap();
        assert_eq!((a, b), (1, 1));
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        assert!(
            rt.block_on(p.resent(1, Duration::from_secs(5))),
            "no copy ran"
        );
        assert_eq!(server.cmd::<i64>(&["GET", "twice"]), 2);
        assert_eq!(server.cmd::<i64>(&["GET", "once"]), 1);
        // The client's own connection saw nothing of the copy.
        assert_eq!(incr(&mut c, "once").unwrap(), 2);
        assert_eq!(p.stats().resent, 1);
    }

    #[test]
    fn spared_subscriptions_hear_messages_while_commands_are_cut() {
        let server = crate::RedisServer::start();
        let p = Proxy::for_server(&server);
        p.spare_pubsub();
        let client = redis::Client::open(p.url()).unwrap();
        let mut sub = client
            .get_connection_with_timeout(Duration::from_secs(5))
            .unwrap();
        let mut pubsub = sub.as_pubsub();
        pubsub.subscribe("chan").unwrap();
        pubsub
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let mut cmd = redis_conn(&p);
        p.set(Mode::Refuse);
        assert!(
            incr(&mut cmd, "k").is_err(),
            "a command connection survived Refuse"
        );
        let _: i64 = server.cmd(&["PUBLISH", "chan", "hello"]);
        let msg = pubsub.get_message().expect("the subscription was cut");
        assert_eq!(msg.get_payload::<String>().unwrap(), "hello");
        p.set(Mode::Pass);
    }

    #[test]
    fn replies_lost_at_random_ran_and_spare_subscriptions() {
        let server = crate::RedisServer::start();
        let p = Proxy::for_server(&server);
        p.spare_pubsub();
        // Every INCR (share 1): it runs, its reply is lost; other commands
        // pass.
        p.lose_replies(b"INCR", 1.0);
        for i in 1..=3 {
            let mut c = redis_conn(&p);
            assert!(incr(&mut c, "k").is_err(), "a reply got through");
            assert_eq!(server.cmd::<i64>(&["GET", "k"]), i, "INCR did not run");
            let v: Option<String> = redis::cmd("GET")
                .arg("k")
                .query(&mut redis_conn(&p))
                .unwrap();
            assert_eq!(v.as_deref(), Some(i.to_string().as_str()));
        }
        assert_eq!(p.replies_lost(), 3);
        // A subscription that matches is spared.
        p.lose_replies(b"SUBSCRIBE", 1.0);
        let client = redis::Client::open(p.url()).unwrap();
        let mut sub = client
            .get_connection_with_timeout(Duration::from_secs(5))
            .unwrap();
        let mut pubsub = sub.as_pubsub();
        pubsub.subscribe("chan").unwrap();
        pubsub
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let _: i64 = server.cmd(&["PUBLISH", "chan", "hello"]);
        let msg = pubsub.get_message().expect("the subscription lost a reply");
        assert_eq!(msg.get_payload::<String>().unwrap(), "hello");
        // Turned off: INCR answers again, and an armed one-shot loss still
        // fires once, with its follow-up.
        p.lose_replies(b"INCR", 0.0);
        let mut c = redis_conn(&p);
        assert_eq!(incr(&mut c, "k").unwrap(), 4);
        p.lose_reply_to_then(b"INCR", Mode::Refuse);
        assert!(incr(&mut c, "k").is_err());
        assert_eq!(p.mode(), Mode::Refuse);
        p.set(Mode::Pass);
        assert_eq!(p.replies_lost(), 4);
    }
}
