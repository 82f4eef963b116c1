//! The worlds the tests check: the bounded whole (every property, on the
//! code as it is), one world per known race, aimed at it with the fewest
//! clients and faults that reach it, and the failovers.

use crate::decide::Timing;
use crate::defects::Defects;
use crate::plan::{ClientPlan, Deployment, Faults, Plan, World, IO, MAIN};

fn client(requests: Vec<Plan>) -> ClientPlan {
    ClientPlan {
        requests,
        lingering: vec![],
    }
}

fn world(
    clients: Vec<ClientPlan>,
    keys: u8,
    deployment: Deployment,
    faults: Faults,
    defects: Defects,
) -> World {
    World {
        clients,
        keys,
        deployment,
        faults,
        defects,
        timing: Timing::default(),
        excuse_late_copies: true,
        io_conn: false,
    }
}

// ------------------------------------------------------------ the whole

/// Three clients on two keys, writers and readers, each waiting for a lock
/// another holds (`faults`: what may go wrong besides).
fn two_keys(defects: Defects, faults: Faults) -> World {
    world(
        vec![
            client(vec![Plan::write(0)]),
            client(vec![Plan::write(0).wait(4000), Plan::read(1)]),
            client(vec![Plan::read(0).wait(4000), Plan::write(1).wait(4000)]),
        ],
        2,
        Deployment::Redis,
        faults,
        defects,
    )
}

/// The bounded whole, part 1: two keys, one client may crash.
pub fn two_keys_crash(defects: Defects) -> World {
    two_keys(
        defects,
        Faults {
            crash: 1,
            ..Faults::default()
        },
    )
}

/// The bounded whole, part 2: two keys, one request may be cancelled at
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

/// The bounded whole, part 3: three clients on one key, a writer, a
/// waiting writer and a waiting reader; one reply lost (its command ran)
/// and one request cancelled.
pub fn one_key_lost_reply_cancel(defects: Defects) -> World {
    world(
        vec![
            client(vec![Plan::write(0)]),
            client(vec![Plan::write(0).wait(4000)]),
            client(vec![Plan::read(0).wait(4000)]),
        ],
        1,
        Deployment::Redis,
        Faults {
            lose_reply: 1,
            cancel: 1,
            ..Faults::default()
        },
        defects,
    )
}

/// The bounded whole, part 4: three clients on one key; one command
/// repeated verbatim by a lower transport, on a slow connection (the
/// second writer's).
pub fn one_key_resend_slow(defects: Defects) -> World {
    world(
        vec![
            client(vec![Plan::write(0)]),
            client(vec![Plan::write(0).wait(5000)]),
            client(vec![Plan::read(0).wait(5000)]),
        ],
        1,
        Deployment::Redis,
        Faults {
            resend_verbatim: 1,
            slow: Some((1, MAIN)),
            ..Faults::default()
        },
        defects,
    )
}

/// The bounded whole, part 5: `min_hold` (a release that keeps the lock)
/// and `max_hold` (a hold that ends lost while its body runs), waited for
/// by a writer and a reader; one reply lost, one request cancelled.
pub fn hold_bounds(defects: Defects) -> World {
    world(
        vec![
            client(vec![Plan::write(0).body(1000).min_hold(2500)]),
            client(vec![Plan::write(0).wait(6000).body(4000).max_hold(3000)]),
            client(vec![Plan::read(0).wait(9000)]),
        ],
        1,
        Deployment::Redis,
        Faults {
            lose_reply: 1,
            cancel: 1,
            ..Faults::default()
        },
        defects,
    )
}

/// The bounded whole, part 6: Sentinel with `replica_acks` (acquires and
/// `WAIT` on their own connection, grants confirmed by an attempt), three
/// clients on one key, one reply lost, one request cancelled.
pub fn sentinel_acks(defects: Defects) -> World {
    world(
        vec![
            client(vec![Plan::write(0)]),
            client(vec![Plan::write(0).wait(4000)]),
            client(vec![Plan::read(0).wait(4000)]),
        ],
        1,
        Deployment::SentinelAcks,
        Faults {
            lose_reply: 1,
            cancel: 1,
            ..Faults::default()
        },
        defects,
    )
}

// ------------------------------------------------------------ failovers

