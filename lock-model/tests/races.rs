//! The four races of the safety review: the checker finds each on today's
//! code (the switch on), with the counterexample printed.

use lock_model::check;
use lock_model::defects::Defects;
use lock_model::properties::*;
use lock_model::scenarios;

#[test]
fn race_1_orphan_timer_releases_an_owner_whose_attempt_is_in_flight() {
    let r = check::run(
        "race 1, today",
        scenarios::orphan_inflight(Defects::TODAY),
        Some(MUTUAL_EXCLUSION),
    );
    for (p, t) in &r.found {
        println!("== {p}\n{t}");
    }
}

#[test]
fn race_2_unsure_release_overtakes_the_acquire_on_sentinel_with_acks() {
    let r = check::run(
        "race 2, today",
        scenarios::unsure_release_overtakes(Defects::TODAY),
        Some(ORPHANS_PASSED_ON),
    );
    for (p, t) in &r.found {
        println!("== {p}\n{t}");
    }
}

#[test]
fn race_3_a_verbatim_resend_leaves_a_ghost_queue_entry() {
    let r = check::run(
        "race 3, today",
        scenarios::ghost_queue_entry(Defects::TODAY),
        Some(NOTHING_LEFT),
    );
    for (p, t) in &r.found {
        println!("== {p}\n{t}");
    }
}

#[test]
fn race_4_a_renewal_resent_after_min_hold_release_restores_the_lease() {
    let r = check::run(
        "race 4, today",
        scenarios::renewal_after_keep(Defects::TODAY),
        Some(NOTHING_LEFT),
    );
    for (p, t) in &r.found {
        println!("== {p}\n{t}");
    }
}

#[test]
fn race_1_off() {
    let d = Defects {
        orphan_ignores_inflight: false,
        ..Defects::TODAY
    };
    let r = check::run("race 1, off", scenarios::orphan_inflight(d), None);
    for (p, t) in &r.found {
        println!("== {p}\n{t}");
    }
}

#[test]
fn race_2_off() {
    let d = Defects {
        unsure_release_on_main: false,
        ..Defects::TODAY
    };
    let r = check::run("race 2, off", scenarios::unsure_release_overtakes(d), None);
    for (p, t) in &r.found {
        println!("== {p}\n{t}");
    }
}
