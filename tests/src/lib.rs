//! Test harness: real `redis-server` processes on free ports, which tests
//! can kill, pause, resume and restart (and `postgres` ones: [`postgres`]).

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub mod cluster;
pub mod fenced;
pub mod global;
pub mod history;
pub mod operations;
pub mod postgres;
pub mod proxy;
pub mod read_write;
pub mod reply_loss;
pub mod scripts;
pub mod semantics;
pub mod semaphores;
pub mod sentinel;
pub mod tls;

/// A `redis-server` owned by one test (or one test binary).
pub struct RedisServer {
    child: Option<Child>,
    port: u16,
    dir: PathBuf,
    extra: Vec<String>,
}

/// Spawn a child that dies with this test process, even if the test
/// aborts: children are started from one thread that lives as long as the
/// process, with the parent-death signal set.
pub fn spawn_tied(mut cmd: Command) -> std::io::Result<Child> {
    use std::os::unix::process::CommandExt;
    use std::sync::mpsc;
    use std::sync::{Mutex, OnceLock};
    type Job = (Command, mpsc::Sender<std::io::Result<Child>>);
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<Job>>> = OnceLock::new();
    let spawner = SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Job>();
        std::thread::spawn(move || {
            for (mut cmd, reply) in rx {
                // SAFETY: prctl is async-signal-safe and touches no memory.
                unsafe {
                    cmd.pre_exec(|| {
                        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                        Ok(())
                    });
                }
                let _ = reply.send(cmd.spawn());
            }
        });
        Mutex::new(tx)
    });
    let (tx, rx) = mpsc::channel();
    let _ = &mut cmd;
    spawner
        .lock()
        .unwrap()
        .send((cmd, tx))
        .expect("spawner thread");
    rx.recv().expect("spawner thread")
}

/// The server the tests run against: `LOCK_TEST_SERVER` (a binary name or
/// path, e.g. `valkey-server`), else `redis-server`.
pub fn server_binary() -> String {
    std::env::var("LOCK_TEST_SERVER").unwrap_or_else(|_| "redis-server".into())
}

/// A port nobody listens on right now, for a server a test starts (or one
/// it wants down). Taken below the kernel's ephemeral range: a port from
/// that range can become the source port of any outgoing connection
/// between this pick and the server's bind, or while a restarted server is
/// down. Picks of one process step through the range from a random start,
/// so two never meet.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::OnceLock;
    static START: OnceLock<u32> = OnceLock::new();
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let Some((lo, hi)) = server_ports() else {
        return TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("no free port");
    };
    let span = u32::from(hi - lo);
    let start = *START.get_or_init(|| fastrand::u32(..span));
    for _ in 0..span {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = lo + ((start + n) % span) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port in {lo}..{hi}");
}

/// Ports for test servers: from 10000 up to the kernel's ephemeral range
/// (`ip_local_port_range`), when at least 2000 fit there; or the range
/// `LOCK_TEST_PORTS` names (`lo-hi`), which `scripts/test.sh` gives each
/// test binary it runs side by side with others, so that no two processes
/// pick the same port (the picks of one process never meet, see
/// [`free_port`], but another process knows nothing of them).
fn server_ports() -> Option<(u16, u16)> {
    const LOW: u16 = 10_000;
    if let Ok(range) = std::env::var("LOCK_TEST_PORTS") {
        return Some(port_range(&range).unwrap_or_else(|| {
            panic!("LOCK_TEST_PORTS={range:?}: expected `lo-hi`, e.g. 10000-15000")
        }));
    }
    let range = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").ok()?;
    let ephemeral: u16 = range.split_whitespace().next()?.parse().ok()?;
    (ephemeral >= LOW + 2_000).then_some((LOW, ephemeral))
}

impl RedisServer {
    /// Start a server with no persistence.
    pub fn start() -> Self {
        Self::start_with(&["--save", "", "--appendonly", "no"])
    }

    /// Start a server with extra `redis-server` arguments.
    pub fn start_with(extra: &[&str]) -> Self {
        Self::start_on(free_port(), extra)
    }