/// A failover that loses the writes of the current instant, with or
/// without `replica_acks`: a holder, a waiting writer and a waiting
/// reader on one key.
pub fn failover(defects: Defects, acks: bool) -> World {
    world(
        vec![
            client(vec![Plan::write(0).body(1500)]),
            client(vec![Plan::write(0).wait(5000)]),
            client(vec![Plan::read(0).wait(5000)]),
        ],
        1,
        if acks {
            Deployment::SentinelAcks
        } else {
            Deployment::Sentinel
        },
        Faults {
            failover: 1,
            ..Faults::default()
        },
        defects,
    )
}

/// Replication to the replica stalls for longer than a lease (renewals
/// included) and the lagging replica is then promoted, on Sentinel with
/// `replica_acks`: a holder renewing through the stall (its body outlasts
/// its lease) and a writer waiting for the lock (issue 30, item 1).
pub fn lagging_replica(defects: Defects) -> World {
    world(
        vec![
            client(vec![Plan::write(0).body(4000)]),
            client(vec![Plan::write(0).wait(6000)]),
        ],
        1,
        Deployment::SentinelAcks,
        Faults {
            stall: 1,
            failover: 1,
            ..Faults::default()
        },
        defects,
    )
}

// ------------------------------------------------------------ the races

/// Race 1: a waiter's queuing attempt runs, its reply is lost, and the
/// transport sends it again on a slow connection; its client still
/// listens on the lock (another waiter of it left less than `LINGER`
/// ago). The holder hands the lock over, the grant reaches the client
/// while the re-sent attempt's answer is on its way.
pub fn orphan_inflight(defects: Defects) -> World {
    world(
        vec![
            client(vec![Plan::write(0)]),
            ClientPlan {
                requests: vec![Plan::write(0).wait(5000)],
                lingering: vec![0],
            },
            client(vec![Plan::write(0).wait(5000)]),
        ],
        1,
        Deployment::Redis,
        Faults {
            lose_reply: 1,
            slow: Some((1, MAIN)),
            ..Faults::default()
        },
        defects,
    )
}

/// Race 2: Sentinel with `replica_acks`; a waiter's request is dropped
/// while its attempt is on the acks connection.
pub fn undo_overtakes(defects: Defects) -> World {
    world(
        vec![
            client(vec![Plan::write(0)]),
            client(vec![Plan::write(0).wait(2000)]),
        ],
        1,
        Deployment::SentinelAcks,
        Faults {
            cancel: 1,
            ..Faults::default()
        },
        defects,
    )
}

/// Race 3: a queuing attempt repeated verbatim by the transport (no rejoin
/// flag) runs after the holder's lease ran out (the holder crashed).
pub fn ghost_queue_entry(defects: Defects) -> World {
    world(
        vec![
            client(vec![Plan::write(0)]),
            client(vec![Plan::write(0).wait(5000)]),
        ],
        1,
        Deployment::Redis,
        Faults {
            resend_verbatim: 1,
            crash: 1,
            slow: Some((1, MAIN)),
            ..Faults::default()
        },
        defects,
    )
}

/// Race 4: a renewal whose reply is lost is sent again after the holder's
/// `min_hold` release.
pub fn renewal_after_keep(defects: Defects) -> World {
    world(
        vec![client(vec![Plan::write(0).body(1000).min_hold(2500)])],
        1,
        Deployment::Redis,
        Faults {
            lose_reply: 1,
            ..Faults::default()
        },
        defects,
    )
}

/// A documented limit: a command that a lower transport repeats after the
/// request that sent it ended (no answer within `op_timeout`, the wait
/// then over) runs after the undo that took the attempt back, and takes a
/// lock for a request that is over; it lapses with its lease. The world of
/// race 3, on the code as it is; `excused`: whether the world excuses it
/// (every other world does).
pub fn verbatim_resend_after_give_up(excused: bool) -> World {
    World {
        excuse_late_copies: excused,
        ..ghost_queue_entry(Defects::TODAY)
    }
}

/// Issue 30, item 2: a client's renewals go over the I/O thread's
/// connection, which stalls (slow), while its requests go over the
/// caller's. Its first hold (3 s lease) has a renewal out from 1 s; a
/// second hold with a 1 s lease is taken at 1 s over the caller's
/// connection, and another client waits for that key.
pub fn renewal_round_blinds(defects: Defects) -> World {
    World {
        io_conn: true,
        ..world(
            vec![
                client(vec![
                    Plan::write(0).body(1500),
                    Plan::write(1).lease(1000).body(2500).start(1000),
                ]),
                client(vec![Plan::write(1).start(1000).wait(2500)]),
            ],
            2,
            Deployment::Redis,
            Faults {
                slow: Some((0, IO)),
                ..Faults::default()
            },
            defects,
        )
    }
}

