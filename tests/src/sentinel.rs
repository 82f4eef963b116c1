//! Redis Sentinel for tests: `redis-sentinel` processes watching a primary
//! started with [`RedisServer`], and replicas of it.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::{free_port, spawn_tied, RedisServer};

/// Failure detection and failover timing for a test deployment.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    /// `sentinel down-after-milliseconds`.
    pub down_after_ms: u64,
    /// `sentinel failover-timeout`: also how long Sentinel leaves a replica
    /// that follows another address alone, and twice the wait before a
    /// failed election is retried.
    pub failover_timeout_ms: u64,
}

impl Default for Timing {
    fn default() -> Self {
        Timing {
            down_after_ms: 1000,
            failover_timeout_ms: 5000,
        }
    }
}

/// One `redis-sentinel` process.
pub struct Sentinel {
    child: Option<Child>,
    port: u16,
    dir: PathBuf,
}

impl Sentinel {
    pub fn start(master: &str, primary_port: u16, timing: Timing) -> Sentinel {
        Self::start_with(master, primary_port, timing, "")
    }

    /// Like [`Sentinel::start`], with more lines for `sentinel.conf` (they
    /// go after `sentinel monitor`; a `requirepass` there makes this
    /// sentinel's own readiness check fail, so it is checked with `PING`
    /// answered by anything, `NOAUTH` included).
    pub fn start_with(master: &str, primary_port: u16, timing: Timing, extra: &str) -> Sentinel {
        let port = free_port();
        let dir =
            std::env::temp_dir().join(format!("lock-test-sentinel-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let conf = dir.join("sentinel.conf");
        std::fs::write(
            &conf,
            format!(
                "port {port}\nbind 127.0.0.1\ndir {dir}\n\
                 sentinel monitor {master} 127.0.0.1 {primary_port} 2\n\
                 sentinel down-after-milliseconds {master} {down}\n\
                 sentinel failover-timeout {master} {fo}\n\
                 sentinel parallel-syncs {master} 1\n{extra}\n",
                dir = dir.display(),
                down = timing.down_after_ms,
                fo = timing.failover_timeout_ms,
            ),
        )
        .expect("write sentinel.conf");
        let mut cmd = Command::new("redis-sentinel");
        cmd.arg(&conf).stdout(Stdio::null()).stderr(Stdio::null());
        // Where only the server is installed, it runs as a sentinel too.
        let child = spawn_tied(cmd)
            .or_else(|_| {
                let mut cmd = Command::new("redis-server");
                cmd.arg(&conf)
                    .arg("--sentinel")
                    .stdout(Stdio::null())
                    .stderr(Stdio::null());
                spawn_tied(cmd)
            })
            .expect("cannot start redis-sentinel (or redis-server --sentinel): install it or put it on PATH");
        let s = Sentinel {
            child: Some(child),
            port,
            dir,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while s
            .try_cmd::<String>(&["PING"])
            .is_err_and(|e| e.code() != Some("NOAUTH"))
        {
            assert!(
                Instant::now() < deadline,
                "redis-sentinel on {port} did not come up"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        s
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub fn try_cmd<T: redis::FromRedisValue>(&self, args: &[&str]) -> redis::RedisResult<T> {
        let mut conn =
            redis::Client::open(self.url())?.get_connection_with_timeout(Duration::from_secs(2))?;
        let mut c = redis::cmd(args[0]);
        for a in &args[1..] {
            c.arg(*a);
        }
        c.query(&mut conn)
    }
}

impl Drop for Sentinel {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Several sentinels watching one master name.
pub struct Sentinels {
    pub sentinels: Vec<Sentinel>,
    pub master: String,
}

impl Sentinels {
    pub fn start(n: usize, master: &str, primary: &RedisServer, timing: Timing) -> Sentinels {
        Self::start_at(n, master, primary.port(), timing)
    }

    /// Sentinels that know the primary by `port` (a proxy in front of it,
    /// which they then hand to clients).
    pub fn start_at(n: usize, master: &str, port: u16, timing: Timing) -> Sentinels {
        Sentinels {
            sentinels: (0..n)
                .map(|_| Sentinel::start(master, port, timing))
                .collect(),
            master: master.to_owned(),
        }
    }

    pub fn urls(&self) -> Vec<String> {
        self.sentinels.iter().map(Sentinel::url).collect()
    }

    /// The primary's port as the first answering sentinel reports it.
    pub fn primary_port(&self) -> Option<u16> {
        self.sentinels.iter().find_map(|s| {
            s.try_cmd::<Option<(String, u16)>>(&[
                "SENTINEL",
                "get-master-addr-by-name",
                &self.master,
            ])
            .ok()
            .flatten()
            .map(|(_, port)| port)
        })
    }

    /// Until every sentinel sees the others (a failover can be authorized)
    /// and knows `replicas` replicas.
    pub fn wait_ready(&self, replicas: usize, limit: Duration) {
        let deadline = Instant::now() + limit;
        loop {
            let ready = self.sentinels.iter().all(|s| {
                s.try_cmd::<String>(&["SENTINEL", "ckquorum", &self.master])
                    .is_ok()
                    && s.try_cmd::<Vec<redis::Value>>(&["SENTINEL", "replicas", &self.master])
                        .map(|r| r.len() >= replicas)
                        .unwrap_or(false)
                    && s.try_cmd::<Vec<redis::Value>>(&["SENTINEL", "sentinels", &self.master])
                        .map(|r| r.len() + 1 >= self.sentinels.len())
                        .unwrap_or(false)
            });
            if ready {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "sentinels not ready within {limit:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Until the sentinels name a primary other than `old`; its port.
    pub fn wait_failover(&self, old: u16, limit: Duration) -> u16 {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(port) = self.primary_port().filter(|p| *p != old) {
                return port;
            }
            assert!(Instant::now() < deadline, "no failover within {limit:?}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// A replica of `primary_port` (the primary's, or a proxy's in front of it).
pub fn start_replica(primary_port: u16) -> RedisServer {
    let port = primary_port.to_string();
    RedisServer::start_with(&[
        "--save",
        "",
        "--appendonly",
        "no",
        "--replicaof",
        "127.0.0.1",
        &port,
    ])
}

/// Until `primary` reports `n` replicas online and in sync.
pub fn wait_replicas_online(primary: &RedisServer, n: usize, limit: Duration) {
    let deadline = Instant::now() + limit;
    loop {
        let info: String = primary.cmd(&["INFO", "replication"]);
        let online = info
            .lines()
            .filter(|l| l.starts_with("slave") && l.contains("state=online"))
            .count();
        if online >= n {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "replicas not online within {limit:?}: {info}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}
