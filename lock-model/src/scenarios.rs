//! The worlds the tests check: one per known race, aimed at it with the
//! fewest clients and faults that reach it, and the bounded whole.

use crate::decide::Timing;
use crate::defects::Defects;
use crate::world::{ClientPlan, Deployment, Faults, Plan, World, MAIN};

fn client(requests: Vec<Plan>) -> ClientPlan {
    ClientPlan {
        requests,
        lingering: vec![],
    }
}

/// Race 1: a waiter's queuing attempt runs, its reply is lost, and the
/// transport sends it again on a slow connection; its client still
/// listens on the lock (another waiter of it left less than `LINGER`
/// ago). The holder hands the lock over, the grant reaches no mailbox, and
/// the orphan timer fires while the re-sent attempt's answer is on its way.
pub fn orphan_inflight(defects: Defects) -> World {
    World {
        clients: vec![
            client(vec![Plan::write(0)]),
            ClientPlan {
                requests: vec![Plan::write(0).wait(5000)],
                lingering: vec![0],
            },
            client(vec![Plan::write(0).wait(5000)]),
        ],
        keys: 1,
        deployment: Deployment::Redis,
        faults: Faults {
            lose_reply: 1,
            slow: Some((1, MAIN)),
            ..Faults::default()
        },
        defects,
        timing: Timing::default(),
    }
}

/// Race 2: Sentinel with `replica_acks`; a waiter's request is dropped
/// while its attempt is on the acks connection.
pub fn unsure_release_overtakes(defects: Defects) -> World {
    World {
        clients: vec![
            client(vec![Plan::write(0)]),
            client(vec![Plan::write(0).wait(2000)]),
        ],
        keys: 1,
        deployment: Deployment::SentinelAcks,
        faults: Faults {
            cancel: 1,
            ..Faults::default()
        },
        defects,
        timing: Timing::default(),
    }
}

/// Race 3: a queuing attempt repeated verbatim by the transport (no rejoin
/// flag) runs after the holder's lease ran out (the holder crashed).
pub fn ghost_queue_entry(defects: Defects) -> World {
    World {
        clients: vec![
            client(vec![Plan::write(0)]),
            client(vec![Plan::write(0).wait(9000)]),
        ],
        keys: 1,
        deployment: Deployment::Redis,
        faults: Faults {
            resend_verbatim: 1,
            crash: 1,
            slow: Some((1, MAIN)),
            ..Faults::default()
        },
        defects,
        timing: Timing::default(),
    }
}

/// Race 4: a renewal whose reply is lost is sent again after the holder's
/// `min_hold` release.
pub fn renewal_after_keep(defects: Defects) -> World {
    World {
        clients: vec![client(vec![Plan::write(0).body(1000).min_hold(2500)])],
        keys: 1,
        deployment: Deployment::Redis,
        faults: Faults {
            lose_reply: 1,
            ..Faults::default()
        },
        defects,
        timing: Timing::default(),
    }
}

/// The bounded whole, part 1: three clients on two keys, writers and
/// readers, each waiting for a lock another holds; one client may crash.
pub fn two_keys_crash(defects: Defects) -> World {
    two_keys(
        defects,
        Faults {
            crash: 1,
            ..Faults::default()
        },
    )
}

/// The bounded whole, part 2: the same, one request may be cancelled at
/// any await.
pub fn two_keys_cancel(defects: Defects) -> World {
    two_keys(
        defects,
        Faults {
            cancel: 1,
            ..Faults::default()
        },
    )
}

fn two_keys(defects: Defects, faults: Faults) -> World {
    World {
        clients: vec![
            client(vec![Plan::write(0)]),
            client(vec![Plan::write(0).wait(4000), Plan::read(1)]),
            client(vec![Plan::read(0).wait(4000), Plan::write(1).wait(4000)]),
        ],
        keys: 2,
        deployment: Deployment::Redis,
        faults,
        defects,
        timing: Timing::default(),
    }
}

/// The bounded whole, part 3: three clients on one key, a writer, a
/// waiting writer and a waiting reader; one reply lost (its command ran)
/// and one request cancelled.
pub fn one_key_lost_reply_cancel(defects: Defects) -> World {
    World {
        clients: vec![
            client(vec![Plan::write(0)]),
            client(vec![Plan::write(0).wait(4000)]),
            client(vec![Plan::read(0).wait(4000)]),
        ],
        keys: 1,
        deployment: Deployment::Redis,
        faults: Faults {
            lose_reply: 1,
            cancel: 1,
            ..Faults::default()
        },
        defects,
        timing: Timing::default(),
    }
}

/// The bounded whole, part 4: `min_hold` (a release that keeps the lock)
/// and `max_hold` (a hold that ends lost while its body runs), waited for
/// by a writer and a reader; one request cancelled.
pub fn hold_bounds_cancel(defects: Defects) -> World {
    World {
        clients: vec![
            client(vec![Plan::write(0).body(1000).min_hold(2500)]),
            client(vec![Plan::write(0).wait(6000).body(4000).max_hold(3000)]),
            client(vec![Plan::read(0).wait(9000)]),
        ],
        keys: 1,
        deployment: Deployment::Redis,
        faults: Faults {
            cancel: 1,
            ..Faults::default()
        },
        defects,
        timing: Timing::default(),
    }
}

/// The bounded whole, part 5: Sentinel with `replica_acks` (acquires and
/// `WAIT` on their own connection, grants confirmed by an attempt), three
/// clients on one key, one reply lost.
pub fn sentinel_lost_reply(defects: Defects) -> World {
    World {
        clients: vec![
            client(vec![Plan::write(0)]),
            client(vec![Plan::write(0).wait(4000)]),
            client(vec![Plan::read(0).wait(4000)]),
        ],
        keys: 1,
        deployment: Deployment::SentinelAcks,
        faults: Faults {
            lose_reply: 1,
            ..Faults::default()
        },
        defects,
        timing: Timing::default(),
    }
}

/// Not a known race, found by the checker on today's code: a command that
/// the lower transport repeats (Cluster's own retries) after the runtime
/// gave up on it (no answer within `op_timeout`) runs after the release
/// that takes the attempt back, and takes a lock for a request that is
/// over.
pub fn verbatim_resend_after_give_up(defects: Defects) -> World {
    World {
        clients: vec![
            client(vec![Plan::write(0)]),
            client(vec![Plan::write(0).wait(5000)]),
        ],
        keys: 1,
        deployment: Deployment::Redis,
        faults: Faults {
            resend_verbatim: 1,
            crash: 1,
            slow: Some((1, MAIN)),
            ..Faults::default()
        },
        defects,
        timing: Timing::default(),
    }
}
