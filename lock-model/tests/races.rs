//! The four races of delayed and repeated replies, fixed in the code, and
//! a watchdog blinded by a renewal round in flight (issue 30, item 2; the
//! other race of issue 30 is in `failover.rs`). Each has a switch in
//! `Defects` that restores the old behaviour: with the switch on, the
//! checker finds a counterexample (printed here as the proof); with it off
//! (the code as it is), none in the same world.
//! And the limit that stays: a copy of an acquire delivered after its
//! request ended.

use lock_model::check::{self, Report};
use lock_model::defects::Defects;
use lock_model::plan::World;
use lock_model::properties::*;
use lock_model::scenarios;

/// With the switch on: a counterexample of `property`, returned.
fn found(name: &str, world: World, property: &'static str) -> String {
    let r = check::run(name, world, Some(property));
    let t = r.trace(property).to_string();
    println!("== {}: {property}\n{t}", r.name);
    t
}

/// With the switch off: the whole world, clean.
fn clean(name: &str, world: World) -> Report {
    let r = check::run(name, world, None);
    r.assert_clean();
    r
}

#[test]
fn race_1_a_grant_to_a_request_whose_resent_attempt_is_in_flight_is_passed_on() {
    let on = Defects {
        orphan_ignores_inflight: true,
        ..Defects::TODAY
    };
    let t = found(
        "race 1, switch on",
        scenarios::orphan_inflight(on),
        MUTUAL_EXCLUSION,
    );
    assert!(t.contains("Orphan") && t.contains("LoseReply"), "{t}");
    clean(
        "race 1, switch off",
        scenarios::orphan_inflight(Defects::TODAY),
    );
}

#[test]
fn race_2_on_sentinel_with_acks_an_undo_on_the_main_connection_overtakes_the_acquire() {
    let on = Defects {
        undo_on_main: true,
        ..Defects::TODAY
    };
    let t = found(
        "race 2, switch on",
        scenarios::undo_overtakes(on),
        ORPHANS_PASSED_ON,
    );
    assert!(
        t.contains("Cancel") && t.contains("neither holds nor waits"),
        "{t}"
    );
    clean(
        "race 2, switch off",
        scenarios::undo_overtakes(Defects::TODAY),
    );
}

#[test]
fn race_3_a_queuing_attempt_repeated_without_rejoin_leaves_a_ghost_queue_entry() {
    let on = Defects {
        acquire_before_fixes: true,
        ..Defects::TODAY
    };
    let t = found(
        "race 3, switch on",
        scenarios::ghost_queue_entry(on),
        NOTHING_LEFT,
    );
    assert!(
        t.contains("ResendVerbatim") && t.contains("still queued"),
        "{t}"
    );
    clean(
        "race 3, switch off",
        scenarios::ghost_queue_entry(Defects::TODAY),
    );
}

#[test]
fn race_4_a_renewal_resent_after_a_min_hold_release_restores_the_full_lease() {
    let on = Defects {
        keep_by_renewal: true,
        ..Defects::TODAY
    };
    let t = found(
        "race 4, switch on",
        scenarios::renewal_after_keep(on),
        NOTHING_LEFT,
    );
    assert!(t.contains("released with min_hold"), "{t}");
    clean(
        "race 4, switch off",
        scenarios::renewal_after_keep(Defects::TODAY),
    );
}

/// Issue 30, item 2: renewals go over the I/O thread's connection, which
/// stalls with a round out; a hold with a short lease taken meanwhile over
/// the caller's connection is not looked at until that round returns
/// (switch on): it lapses in Redis, another client takes the key, and the
/// holder still runs. Watched on its own (off), it is declared lost at its
/// deadline.
#[test]
fn issue_30_2_a_renewal_round_in_flight_does_not_blind_the_watchdog() {
    let on = Defects {
        watchdog_one_round: true,
        ..Defects::TODAY
    };
    let t = found(
        "a round in flight, one round at a time",
        scenarios::renewal_round_blinds(on),
        MUTUAL_EXCLUSION,
    );
    assert!(t.contains("timer Renewal"), "{t}");
    clean(
        "a round in flight, every hold watched on its own",
        scenarios::renewal_round_blinds(Defects::TODAY),
    );
}

/// Issue 30, item 5: a reader at the head of the queue whose client died
/// (nobody hears its grant), a writer queued behind it. `release.lua`
/// without its fix (switch on) passes the reader over, stops at the writer
/// and frees the lock: the writer, listening, stays queued until its next
/// attempt. With the fix (off), the same release serves the writer.
#[test]
fn issue_30_5_a_writer_behind_a_reader_nobody_hears_is_served_by_the_release() {
    let on = Defects {
        release_before_fixes: true,
        ..Defects::TODAY
    };
    let t = found(
        "a dead reader ahead of a writer, release.lua before the fix",
        scenarios::dead_reader_ahead(on),
        QUEUE_SERVED,
    );
    assert!(t.contains("Crash") && t.contains("stalled"), "{t}");
    clean(
        "a dead reader ahead of a writer",
        scenarios::dead_reader_ahead(Defects::TODAY),
    );
}

/// A limit, not a race (docs/RELIABILITY.md, "Limits"): a copy of an
/// acquire that a lower transport delivers after its request ended takes a
/// free lock for an owner nobody renews, and it lapses with its lease. The
/// default worlds excuse exactly that; without the excuse the checker
/// finds it, and with it the same world is clean.
#[test]
fn a_verbatim_resend_after_the_request_ended_takes_a_lock_that_lapses() {
    let t = found(
        "verbatim re-send after give-up, not excused",
        scenarios::verbatim_resend_after_give_up(false),
        ORPHANS_PASSED_ON,
    );
    assert!(t.contains("ResendVerbatim") && t.contains("Failed("), "{t}");
    clean(
        "verbatim re-send after give-up, excused",
        scenarios::verbatim_resend_after_give_up(true),
    );
}