/// Issue 30, item 5: a reader queued for a held lock, then a writer behind
/// it; the reader's client may crash (nobody hears its grant then).
pub fn dead_reader_ahead(defects: Defects) -> World {
    world(
        vec![
            client(vec![Plan::write(0)]),
            client(vec![Plan::read(0).wait(4000)]),
            client(vec![Plan::write(0).wait(4000)]),
        ],
        1,
        Deployment::Redis,
        Faults {
            crash: 1,
            ..Faults::default()
        },
        defects,
    )
}

// ------------------------------------------------------------ semaphores

/// Three clients take a permit of a semaphore of `permits` on one key:
/// two hold (one long enough to be renewed), the third waits and is
/// handed a permit by a release; `faults` besides.
fn permits(permits: u8, faults: Faults, defects: Defects) -> World {
    world(
        vec![
            client(vec![Plan::permit(0, permits).body(1500)]),
            client(vec![Plan::permit(0, permits)]),
            client(vec![Plan::permit(0, permits).wait(4000)]),
        ],
        1,
        Deployment::Redis,
        faults,
        defects,
    )
}

/// Two permits, three clients; one reply lost (its command ran), one
/// request cancelled at any await.
pub fn permits_lost_reply_cancel(defects: Defects) -> World {
    permits(
        2,
        Faults {
            lose_reply: 1,
            cancel: 1,
            ..Faults::default()
        },
        defects,
    )
}

/// Two permits, three clients; one client crashes (its permit lapses
/// with its lease, its queue entry with its stay).
pub fn permits_crash(defects: Defects) -> World {
    permits(
        2,
        Faults {
            crash: 1,
            ..Faults::default()
        },
        defects,
    )
}

/// Two permits, three clients; one command repeated verbatim by a lower
/// transport, on the waiter's connection, which is slow.
pub fn permits_resend_slow(defects: Defects) -> World {
    permits(
        2,
        Faults {
            resend_verbatim: 1,
            slow: Some((2, MAIN)),
            ..Faults::default()
        },
        defects,
    )
}

/// Two versions of a service disagree on N: one holder of a semaphore of
/// 2, then a waiter that admits 1 (it queues) and one of 2 behind it,
/// which strict FIFO holds back until the first is served or leaves; one
/// reply lost, one request cancelled.
pub fn permits_disagree(defects: Defects) -> World {
    world(
        vec![
            client(vec![Plan::permit(0, 2).body(2500)]),
            client(vec![Plan::permit(0, 1).wait(1500).start(100)]),
            client(vec![Plan::permit(0, 2).wait(4000).start(200)]),
        ],
        1,
        Deployment::Redis,
        Faults {
            lose_reply: 1,
            cancel: 1,
            ..Faults::default()
        },
        defects,
    )
}

/// `min_hold` on a permit (a release that keeps it counted) and
/// `max_hold` (a permit that ends lost while its body runs), with a
/// waiter; one reply lost.
pub fn permits_hold_bounds(defects: Defects) -> World {
    world(
        vec![
            client(vec![Plan::permit(0, 2).body(1000).min_hold(2500)]),
            client(vec![Plan::permit(0, 2).body(4000).max_hold(3000)]),
            client(vec![Plan::permit(0, 2).wait(6000)]),
        ],
        1,
        Deployment::Redis,
        Faults {
            lose_reply: 1,
            ..Faults::default()
        },
        defects,
    )
}

/// Sentinel with `replica_acks`: permits acquired and confirmed by `WAIT`
/// on their own connection, renewed under `WAIT`; one reply lost, one
/// cancel.
pub fn permits_sentinel_acks(defects: Defects) -> World {
    World {
        deployment: Deployment::SentinelAcks,
        ..permits_lost_reply_cancel(defects)
    }
}

/// A failover that loses the writes of the current instant, with or
/// without `replica_acks`: two holders of two permits and a waiter.
pub fn permits_failover(defects: Defects, acks: bool) -> World {
    World {
        deployment: if acks {
            Deployment::SentinelAcks
        } else {
            Deployment::Sentinel
        },
        ..permits(
            2,
            Faults {
                failover: 1,
                ..Faults::default()
            },
            defects,
        )
    }
}
