//! Redis Cluster for tests: `redis-server --cluster-enabled yes` processes
//! joined with `redis-cli --cluster create`, optionally each behind a
//! [`Proxy`] that clients go through.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::proxy::Proxy;
use crate::RedisServer;

/// A cluster of real processes; stops when dropped.
pub struct Cluster {
    pub nodes: Vec<RedisServer>,
    /// The port each node announces to clients: its own, or its proxy's.
    announced: Vec<u16>,
}

/// One cluster node on `port`, announcing `announce` as its client port if
/// given.
fn start_node(port: u16, announce: Option<u16>, node_timeout_ms: u64) -> RedisServer {
    // The bus port is picked like any other rather than left at port +
    // 10000, which `free_port` does not keep free (and which passes 65535
    // for high ports, where Redis refuses to start).
    let bus = std::iter::repeat_with(crate::free_port)
        .find(|&b| b != port)
        .unwrap()
        .to_string();
    let timeout = node_timeout_ms.to_string();
    let mut args = vec![
        "--save",
        "",
        "--appendonly",
        "no",
        "--cluster-enabled",
        "yes",
        "--cluster-node-timeout",
        &timeout,
        "--cluster-port",
        &bus,
    ];
    let announce = announce.map(|p| p.to_string());
    if let Some(p) = &announce {
        args.extend([
            "--cluster-announce-port",
            p,
            "--cluster-announce-bus-port",
            &bus,
        ]);
    }
    RedisServer::start_on(port, &args)
}

impl Cluster {
    /// `primaries` primaries with `replicas` replicas each, and the given
    /// `cluster-node-timeout` (how long before a silent primary is failed
    /// over).
    pub fn start(primaries: usize, replicas: usize, node_timeout_ms: u64) -> Cluster {
        let nodes: Vec<RedisServer> = (0..primaries * (1 + replicas))
            .map(|_| start_node(crate::free_port(), None, node_timeout_ms))
            .collect();
        let announced = nodes.iter().map(RedisServer::port).collect();
        Self::create(nodes, announced, primaries, replicas)
    }

    /// Like [`Cluster::start`], but every node is reached by clients through
    /// its own fault proxy: each node announces its proxy's port, so
    /// `CLUSTER SLOTS`/`NODES` and `MOVED`/`ASK` point clients at the
    /// proxies. `proxies[i]` fronts `nodes[i]`; give clients
    /// [`Cluster::proxy_urls`].
    ///
    /// The cluster bus stays direct, so a proxy fault cuts clients off
    /// without the cluster failing the node over. Replicas dial their
    /// primary at its announced address: replication goes through the
    /// primary's proxy and suffers its faults too.
    pub fn start_behind_proxies(
        primaries: usize,
        replicas: usize,
        node_timeout_ms: u64,
    ) -> (Cluster, Vec<Proxy>) {
        let (nodes, proxies): (Vec<RedisServer>, Vec<Proxy>) = (0..primaries * (1 + replicas))
            .map(|_| {
                // The proxy first: the node must know the port to announce.
                let port = crate::free_port();
                let proxy = Proxy::start(port);
                (start_node(port, Some(proxy.port()), node_timeout_ms), proxy)
            })
            .unzip();
        let announced = proxies.iter().map(Proxy::port).collect();
        let cluster = Self::create(nodes, announced, primaries, replicas);
        (cluster, proxies)
    }

    /// Join started nodes into a cluster and wait until it serves every slot
    /// and every replica is in sync.
    fn create(
        nodes: Vec<RedisServer>,
        announced: Vec<u16>,
        primaries: usize,
        replicas: usize,
    ) -> Cluster {
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
        let cluster = Cluster { nodes, announced };
        cluster.wait_ok(None, Duration::from_secs(20));
        cluster.wait_replicas_online(primaries * replicas, Duration::from_secs(20));
        cluster
    }

    /// The nodes' own URLs, bypassing any proxy.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// The URLs the nodes announce, which clients should be given: the
    /// proxies' for [`Cluster::start_behind_proxies`], else the nodes' own.
    pub fn proxy_urls(&self) -> Vec<String> {
        self.announced
            .iter()
            .map(|p| format!("redis://127.0.0.1:{p}"))
            .collect()
    }

    /// The client port node `i` announces (its proxy's, if behind one).
    pub fn announced_port(&self, i: usize) -> u16 {
        self.announced[i]
    }

    /// Announced ports of the nodes that are primaries owning slots, as
    /// `node` sees it (proxy ports behind proxies; map them back with
    /// [`Cluster::index_of`]).
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

