//! A world's state as the checker explores it: the server's keyspace and
//! clock, each client's requests, connections and watchdog, the properties'
//! ghost, and the steps that move it.

use std::collections::{BTreeMap, BTreeSet};

use crate::decide::{Acquiring, Answer, Failed, Renewing};
use crate::keyspace::Keyspace;
use crate::plan::Faults;

/// The server's clock reads this many ms at model time 0: tokens and
/// clocks then have the digits they have in production (16 for µs).
pub const EPOCH_MS: u64 = 1_700_000_000_000;

/// An owner id within its client: `<client>:<n>`, `<client>:r<n>`, or a
/// permit's `<client>:s<permits>.<n>` (`key.rs::Mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Owner {
    pub n: u8,
    pub read: bool,
    /// A permit of a semaphore admitting this many holders; 0: a lock.
    pub permits: u8,
}

impl Owner {
    /// A permit of a semaphore.
    pub fn is_permit(self) -> bool {
        self.permits > 0
    }
}

/// A command a client sends.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Cmd {
    Acquire {
        key: u8,
        owner: Owner,
        lease: u64,
        stay: Option<u64>,
        rejoin: bool,
    },
    Release {
        key: u8,
        owner: Owner,
        /// A writer's guard: its hold's token, sent as the hold's value
        /// (`node.rs::release_writer`); 0 for anything else (the owner id).
        fence: u64,
    },
    Renew {
        key: u8,
        owner: Owner,
        lease: u64,
    },
    /// The release of a hold with `left` ms of `min_hold` (`guard.rs::keep`).
    Keep {
        key: u8,
        owner: Owner,
        left: u64,
    },
    /// `node.rs::still_queued`: HEXISTS, GET, ZSCORE.
    StillQueued {
        key: u8,
        owner: Owner,
    },
    Wait,
}

/// Who waits for a command's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Task {
    Req(u8),
    Renewal(Owner),
    Background,
}

/// A command in flight, as the runtime's transport keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Op {
    pub conn: u8,
    pub cmd: Cmd,
    pub task: Task,
    /// No answer by then: the send fails (`op_timeout`).
    pub deadline: u64,
    pub sent_at: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Sent {
    pub op: u8,
    pub cmd: Cmd,
    /// A copy a lower transport sends again on its own.
    pub copy: bool,
}

/// An answer on a command connection; `None`: the connection was cut.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Back {
    pub op: u8,
    pub reply: Option<ReplyKey>,
}

/// A reply in a hashable form.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ReplyKey {
    Acquire(Answer),
    Int(i64),
    Flag(bool),
}

/// What the pub/sub connection carries to a client.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Push {
    Subscribed(u8),
    Grant {
        key: u8,
        owner: Owner,
        fence: u64,
        at: u64,
    },
}

/// A grant kept for its request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Grant {
    pub fence: u64,
    /// Server ms of the hand-off.
    pub at: u64,
}

