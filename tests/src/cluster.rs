//! Redis Cluster for tests: `redis-server --cluster-enabled yes` processes
//! joined with `redis-cli --cluster create`.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::RedisServer;

/// A cluster of real processes; stops when dropped.
pub struct Cluster {
    pub nodes: Vec<RedisServer>,
}

impl Cluster {
    /// `primaries` primaries with `replicas` replicas each, and the given
    /// `cluster-node-timeout` (how long before a silent primary is failed
    /// over).
    pub fn start(primaries: usize, replicas: usize, node_timeout_ms: u64) -> Cluster {
        let timeout = node_timeout_ms.to_string();
        let nodes: Vec<RedisServer> = (0..primaries * (1 + replicas))
            .map(|_| {
                RedisServer::start_with(&[
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                    "--cluster-enabled",
                    "yes",
                    "--cluster-node-timeout",
                    &timeout,
                ])
            })
            .collect();
        let mut cmd = Command::new("redis-cli");
        cmd.arg("--cluster").arg("create");
        for n in &nodes {
            cmd.arg(format!("127.0.0.1:{}", n.port()));
        }
        cmd.args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let out = cmd.output().expect("cannot run redis-cli --cluster create");
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let cluster = Cluster { nodes };
        cluster.wait_ok(None, Duration::from_secs(20));
        cluster.wait_replicas_online(primaries * replicas, Duration::from_secs(20));
        cluster
    }

    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// Ports of the nodes that are primaries owning slots, as `node`
    /// sees it.
    pub fn primaries_seen_by(&self, node: usize) -> Vec<u16> {
        let text: String = self.nodes[node].cmd(&["CLUSTER", "NODES"]);
        text.lines()
            .filter(|l| {
                let f: Vec<&str> = l.split(' ').collect();
                f.len() > 8 && f[2].contains("master") && !f[2].contains("fail")
            })
            .filter_map(|l| {
                let addr = l.split(' ').nth(1)?;
                addr.split('@').next()?.rsplit(':').next()?.parse().ok()
            })
            .collect()
    }

    /// Index of the node listening on `port`.
    pub fn index_of(&self, port: u16) -> usize {
        self.nodes
            .iter()
            .position(|n| n.port() == port)
            .expect("no such node")
    }

    /// Until every node (but `skip`) reports `cluster_state:ok` with all
    /// slots served.
    pub fn wait_ok(&self, skip: Option<usize>, limit: Duration) {
        let deadline = Instant::now() + limit;
        loop {
            let ok = self.nodes.iter().enumerate().all(|(i, n)| {
                if Some(i) == skip {
                    return true;
                }
                let info: String = n.cmd(&["CLUSTER", "INFO"]);
                info.contains("cluster_state:ok") && info.contains("cluster_slots_ok:16384")
            });
            if ok {
                return;
            }
            assert!(Instant::now() < deadline, "cluster not ok within {limit:?}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn wait_replicas_online(&self, n: usize, limit: Duration) {
        let deadline = Instant::now() + limit;
        loop {
            let online: usize = self
                .nodes
                .iter()
                .map(|node| {
                    let info: String = node.cmd(&["INFO", "replication"]);
                    info.lines()
                        .filter(|l| l.starts_with("slave") && l.contains("state=online"))
                        .count()
                })
                .sum();
            if online >= n {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "replicas not online within {limit:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}
