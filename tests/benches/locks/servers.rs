//! The servers a case compares: the bench's main server (`LOCK_TEST_SERVER`,
//! default `redis-server`) and one of the other kind (Valkey next to Redis,
//! Redis next to Valkey), started by the bench in the same run; and what
//! `INFO` says about either.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tests::{free_port, server_binary, spawn_tied};

/// `Redis 7.0.15` / `Valkey 9.1.2`, from `INFO server`.
pub fn describe(conn: &mut redis::Connection) -> String {
    let info: String = redis::cmd("INFO")
        .arg("server")
        .query(conn)
        .unwrap_or_default();
    let field = |name: &str| {
        info.lines()
            .find_map(|l| l.strip_prefix(name))
            .map(|v| v.trim().to_owned())
    };
    match field("valkey_version:") {
        Some(v) => format!("Valkey {v}"),
        None => format!(
            "Redis {}",
            field("redis_version:").unwrap_or_else(|| "?".into())
        ),
    }
}

/// The binary of the other kind of server than `server_binary()`.
pub fn other_binary() -> &'static str {
    if server_binary().contains("valkey") {
        "redis-server"
    } else {
        "valkey-server"
    }
}

/// A server of the other kind, with no persistence, killed with the bench.
pub struct OtherServer {
    child: Child,
    port: u16,
    dir: PathBuf,
    /// `Valkey 9.1.2`.
    pub describe: String,
}

impl OtherServer {
    /// Start it, or say why not.
    pub fn start() -> Result<OtherServer, String> {
        let binary = other_binary();
        let port = free_port();
        let dir = std::env::temp_dir().join(format!("lockbench-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        let mut cmd = Command::new(binary);
        cmd.args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .arg("--dir")
            .arg(&dir)
            .args(["--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let child = spawn_tied(cmd).map_err(|e| format!("cannot start {binary}: {e}"))?;
        let mut server = OtherServer {
            child,
            port,
            dir,
            describe: String::new(),
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(mut c) = redis::Client::open(server.url()).and_then(|c| c.get_connection()) {
                if redis::cmd("PING").query::<String>(&mut c).is_ok() {
                    server.describe = describe(&mut c);
                    return Ok(server);
                }
            }
            if Instant::now() >= deadline {
                return Err(format!("{binary} on port {port} did not come up"));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }
}

impl Drop for OtherServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A plain connection to the server on `port`.
pub fn conn(port: u16) -> redis::Connection {
    redis::Client::open(format!("redis://127.0.0.1:{port}"))
        .and_then(|c| c.get_connection_with_timeout(Duration::from_secs(5)))
        .expect("connect to the bench's server")
}

/// `field:value` lines of one `INFO` section.
fn info_field(conn: &mut redis::Connection, section: &str, field: &str) -> Option<String> {
    let info: String = redis::cmd("INFO").arg(section).query(conn).ok()?;
    let prefix = format!("{field}:");
    info.lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .map(|v| v.trim().to_owned())
}

/// Seconds of CPU the server process has used (`INFO cpu`: user + system,
/// all its threads).
pub fn server_cpu(conn: &mut redis::Connection) -> f64 {
    let info: String = redis::cmd("INFO")
        .arg("cpu")
        .query(conn)
        .unwrap_or_default();
    info.lines()
        .filter_map(|l| {
            l.strip_prefix("used_cpu_user:")
                .or_else(|| l.strip_prefix("used_cpu_sys:"))
        })
        .filter_map(|v| v.trim().parse::<f64>().ok())
        .sum()
}

/// `(total_reads_processed, total_writes_processed)`: the server's socket
/// reads and writes (`INFO stats`), which a client that sends many commands
/// at once makes fewer per command.
pub fn io_calls(conn: &mut redis::Connection) -> (u64, u64) {
    let info: String = redis::cmd("INFO")
        .arg("stats")
        .query(conn)
        .unwrap_or_default();
    let get = |name: &str| {
        info.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    };
    (
        get("total_reads_processed:"),
        get("total_writes_processed:"),
    )
}

/// `used_memory` in bytes.
pub fn used_memory(conn: &mut redis::Connection) -> i64 {
    info_field(conn, "memory", "used_memory")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// `(keys, keys with a TTL)` in db 0 (`INFO keyspace`).
pub fn keyspace(conn: &mut redis::Connection) -> (u64, u64) {
    let Some(db0) = info_field(conn, "keyspace", "db0") else {
        return (0, 0);
    };
    // keys=100000,expires=0,avg_ttl=0
    let get = |name: &str| {
        db0.split(',')
            .find_map(|kv| kv.strip_prefix(name))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    (get("keys="), get("expires="))
}

pub fn flushall(conn: &mut redis::Connection) {
    let _: () = redis::cmd("FLUSHALL").query(conn).expect("FLUSHALL");
}
