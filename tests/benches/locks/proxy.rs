//! A small TCP proxy in front of a Redis server: adds a fixed one-way delay
//! in each direction (case 5) and counts request bursts (case 6).
//!
//! Plain threads, not tokio: `thread::sleep` wakes within tens of
//! microseconds of its deadline, while tokio timers round up to the next
//! millisecond, which would turn "1 ms" into 1–2 ms.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

/// A client→server write that follows a silence of at least this long
/// starts a new burst.
const BURST_GAP: Duration = Duration::from_millis(100);

#[derive(Default)]
struct Bursts {
    count: AtomicU64,
    last: Mutex<Option<Instant>>,
}

impl Bursts {
    fn hit(&self) {
        let now = Instant::now();
        let mut last = self.last.lock().unwrap();
        let quiet = match *last {
            Some(l) => now.duration_since(l) >= BURST_GAP,
            None => true,
        };
        if quiet {
            self.count.fetch_add(1, Ordering::Relaxed);
        }
        *last = Some(now);
    }
}

pub struct Proxy {
    pub port: u16,
    bursts: Arc<Bursts>,
}

impl Proxy {
    /// Forward 127.0.0.1:<new port> to 127.0.0.1:`upstream`, delaying every
    /// chunk by `one_way` in each direction (chunks keep their order and do
    /// not wait for each other: the delay is latency, not a bandwidth cap).
    pub fn start(upstream: u16, one_way: Duration) -> std::io::Result<Proxy> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let port = listener.local_addr()?.port();
        let bursts = Arc::new(Bursts::default());
        let b = bursts.clone();
        std::thread::Builder::new()
            .name("bench-proxy".into())
            .spawn(move || {
                for client in listener.incoming() {
                    let Ok(client) = client else { continue };
                    let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)) else {
                        let _ = client.shutdown(Shutdown::Both);
                        continue;
                    };
                    let _ = client.set_nodelay(true);
                    let _ = server.set_nodelay(true);
                    let (c2, s2) = (client.try_clone(), server.try_clone());
                    let (Ok(c2), Ok(s2)) = (c2, s2) else { continue };
                    pipe(client, s2, one_way, Some(b.clone()));
                    pipe(server, c2, one_way, None);
                }
            })?;
        Ok(Proxy { port, bursts })
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Client→server bursts since the proxy started.
    pub fn bursts(&self) -> u64 {
        self.bursts.count.load(Ordering::Relaxed)
    }
}

/// Copy `from` → `to`, `delay` late.
fn pipe(mut from: TcpStream, mut to: TcpStream, delay: Duration, bursts: Option<Arc<Bursts>>) {
    let spawn = |name: &str, f: Box<dyn FnOnce() + Send>| {
        let _ = std::thread::Builder::new()
            .name(name.into())
            .stack_size(64 * 1024)
            .spawn(f);
    };
    if delay.is_zero() {
        spawn(
            "bench-proxy-io",
            Box::new(move || {
                let mut buf = vec![0u8; 64 * 1024];
                loop {
                    match from.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => {
                            if let Some(b) = &bursts {
                                b.hit();
                            }
                            if to.write_all(&buf[..n]).is_err() {
                                break;
                            }
                        }
                    }
                }
                let _ = to.shutdown(Shutdown::Write);
                let _ = from.shutdown(Shutdown::Read);
            }),
        );
        return;
    }
    let (tx, rx) = mpsc::channel::<(Instant, Vec<u8>)>();
    spawn(
        "bench-proxy-rd",
        Box::new(move || {
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                match from.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        if let Some(b) = &bursts {
                            b.hit();
                        }
                        if tx
                            .send((Instant::now() + delay, buf[..n].to_vec()))
                            .is_err()
                        {
                            break;
                        }
                    }
                }
            }
        }),
    );
    spawn(
        "bench-proxy-wr",
        Box::new(move || {
            for (due, data) in rx {
                let now = Instant::now();
                if due > now {
                    std::thread::sleep(due - now);
                }
                if to.write_all(&data).is_err() {
                    break;
                }
            }
            let _ = to.shutdown(Shutdown::Write);
        }),
    );
}
