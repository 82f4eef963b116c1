//! What a world checks: the clients and their requests, the deployment,
//! the faults the network may commit, and the defects it restores.

use crate::decide::Timing;
use crate::defects::Defects;

/// How long a failover leaves the deployment without a primary.
pub const FAILOVER_MS: u64 = 1000;

/// The main command connection.
pub const MAIN: u8 = 0;
/// Sentinel with `replica_acks`: the connection for acquires and `WAIT`.
pub const ACKS: u8 = 1;
/// One Redis with [`World::io_conn`]: the I/O thread's connection, which
/// the watchdog's renewals take (requests take the caller's, [`MAIN`]).
pub const IO: u8 = 1;

/// One lock request a client makes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Plan {
    pub key: u8,
    pub read: bool,
    /// A permit of a semaphore admitting this many (`client.semaphore`);
    /// 0: a lock.
    pub permits: u8,
    pub lease: u64,
    pub wait: u64,
    pub min_hold: Option<u64>,
    pub max_hold: Option<u64>,
    /// How long the body runs once it holds the lock.
    pub body: u64,
    /// When the request starts.
    pub start: u64,
}

impl Plan {
    pub fn write(key: u8) -> Plan {
        Plan {
            key,
            read: false,
            permits: 0,
            lease: 3000,
            wait: 0,
            min_hold: None,
            max_hold: None,
            body: 500,
            start: 0,
        }
    }
    pub fn read(key: u8) -> Plan {
        Plan {
            read: true,
            ..Plan::write(key)
        }
    }
    /// A permit of a semaphore of `permits` on `key`.
    pub fn permit(key: u8, permits: u8) -> Plan {
        Plan {
            permits,
            ..Plan::write(key)
        }
    }
    pub fn wait(mut self, ms: u64) -> Self {
        self.wait = ms;
        self
    }
    pub fn lease(mut self, ms: u64) -> Self {
        self.lease = ms;
        self
    }
    pub fn body(mut self, ms: u64) -> Self {
        self.body = ms;
        self
    }
    pub fn start(mut self, ms: u64) -> Self {
        self.start = ms;
        self
    }
    pub fn min_hold(mut self, ms: u64) -> Self {
        self.min_hold = Some(ms);
        self
    }
    pub fn max_hold(mut self, ms: u64) -> Self {
        self.max_hold = Some(ms);
        self
    }
}

/// One client: its requests (each its own task, all started at their
/// `start`), and the locks whose grant channel it still listens on when
/// the run begins (a waiter of it left less than `LINGER` ago).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct ClientPlan {
    pub requests: Vec<Plan>,
    pub lingering: Vec<u8>,
}

/// Where locks live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Deployment {
    /// One Redis server (`backend/redis.rs`).
    Redis,
    /// Sentinel without `replica_acks`: one primary, as Redis, with a
    /// replica that a failover promotes.
    Sentinel,
    /// Sentinel with `replica_acks` (`backend/sentinel.rs`): acquires and
    /// their `WAIT` on a connection of their own; a handed-over grant is
    /// confirmed by a further attempt.
    SentinelAcks,
}

/// How many faults of each kind a run may suffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Faults {
    /// A command runs, its reply is lost and its connection cut; the
    /// runtime's transport sends it again (`node.rs::retrying`).
    pub lose_reply: u8,
    /// A command runs, its reply is lost, and a lower transport sends it
    /// again as it was (no rejoin flag): Cluster's `retries(3)`,
    /// Sentinel's `on_primary`.
    pub resend_verbatim: u8,
    /// A request's future dropped at any await.
    pub cancel: u8,
    /// A client process dies.
    pub crash: u8,
    /// One connection whose messages may stay in flight while time passes:
    /// (client, connection; [`MAIN`], [`ACKS`], or 2 for pub/sub).
    pub slow: Option<(u8, u8)>,
    /// Sentinel: the primary dies and a replica that lacks the writes of
    /// the current instant is promoted ([`FAILOVER_MS`] later).
    pub failover: u8,
    /// Sentinel: replication to the replica stalls (its link held, the
    /// replica still answering the sentinels) until a failover promotes
    /// it: it lacks every write from then on, renewals included, across
    /// any number of clock steps; a `WAIT` gets no replica (`WAIT` answers
    /// 0 once its timeout passes; here at once).
    pub stall: u8,
}

/// A world to check.
#[derive(Debug, Clone)]
pub struct World {
    pub clients: Vec<ClientPlan>,
    pub keys: u8,
    pub deployment: Deployment,
    pub faults: Faults,
    pub defects: Defects,
    pub timing: Timing,
    /// Excuse what a copy of a command leaves when a lower transport
    /// delivers it after the request that sent it ended (a documented
    /// limit: it lapses with its lease or its queue stay). Off: the checker
    /// reports it.
    pub excuse_late_copies: bool,
    /// One Redis: the watchdog renews over the I/O thread's connection
    /// ([`IO`]) while requests take the caller's ([`MAIN`]), as the
    /// runtime does (`io.rs`); the two can stall apart. Off: one connection
    /// for both.
    pub io_conn: bool,
}