    /// Index of the node listening on `port`, or announcing it (so a proxy
    /// port from `CLUSTER NODES` maps back to the node behind it).
    pub fn index_of(&self, port: u16) -> usize {
        self.nodes
            .iter()
            .position(|n| n.port() == port)
            .unwrap_or_else(|| self.index_of_proxy(port))
    }

    /// Index of the node that announces `port`: behind proxies, the one
    /// whose proxy listens there.
    pub fn index_of_proxy(&self, port: u16) -> usize {
        self.announced
            .iter()
            .position(|&p| p == port)
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

/// The hash slot of a key (CRC16/XMODEM of its hash tag, or of the whole
/// key without one), as Redis Cluster computes it.
pub fn key_slot(key: &str) -> u16 {
    let bytes = key.as_bytes();
    let tagged = bytes.iter().position(|&b| b == b'{').and_then(|open| {
        let close = bytes[open + 1..].iter().position(|&b| b == b'}')?;
        (close > 0).then(|| &bytes[open + 1..open + 1 + close])
    });
    let mut crc: u16 = 0;
    for &b in tagged.unwrap_or(bytes) {
        crc ^= (b as u16) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc & 16383
}

impl Cluster {
    /// `CLUSTER MYID` of node `i`.
    pub fn id(&self, i: usize) -> String {
        self.nodes[i].cmd(&["CLUSTER", "MYID"])
    }

    /// Index of the primary serving `slot`, as node 0 sees it.
    pub fn slot_owner(&self, slot: u16) -> usize {
        let text: String = self.nodes[0].cmd(&["CLUSTER", "NODES"]);
        for line in text.lines() {
            let f: Vec<&str> = line.split(' ').collect();
            if f.len() < 9 || !f[2].contains("master") {
                continue;
            }
            let serves = f[8..].iter().any(|r| {
                let mut ends = r.split('-').map(|n| n.parse::<u16>());
                match (ends.next(), ends.next()) {
                    (Some(Ok(a)), Some(Ok(b))) => (a..=b).contains(&slot),
                    (Some(Ok(a)), None) => a == slot,
                    _ => false,
                }
            });
            if serves {
                let port = f[1].split('@').next().unwrap().rsplit(':').next().unwrap();
                return self.index_of(port.parse().unwrap());
            }
        }
        panic!("nobody serves slot {slot}");
    }

    /// First half of a slot migration: `to` imports, `from` migrates. Keys
    /// still on `from` are served there; new keys are sent on with `ASK`.
    pub fn begin_migration(&self, slot: u16, from: usize, to: usize) {
        let slot = slot.to_string();
        let _: () = self.nodes[to].cmd(&["CLUSTER", "SETSLOT", &slot, "IMPORTING", &self.id(from)]);
        let _: () = self.nodes[from].cmd(&["CLUSTER", "SETSLOT", &slot, "MIGRATING", &self.id(to)]);
    }

    /// Move some keys of a migrating slot now: clients asking `from` for
    /// them get `ASK`. The keys go node to node directly, never through a
    /// proxy.
    pub fn migrate_keys(&self, from: usize, to: usize, keys: &[&str]) {
        let port = self.nodes[to].port().to_string();
        let mut args = vec!["MIGRATE", "127.0.0.1", &port, "", "0", "5000", "KEYS"];
        args.extend(keys);
        let _: String = self.nodes[from].cmd(&args);
    }

    /// How many `TRYAGAIN` errors node `i` has answered.
    pub fn try_again_errors(&self, i: usize) -> u64 {
        let info: String = self.nodes[i].cmd(&["INFO", "errorstats"]);
        info.lines()
            .find_map(|l| l.strip_prefix("errorstat_TRYAGAIN:count="))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or(0)
    }

    /// Second half: move the slot's keys and hand the slot to `to`
    /// everywhere; clients that still go to `from` get `MOVED`.
    pub fn finish_migration(&self, slot: u16, from: usize, to: usize) {
        self.try_finish_migration(slot, from, to)
            .unwrap_or_else(|e| panic!("finishing the migration of slot {slot}: {e}"));
    }

    /// [`finish_migration`](Self::finish_migration), saying what failed:
    /// keys are moved until the source has none left (a busy source may
    /// list a key that expires before it moves), then the slot is handed
    /// to `to` on the two nodes and told to every other node.
    pub fn try_finish_migration(&self, slot: u16, from: usize, to: usize) -> Result<(), String> {
        let s = slot.to_string();
        for _ in 0..20 {
            let keys: Vec<String> =
                self.try_cmd(from, &["CLUSTER", "GETKEYSINSLOT", &s, "1000"])?;
            if keys.is_empty() {
                break;
            }
            let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
            self.try_migrate_keys(from, to, &keys)?;
        }
        let to_id = self.id(to);
        for i in [to, from] {
            let _: () = self.try_cmd(i, &["CLUSTER", "SETSLOT", &s, "NODE", &to_id])?;
        }
        for i in (0..self.nodes.len()).filter(|&i| i != to && i != from) {
            // Replicas refuse; they follow their primary.
            let _ = self.try_cmd::<()>(i, &["CLUSTER", "SETSLOT", &s, "NODE", &to_id]);
        }
        Ok(())
    }

    /// [`migrate_keys`](Self::migrate_keys), saying what failed; keys
    /// gone meanwhile are skipped.
    pub fn try_migrate_keys(&self, from: usize, to: usize, keys: &[&str]) -> Result<(), String> {
        let port = self.nodes[to].port().to_string();
        let mut args = vec!["MIGRATE", "127.0.0.1", &port, "", "0", "5000", "KEYS"];
        args.extend(keys);
        match self.try_cmd::<String>(from, &args) {
            Ok(_) => Ok(()),
            Err(e) if e.contains("NOKEY") => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// One command to node `i`, its error as text.
    pub fn try_cmd<T: redis::FromRedisValue>(&self, i: usize, args: &[&str]) -> Result<T, String> {
        let mut c = redis::cmd(args[0]);
        for a in &args[1..] {
            c.arg(*a);
        }
        let mut conn = redis::Client::open(self.nodes[i].url())
            .and_then(|c| c.get_connection_with_timeout(Duration::from_secs(5)))
            .map_err(|e| format!("connecting to node {i}: {e}"))?;
        c.query(&mut conn)
            .map_err(|e| format!("{args:?} on node {i}: {e}"))
    }
}

/// What [`Cluster::reshard`] saw: how long the move took, and the
/// `MIGRATE` errors it met on the way (each batch that failed once).
#[derive(Debug, Default)]
pub struct Resharded {
    pub took: Duration,
    pub errors: Vec<String>,
}

impl Cluster {
    /// Move `slot` from `from` to `to` as an operator's resharding does
    /// (`redis-cli --cluster reshard`): `IMPORTING`/`MIGRATING`, then
    /// `batch` keys per `MIGRATE`, `pause` apart, until the source has none
    /// left, then the slot handed to `to` everywhere. A `MIGRATE` that
    /// fails is noted and the keys are asked for again after `pause`;
    /// gives up after `limit`.
    pub fn reshard(
        &self,
        slot: u16,
        (from, to): (usize, usize),
        batch: usize,
        pause: Duration,
        limit: Duration,
    ) -> Result<Resharded, String> {
        let began = Instant::now();
        let mut seen = Resharded::default();
        self.begin_migration(slot, from, to);
        let (s, n) = (slot.to_string(), batch.to_string());
        loop {
            let keys: Vec<String> = self.try_cmd(from, &["CLUSTER", "GETKEYSINSLOT", &s, &n])?;
            if keys.is_empty() {
                break;
            }
            let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
            if let Err(e) = self.try_migrate_keys(from, to, &keys) {
                seen.errors.push(e);
            }
            if began.elapsed() > limit {
                let left: Vec<String> =
                    self.try_cmd(from, &["CLUSTER", "GETKEYSINSLOT", &s, "10"])?;
                return Err(format!(
                    "slot {slot} not moved within {limit:?}: {left:?} still on the source; \
                     errors: {:?}",
                    seen.errors
                ));
            }
            std::thread::sleep(pause);
        }
        let to_id = self.id(to);
        for i in [to, from] {
            let _: () = self.try_cmd(i, &["CLUSTER", "SETSLOT", &s, "NODE", &to_id])?;
        }
        for i in (0..self.nodes.len()).filter(|&i| i != to && i != from) {
            // Replicas refuse; they follow their primary.
            let _ = self.try_cmd::<()>(i, &["CLUSTER", "SETSLOT", &s, "NODE", &to_id]);
        }
        seen.took = began.elapsed();
        Ok(seen)
    }

    /// `n` keys `{tag}:filler:<i>` written on node `i` (which must serve
    /// their slot), 1 000 per `MSET`.
    pub fn fill(&self, i: usize, tag: &str, n: usize) {
        let names: Vec<String> = (0..n).map(|j| format!("{{{tag}}}:filler:{j}")).collect();
        for chunk in names.chunks(1000) {
            let mut args = vec!["MSET"];
            for k in chunk {
                args.extend([k.as_str(), "x"]);
            }
            let _: () = self.nodes[i].cmd(&args);
        }
    }

    /// How many keys of `slot` node `i` has.
    pub fn keys_in_slot(&self, i: usize, slot: u16) -> u64 {
        self.nodes[i].cmd(&["CLUSTER", "COUNTKEYSINSLOT", &slot.to_string()])
    }
}
