//! Watching hand-offs from outside the runtime: when the server published
//! each grant (`MONITOR`: the release script's `PUBLISH`), and when a
//! subscriber of the bench's own, listening on the same grant channels as
//! the waiters' clients, read it off its socket.
//!
//! The bench subscribes only to channels a waiter's client already listens
//! on (found with `PUBSUB CHANNELS`), so that the release, which counts a
//! grant as heard when its `PUBLISH` reaches anyone, never takes the bench's
//! subscriber for a waiter's.

use std::collections::{HashMap, HashSet};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::monitor::parse_line;

/// Nanoseconds since the Unix epoch: the clock the server's `MONITOR`
/// stamps use (same machine).
pub fn wall_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// Grants by the owner id they name (a grant message starts with it).
pub type Seen = HashMap<String, u64>;

pub struct GrantTap {
    stop: Arc<AtomicBool>,
    subscriber: JoinHandle<std::io::Result<Seen>>,
    poller: JoinHandle<()>,
    monitor: Option<JoinHandle<std::io::Result<Seen>>>,
}

/// What the tap saw: when each grant was published (empty without
/// `MONITOR`), and read.
pub struct Taps {
    pub published: Seen,
    pub heard: Seen,
}

fn owner_of(message: &[u8]) -> String {
    let text = String::from_utf8_lossy(message);
    text.split(' ').next().unwrap_or_default().to_owned()
}

fn connect(port: u16) -> std::io::Result<TcpStream> {
    let s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_nodelay(true)?;
    s.set_read_timeout(Some(Duration::from_millis(50)))?;
    Ok(s)
}

fn resp_command(args: &[&str]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        out.extend_from_slice(format!("${}\r\n{a}\r\n", a.len()).as_bytes());
    }
    out
}

/// One RESP2 value at the start of `buf`: `Some((value, bytes used))`, or
/// `None` while incomplete.
enum Resp {
    Bulk(Vec<u8>),
    Other,
    Array(Vec<Resp>),
}

fn parse(buf: &[u8]) -> Option<(Resp, usize)> {
    let end = buf.windows(2).position(|w| w == b"\r\n")?;
    let head = std::str::from_utf8(&buf[1..end]).ok()?;
    match buf.first()? {
        b'$' => {
            let len: i64 = head.parse().ok()?;
            if len < 0 {
                return Some((Resp::Other, end + 2));
            }
            let start = end + 2;
            let stop = start + len as usize;
            if buf.len() < stop + 2 {
                return None;
            }
            Some((Resp::Bulk(buf[start..stop].to_vec()), stop + 2))
        }
        b'*' => {
            let n: i64 = head.parse().ok()?;
            let mut used = end + 2;
            let mut items = Vec::new();
            for _ in 0..n.max(0) {
                let (v, u) = parse(&buf[used..])?;
                items.push(v);
                used += u;
            }
            Some((Resp::Array(items), used))
        }
        _ => Some((Resp::Other, end + 2)),
    }
}

/// Read `stream` until `stop`, handing each chunk and the time it arrived
/// to `on_chunk`, which consumes what it can from the front of the buffer.
fn pump(
    mut stream: TcpStream,
    stop: &AtomicBool,
    mut on_chunk: impl FnMut(&mut Vec<u8>, u64),
) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(1 << 16);
    let mut chunk = vec![0u8; 1 << 16];
    while !stop.load(Ordering::Relaxed) {
        match stream.read(&mut chunk) {
            Ok(0) => return Err(std::io::Error::other("connection closed")),
            Ok(n) => {
                let at = wall_ns();
                buf.extend_from_slice(&chunk[..n]);
                on_chunk(&mut buf, at);
            }
            Err(e)
                if e.kind() == std::io::ErrorKind::WouldBlock
                    || e.kind() == std::io::ErrorKind::TimedOut => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

impl GrantTap {
    /// Watch the grants published on channels starting with `prefix`
    /// (`lock:{key}:granted:`) with a subscriber, and with `MONITOR` if
    /// `monitor`.
    pub fn start(port: u16, prefix: &str, monitor: bool) -> std::io::Result<GrantTap> {
        let stop = Arc::new(AtomicBool::new(false));
        let monitor = if !monitor {
            None
        } else {
            let mut mon = connect(port)?;
            mon.write_all(b"MONITOR\r\n")?;
            let (stop, prefix) = (stop.clone(), prefix.to_owned());
            let handle = std::thread::Builder::new()
                .name("bench-monitor".into())
                .spawn(move || {
                    let mut seen = Seen::new();
                    pump(mon, &stop, |buf, _| {
                        let mut used = 0;
                        while let Some(nl) = buf[used..].iter().position(|&b| b == b'\n') {
                            let line = String::from_utf8_lossy(&buf[used..used + nl]);
                            if let Some(l) = parse_line(&line) {
                                let publish = matches!(
                                    l.args.first().map(|a| a.to_lowercase()).as_deref(),
                                    Some("publish" | "spublish")
                                );
                                if publish && l.args.len() == 3 && l.args[1].starts_with(&prefix) {
                                    seen.insert(owner_of(l.args[2].as_bytes()), l.at_ns);
                                }
                            }
                            used += nl + 1;
                        }
                        buf.drain(..used);
                    })?;
                    Ok(seen)
                })?;
            Some(handle)
        };

        let sub = connect(port)?;
        let mut sub_writer = sub.try_clone()?;
        let subscriber = {
            let stop = stop.clone();
            std::thread::Builder::new()
                .name("bench-subscriber".into())
                .spawn(move || {
                    let mut seen = Seen::new();
                    pump(sub, &stop, |buf, at| {
                        let mut used = 0;
                        while let Some((v, n)) = parse(&buf[used..]) {
                            if let Resp::Array(items) = v {
                                if let [Resp::Bulk(kind), _, Resp::Bulk(message)] = &items[..] {
                                    if kind == b"message" || kind == b"smessage" {
                                        seen.insert(owner_of(message), at);
                                    }
                                }
                            }
                            used += n;
                        }
                        buf.drain(..used);
                    })?;
                    Ok(seen)
                })?
        };

        let poller = {
            let (stop, pattern) = (stop.clone(), format!("{prefix}*"));
            let mut admin = crate::servers::conn(port);
            std::thread::Builder::new()
                .name("bench-pubsub-poll".into())
                .spawn(move || {
                    let mut joined = HashSet::new();
                    while !stop.load(Ordering::Relaxed) {
                        let channels: Vec<String> = redis::cmd("PUBSUB")
                            .arg("CHANNELS")
                            .arg(&pattern)
                            .query(&mut admin)
                            .unwrap_or_default();
                        for c in channels {
                            if joined.insert(c.clone()) {
                                let _ = sub_writer.write_all(&resp_command(&["SUBSCRIBE", &c]));
                            }
                        }
                        std::thread::sleep(Duration::from_millis(20));
                    }
                })?
        };
        Ok(GrantTap {
            stop,
            subscriber,
            poller,
            monitor,
        })
    }

    pub fn finish(self) -> std::io::Result<Taps> {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.poller.join();
        let join = |h: JoinHandle<std::io::Result<Seen>>| {
            h.join()
                .unwrap_or_else(|_| Err(std::io::Error::other("tap thread panicked")))
        };
        let heard = join(self.subscriber)?;
        let published = match self.monitor {
            Some(m) => join(m)?,
            None => Seen::new(),
        };
        Ok(Taps { published, heard })
    }
}