/// `wakeups.rs::Slot`: the waiters of one lock's grant channel.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct Slot {
    pub waiters: u8,
    pub ready: bool,
    /// Nobody waits: unsubscribe at this time (`LINGER`).
    pub linger: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Phase {
    NotStarted,
    Attempting(u8),
    /// Sentinel with acks: the grant, waiting for `WAIT`.
    Acking(u8, Answer),
    /// Sentinel with acks: `WAIT` failed, and the attempt releases what it
    /// took before it returns (`sentinel.rs::acquire`).
    Unacking(u8),
    Subscribing,
    Checking(u8),
    Napping(u64),
    Pausing(u64),
    Held {
        fence: u64,
        from: u64,
        body_end: u64,
    },
    Releasing(u8),
    Done(Outcome),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    Released,
    Failed(Failed),
    Lost,
    Crashed,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Req {
    pub owner: Owner,
    pub phase: Phase,
    pub acq: Acquiring,
    /// The holder's remaining TTL from the last busy answer.
    pub ttl: Option<u64>,
    /// Registered in the wakeups (`Waiter`).
    pub waiter: bool,
    /// The claim's mailbox (`claims.rs`): a grant for `owner` heard while
    /// the request lives.
    pub mailbox: Option<Grant>,
    /// Once held: when its lease started (`Hold::acquired_at`).
    pub held_from: u64,
    /// Once held: its token (`Hold::fence`).
    pub held_fence: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Renewal {
    pub key: u8,
    pub lease: u64,
    pub r: Renewing,
    /// The renewal in flight: (op, sent at, lease sent, the round's
    /// limit); the op is the renewal's `WAIT` once the primary renewed,
    /// on Sentinel with `replica_acks`.
    pub sending: Option<(u8, u64, u64, u64)>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Client {
    pub alive: bool,
    pub reqs: Vec<Req>,
    pub next_owner: u8,
    pub next_op: u8,
    pub ops: BTreeMap<u8, Op>,
    pub out: [Vec<Sent>; 2],
    pub inbox: [Vec<Back>; 2],
    /// SUBSCRIBE (true) / UNSUBSCRIBE (false) of a key's grant channel.
    pub sub_out: Vec<(bool, u8)>,
    pub sub_in: Vec<Push>,
    pub slots: BTreeMap<u8, Slot>,
    /// Grants nobody claims, with when their orphan timer fires.
    pub unclaimed: BTreeMap<Owner, (u8, Grant, u64)>,
    pub settled: BTreeSet<Owner>,
    pub watchdog: BTreeMap<Owner, Renewal>,
}

/// What the properties look at: who holds what, by the clients' own
/// account, and what the world did that excuses a lock or entry nobody
/// asked for.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct Ghost {
    /// (key, client, owner, fence).
    pub holders: BTreeSet<(u8, u8, Owner, u64)>,
    /// The highest token any writer held with, per key.
    pub max_fence: BTreeMap<u8, u64>,
    /// Every writer's token, per key: (key, token).
    pub writer_fences: BTreeSet<(u8, u64)>,
    /// Every permit holder's token, per key: (key, token).
    pub permit_fences: BTreeSet<(u8, u64)>,
    /// Tokens of writers whose hold a failover lost: (key, token).
    pub lost_fences: BTreeSet<(u8, u64)>,
    /// Locks left taken on purpose: `min_hold` releases, and crashed
    /// holders until their lease ends: (key, client, owner, until).
    pub kept: BTreeSet<(u8, u8, Owner, u64)>,
    /// Owners whose lock or queue entry a late copy of a command wrote (see
    /// [`crate::plan::World::excuse_late_copies`]), or a failover brought back:
    /// (key, client, owner).
    pub excused: BTreeSet<(u8, u8, Owner)>,
    /// Holders whose lock a failover lost: they hold no more, and must be
    /// told at their next renewal.
    pub lost_by_failover: BTreeSet<(u8, u8, Owner)>,
    /// A violation seen on a transition: its description.
    pub violation: Option<String>,
    /// A waiter was handed a lock by a release (for `sometimes`).
    pub handed_over: bool,
    /// As many permit holders as a request admits held one key at once
    /// (for `sometimes`).
    pub permits_full: bool,
    /// A failover happened while someone held a lock (for `sometimes`):
    /// (a holder kept it, a holder lost it).
    pub failover_under_hold: (bool, bool),
    pub crashed: BTreeSet<u8>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct State {
    pub now: u64,
    pub ks: Keyspace,
    /// Sentinel, before a failover: the replica's keyspace while it lacks
    /// writes of the primary (`None`: in step).
    pub replica: Option<Keyspace>,
    /// A failover is under way: no primary until then.
    pub down_until: Option<u64>,
    /// Replication to the replica is stalled ([`Faults::stall`]) until the
    /// failover.
    pub stalled: bool,
    /// Grant channels subscribed on the server: (client, key).
    pub subs: BTreeSet<(u8, u8)>,
    pub clients: Vec<Client>,
    pub budget: Faults,
    pub ghost: Ghost,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Fault {
    None,
    LoseReply,
    ResendVerbatim,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Timer {
    Req(u8),
    OpDeadline(u8),
    Renewal(Owner),
    Orphan(Owner),
    Linger(u8),
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Action {
    /// The server runs the next command of a client's connection.
    Serve {
        client: u8,
        conn: u8,
        fault: Fault,
    },
    /// The server takes the next (UN)SUBSCRIBE of a client.
    ServeSub {
        client: u8,
    },
    /// A client reads the next answer on a command connection.
    Deliver {
        client: u8,
        conn: u8,
    },
    /// A client reads the next pub/sub message.
    DeliverPush {
        client: u8,
    },
    Fire {
        client: u8,
        timer: Timer,
    },
    /// The clock moves to the next timer.
    Tick(u64),
    Cancel {
        client: u8,
        req: u8,
    },
    Crash {
        client: u8,
    },
    /// The replica catches up with the primary.
    Replicate,
    /// The primary dies; the replica, as it is, takes over.
    Failover,
    /// Replication to the replica stalls.
    Stall,
}

pub fn owner_id(c: u8, o: Owner) -> String {
    if o.is_permit() {
        return format!("c{c}:s{}.{}", o.permits, o.n);
    }
    format!("c{c}:{}{}", if o.read { "r" } else { "" }, o.n)
}

pub fn parse_owner(s: &str) -> Option<(u8, Owner)> {
    let (c, rest) = s.split_once(':')?;
    let c: u8 = c.strip_prefix('c')?.parse().ok()?;
    if let Some(rest) = rest.strip_prefix('s') {
        let (permits, n) = rest.split_once('.')?;
        return Some((
            c,
            Owner {
                n: n.parse().ok()?,
                read: false,
                permits: permits.parse().ok().filter(|&p| p > 0)?,
            },
        ));
    }
    let (read, n) = match rest.strip_prefix('r') {
        Some(n) => (true, n),
        None => (false, rest),
    };
    Some((
        c,
        Owner {
            n: n.parse().ok()?,
            read,
            permits: 0,
        },
    ))
}

/// A request between its start and its guard.
pub fn acquiring(p: &Phase) -> bool {
    matches!(
        p,
        Phase::Attempting(_)
            | Phase::Acking(..)
            | Phase::Unacking(_)
            | Phase::Subscribing
            | Phase::Checking(_)
            | Phase::Napping(_)
            | Phase::Pausing(_)
    )
}
