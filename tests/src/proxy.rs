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
//! [`Proxy::cut`] closes every open connection once and leaves the mode as
//! it is. [`Proxy::lose_reply_to`] arms a one-shot reply loss: the next
//! command matching a pattern runs on Redis, but its reply is thrown away
//! and the connection closed, so the client cannot know the outcome.
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
    /// The mode to switch to when the armed loss fires.
    then: Mutex<Option<Mode>>,
    lost: AtomicU64,
}

impl Shared {
    /// Whether `chunk` fires the armed reply loss; disarms it if so, so
    /// only one connection fires per arming.
    fn take_loss(&self, chunk: &[u8]) -> bool {
        let mut armed = self.lose.lock().unwrap();
        let hit = match armed.as_deref() {
            None => false,
            Some([]) => true,
            Some(p) => chunk.windows(p.len()).any(|w| w == p),
        };
        if hit {
            *armed = None;
        }
        hit
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
    /// Forward a free local port to `127.0.0.1:upstream`, in [`Mode::Pass`].
    pub fn start(upstream: u16) -> Proxy {
        let listener = StdListener::bind("127.0.0.1:0").expect("proxy: bind");
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
            lost: AtomicU64::new(0),
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
        self.shared.mode.send_replace(mode);
        if mode == Mode::Refuse {
            self.cut();
        }
    }

    pub fn mode(&self) -> Mode {
        *self.shared.mode.borrow()
    }

    /// Close every open connection now (clients see the peer hang up).
    pub fn cut(&self) {
        self.shared.cut.fetch_add(1, Ordering::Relaxed);
        self.shared.cuts.send_modify(|n| *n += 1);
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
    /// switches to `mode` (`Mode::Refuse`: the client cannot reconnect to
    /// learn the outcome either).
    pub fn lose_reply_to_then(&self, pattern: &[u8], mode: Mode) {
        *self.shared.then.lock().unwrap() = Some(mode);
        self.lose_reply_to(pattern);
    }

    /// Disarm without firing.
    pub fn disarm(&self) {
        *self.shared.lose.lock().unwrap() = None;
        *self.shared.then.lock().unwrap() = None;
    }

    /// Whether an armed loss is still waiting for its command.
    pub fn armed(&self) -> bool {
        self.shared.lose.lock().unwrap().is_some()
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
    /// Notified when a reply was lost: the connection closes at once.
    closed: Notify,
}

impl Conn {
    /// Whether `chunk`, about to be forwarded to Redis, fires the armed
    /// reply loss; one pending loss per connection at most.
    fn fires(&self, shared: &Shared, chunk: &[u8]) -> bool {
        if self.loss.load(Ordering::SeqCst) != LOSS_NONE || !shared.take_loss(chunk) {
            return false;
        }
        self.loss.store(LOSS_QUEUED, Ordering::SeqCst);
        true
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
        closed: Notify::new(),
    });
    tokio::select! {
        _ = pipe(cr, uw, shared.clone(), conn.clone(), Dir::ToRedis) => {}
        _ = pipe(ur, cw, shared.clone(), conn.clone(), Dir::ToClient) => {}
        _ = conn.closed.notified() => {}
        _ = cuts.changed() => {}
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
        loop {
            // A black hole reads nothing: the bytes wait in the kernel.
            let mode = match mode_rx.wait_for(|m| *m != Mode::Blackhole).await {
                Ok(m) => *m,
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
            let mut mode = *mode_rx.borrow_and_update();
            if mode == Mode::Blackhole {
                // Read just as the hole opened: hold the chunk until it closes.
                mode = match mode_rx.wait_for(|m| *m != Mode::Blackhole).await {
                    Ok(m) => *m,
                    Err(_) => return,
                };
            }
            if dir == Dir::ToClient && conn.loss.load(Ordering::SeqCst) == LOSS_SENT {
                // Redis answered the matching request: lose the answer and
                // hang up both ways.
                shared.lost.fetch_add(1, Ordering::Relaxed);
                if let Some(next) = shared.then.lock().unwrap().take() {
                    shared.mode.send_replace(next);
                }
                conn.closed.notify_one();
                return;
            }
            let chunk = buf[..n].to_vec();
            match mode {
                Mode::Pass | Mode::Refuse | Mode::Blackhole => {
                    let fires = dir == Dir::ToRedis && conn.fires(&shared, &chunk);
                    let _ = tx.send((Instant::now(), chunk, fires));
                }
                Mode::Delay(d) => {
                    let fires = dir == Dir::ToRedis && conn.fires(&shared, &chunk);
                    let _ = tx.send((Instant::now() + d, chunk, fires));
                }
                Mode::Drop => {
                    conn.poisoned.store(true, Ordering::Relaxed);
                    shared.dropped.fetch_add(n as u64, Ordering::Relaxed);
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
        let l = StdListener::bind("127.0.0.1:0").unwrap();
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
}