    /// Like [`RedisServer::start_with`], on a port chosen beforehand (for
    /// something that must know it first, such as a proxy in front).
    pub fn start_on(port: u16, extra: &[&str]) -> Self {
        let dir = std::env::temp_dir().join(format!("lock-test-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let mut server = RedisServer {
            child: None,
            port,
            dir,
            extra: extra.iter().map(|s| s.to_string()).collect(),
        };
        server.spawn();
        server
    }

    fn spawn(&mut self) {
        let mut cmd = Command::new(server_binary());
        cmd.args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .arg("--dir")
            .arg(&self.dir)
            .args(&self.extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let child = spawn_tied(cmd).expect(
            "cannot start the test server (redis-server, or LOCK_TEST_SERVER): install it (scripts/test.sh does) or put it on PATH",
        );
        self.child = Some(child);
        self.wait_ready();
    }

    fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(mut c) = redis::Client::open(self.url()).and_then(|c| c.get_connection()) {
                match redis::cmd("PING").query::<String>(&mut c) {
                    Ok(_) => return,
                    // Up, but wants a password.
                    Err(e) if e.code() == Some("NOAUTH") => return,
                    Err(_) => {}
                }
            }
            assert!(
                Instant::now() < deadline,
                "redis-server on port {} did not come up",
                self.port
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// `GET key`, or `None` if the key is missing or this server will not
    /// answer for it (a cluster node that does not own its slot).
    pub fn try_get(&self, key: &str) -> Option<String> {
        redis::cmd("GET")
            .arg(key)
            .query::<Option<String>>(&mut self.conn())
            .ok()
            .flatten()
    }

    /// The owner id in the lock `name` (which holds `"<owner> <token>"`), or
    /// `None` if there is no lock there.
    pub fn owner_of(&self, name: &str) -> Option<String> {
        self.try_get(name).map(|v| owner_in(&v).to_owned())
    }

    /// A plain connection for looking at what Redis holds.
    pub fn conn(&self) -> redis::Connection {
        redis::Client::open(self.url())
            .and_then(|c| c.get_connection_with_timeout(Duration::from_secs(5)))
            .expect("connect to test redis")
    }

    /// Run one command and return its reply.
    pub fn cmd<T: redis::FromRedisValue>(&self, args: &[&str]) -> T {
        let mut c = redis::cmd(args[0]);
        for a in &args[1..] {
            c.arg(*a);
        }
        c.query(&mut self.conn())
            .unwrap_or_else(|e| panic!("{args:?}: {e}"))
    }

    pub fn exists(&self, key: &str) -> bool {
        self.cmd::<i64>(&["EXISTS", key]) == 1
    }

    /// Keys matching a pattern.
    pub fn keys(&self, pattern: &str) -> Vec<String> {
        self.cmd(&["KEYS", pattern])
    }

    /// How many times a command has run since the last `CONFIG RESETSTAT`.
    pub fn calls(&self, command: &str) -> u64 {
        let info: String = self.cmd(&["INFO", "commandstats"]);
        let prefix = format!("cmdstat_{}:calls=", command.to_lowercase());
        info.lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .and_then(|rest| rest.split(',').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    }

    /// Every command run since the last `CONFIG RESETSTAT`, scripts' inner
    /// calls included, less the `INFO` that reads the figure and the
    /// `CLIENT SETINFO` of the reading connections (Valkey and Redis 7.2+
    /// count them; Redis 7.0 refuses them).
    pub fn all_calls(&self) -> u64 {
        let info: String = self.cmd(&["INFO", "commandstats"]);
        info.lines()
            .filter_map(|l| l.strip_prefix("cmdstat_"))
            .filter(|l| {
                !l.starts_with("info:")
                    && !l.starts_with("config|resetstat:")
                    && !l.starts_with("client|setinfo:")
            })
            .filter_map(|l| l.split("calls=").nth(1))
            .filter_map(|rest| rest.split(',').next())
            .filter_map(|n| n.parse::<u64>().ok())
            .sum()
    }

    pub fn reset_stats(&self) {
        let _: String = self.cmd(&["CONFIG", "RESETSTAT"]);
    }

    fn signal(&self, sig: &str) {
        let pid = self.child.as_ref().expect("server not running").id();
        let ok = Command::new("kill")
            .args([sig, &pid.to_string()])
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        assert!(ok, "kill {sig} {pid} failed");
    }

    /// SIGKILL the server.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGSTOP: the server stops answering but keeps its sockets.
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// SIGCONT after `pause`.
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    /// Start again on the same port and data directory.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if let Some(child) = &self.child {
            // A paused server must be resumed to die cleanly.
            let _ = Command::new("kill")
                .args(["-CONT", &child.id().to_string()])
                .status();
        }
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The owner id in a lock's value, `"<owner>"` or `"<owner> <mark>"`.
pub fn owner_in(value: &str) -> &str {
    value.split(' ').next().unwrap_or_default()
}

/// Wait for a condition that should become true soon; false on time-out.
pub async fn eventually(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A key no other test uses.
pub fn unique(prefix: &str) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    format!(
        "{prefix}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// `"lo-hi"` as a range of at least 500 ports.
fn port_range(range: &str) -> Option<(u16, u16)> {
    let (lo, hi) = range.split_once('-')?;
    let (lo, hi): (u16, u16) = (lo.trim().parse().ok()?, hi.trim().parse().ok()?);
    (lo >= 1024 && hi >= lo.saturating_add(500)).then_some((lo, hi))
}

/// Log to the test output when `RUST_LOG` is set.
pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_ports_stay_out_of_the_ephemeral_range_and_apart() {
        let Some((_, ephemeral)) = server_ports() else {
            return;
        };
        let ports: Vec<u16> = (0..500).map(|_| free_port()).collect();
        assert!(ports.iter().all(|&p| p < ephemeral), "{ports:?}");
        let distinct: std::collections::HashSet<u16> = ports.iter().copied().collect();
        assert_eq!(distinct.len(), ports.len());
    }

    #[test]
    fn lock_test_ports_names_a_range() {
        assert_eq!(port_range("10000-15000"), Some((10000, 15000)));
        assert_eq!(port_range(" 20000 - 20500"), Some((20000, 20500)));
        assert_eq!(port_range("15000-10000"), None);
        assert_eq!(port_range("10000-10100"), None, "too few for one binary");
        assert_eq!(port_range("80-2000"), None);
        assert_eq!(port_range("10000"), None);
    }
}
