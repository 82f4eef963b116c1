//! What must hold in every reachable state of a [`World`].
//!
//! A client counts as holding from when its request returns a guard until
//! its body ends (it releases) or its watchdog tells it the lock is lost.
//! Runs are finite (every fault has a budget, every request a deadline,
//! every body an end), so the two "eventually" properties are checked
//! where a run can end: when a waiter gives up busy, something real must
//! have kept it out; once nothing is in flight any more, nothing may be
//! left behind.
//!
//! Two things the world does excuse a lock or queue entry nobody asked
//! for, and are tracked so that nothing else is: a copy of an acquire that
//! a lower transport delivers after its request ended (a documented limit,
//! see [`World::excuse_late_copies`]), and a failover that brings back a
//! lock or entry the old primary had removed. Both lapse with their TTL.

use std::collections::BTreeSet;

use stateright::Property;

use crate::calls::names;
use crate::decide::Verdict;
use crate::keyspace::{Data, Keyspace};
use crate::plan::{Deployment, World};
use crate::state::{acquiring, owner_id, parse_owner, Cmd, Owner, Phase, State, EPOCH_MS};

pub const MUTUAL_EXCLUSION: &str = "never two write holders, nor a reader beside a writer";
pub const FENCES_RISE: &str = "a holder's token is above every earlier writer's";
pub const TTLS: &str = "no key without a TTL (a token counter's is fence_ttl)";
pub const ORPHANS_PASSED_ON: &str = "an orphaned grant is passed on";
pub const WAITERS_SERVED: &str = "a waiter whose wait outlasts the holders gets the lock";
pub const NOTHING_LEFT: &str = "nothing is left behind once nobody holds or waits";
pub const LOST_HOLDER_TOLD: &str =
    "a holder whose lock a failover lost learns it at its next renewal";
pub const ACKED_SURVIVES: &str = "with replica_acks, a failover keeps every lock a holder has";
pub const QUEUE_SERVED: &str =
    "a release that frees a lock others queued behind leaves no listening waiter queued";
pub const PERMITS_BOUNDED: &str =
    "at most N permit holders, by each request's own N, and none beside a lock holder";
pub const PERMITS_SERVED: &str =
    "a permit script leaves no listening waiter first in the queue that its own N admits";
pub const PERMITS_FULL: &str = "as many permit holders as a request admits (sometimes)";
pub const HANDED_OVER: &str = "a release hands the lock to a waiter (sometimes)";
pub const FAILOVER_KEPT: &str = "a failover keeps a holder's lock (sometimes)";
pub const FAILOVER_LOST: &str = "a failover loses a holder's lock (sometimes)";

/// Whether a property is a `sometimes` one: what the checker finds for it
/// is an example, not a counterexample.
pub fn is_example(property: &str) -> bool {
    [HANDED_OVER, FAILOVER_KEPT, FAILOVER_LOST, PERMITS_FULL].contains(&property)
}

fn violated(s: &State, prefix: &str) -> bool {
    s.ghost
        .violation
        .as_deref()
        .is_some_and(|v| v.starts_with(prefix))
}

pub fn all() -> Vec<Property<World>> {
    vec![
        Property::always(MUTUAL_EXCLUSION, |_, s: &State| mutual_exclusion(s)),
        Property::always(PERMITS_BOUNDED, |_, s: &State| permits_bounded(s).is_none()),
        Property::always(PERMITS_SERVED, |_, s: &State| !violated(s, "unserved")),
        Property::always(FENCES_RISE, |_, s: &State| !violated(s, "fence")),
        Property::always(TTLS, |_, s: &State| {
            s.ks.keys.values().all(|e| e.expires.is_some())
        }),
        Property::always(ORPHANS_PASSED_ON, |w: &World, s: &State| {
            !quiescent(s) || (0..w.keys).all(|k| occupant(w, s, k).is_ok())
        }),
        Property::always(WAITERS_SERVED, |_, s: &State| !violated(s, "starved")),
        Property::always(NOTHING_LEFT, |w: &World, s: &State| {
            !quiescent(s) || left_behind(w, s).is_none()
        }),
        Property::always(LOST_HOLDER_TOLD, |_, s: &State| !violated(s, "untold")),
        Property::always(ACKED_SURVIVES, |_, s: &State| !violated(s, "acked")),
        Property::always(QUEUE_SERVED, |_, s: &State| !violated(s, "stalled")),
        Property::sometimes(HANDED_OVER, |_, s: &State| s.ghost.handed_over),
        Property::sometimes(PERMITS_FULL, |_, s: &State| s.ghost.permits_full),
        Property::sometimes(FAILOVER_KEPT, |_, s: &State| s.ghost.failover_under_hold.0),
        Property::sometimes(FAILOVER_LOST, |_, s: &State| s.ghost.failover_under_hold.1),
    ]
}

/// Never two writers, nor readers beside a writer, among the holders whose
/// lock the server still has (a failover can take one away: that holder
/// must learn it, see [`LOST_HOLDER_TOLD`]).
fn mutual_exclusion(s: &State) -> bool {
    let mut by_key: std::collections::BTreeMap<u8, (u32, u32)> = Default::default();
    for &(k, c, o, _) in &s.ghost.holders {
        if s.ghost.lost_by_failover.contains(&(k, c, o)) || o.is_permit() {
            continue;
        }
        let e = by_key.entry(k).or_default();
        if o.read {
            e.1 += 1;
        } else {
            e.0 += 1;
        }
    }
    by_key.values().all(|&(w, r)| w <= 1 && (w == 0 || r == 0))
}

/// Permit holders of each key, among those whose permit the server still
/// has: each admitted while fewer than its own N held, so each has fewer
/// than its N holders before it in grant order, which is token order
/// (tokens rise with every grant of the key's counter); tokens differ;
/// and no lock holder beside them. A description of the first breach.
pub fn permits_bounded(s: &State) -> Option<String> {
    let g = &s.ghost;
    let counted = |&&(k, c, o, _): &&(u8, u8, Owner, u64)| !g.lost_by_failover.contains(&(k, c, o));
    let permits: Vec<&(u8, u8, Owner, u64)> = g
        .holders
        .iter()
        .filter(counted)
        .filter(|h| h.2.is_permit())
        .collect();
    for h in &permits {
        let (k, c, o, f) = **h;
        let before = permits
            .iter()
            .filter(|x| x.0 == k && (x.3, x.1, x.2) < (f, c, o))
            .count();
        if before >= usize::from(o.permits) {
            let all: Vec<String> = permits
                .iter()
                .filter(|x| x.0 == k)
                .map(|x| format!("{}#{}", owner_id(x.1, x.2), x.3 % 1_000_000_000))
                .collect();
            return Some(format!(
                "{} holds key {k} with {before} holders granted before it, {} allowed: {all:?}",
                owner_id(c, o),
                o.permits
            ));
        }
        if permits
            .iter()
            .any(|x| x.0 == k && x.3 == f && (x.1, x.2) != (c, o))
        {
            return Some(format!("token {f} of key {k} held twice"));
        }
        if let Some(l) = g
            .holders
            .iter()
            .filter(counted)
            .find(|x| x.0 == k && !x.2.is_permit())
        {
            return Some(format!(
                "{} holds a permit of key {k} beside the lock of {}",
                owner_id(c, o),
                owner_id(l.1, l.2)
            ));
        }
    }
    None
}

/// After a permit script ran on `key`: if permits are free, the first
/// waiter that hears grants (its client listens on the key's grant
/// channel, its stay not over) must be one whose own N the live holders
/// fill (strict FIFO), or none: a release serves the queue, and an
/// acquire serves the heads before its own owner.
pub fn on_permit_script(s: &mut State, key: u8) {
    let n = names(key);
    let now = EPOCH_MS + s.now;
    let live = match s.ks.get(&n[0], now) {
        Some(Data::Hash(h)) => h.values().filter(|v| lease_end(v) > now).count(),
        Some(_) => return,
        None => 0,
    };
    let Some(Data::List(queue)) = s.ks.get(&n[2], now) else {
        return;
    };
    let stays = match s.ks.get(&n[3], now) {
        Some(Data::Hash(h)) => h.clone(),
        _ => Default::default(),
    };
    let head = queue.iter().find(|o| {
        let live = stays
            .get(o.as_str())
            .and_then(|e| e.split(' ').nth(1))
            .and_then(|u| u.parse::<u64>().ok())
            .is_some_and(|until| until > now);
        let listening = parse_owner(o).is_some_and(|(c, _)| s.subs.contains(&(c, key)));
        live && listening
    });
    let Some((o, (_, owner))) = head.and_then(|o| Some((o.clone(), parse_owner(o)?))) else {
        return;
    };
    if owner.is_permit() && live < usize::from(owner.permits) {
        violation(
            s,
            format!(
                "unserved: {live} permits of key {key} held, and {o} (of {}) left queued first, though it listens",
                owner.permits
            ),
        );
    }
}

/// A permit entry's lease end (server ms): `"<end> <token>"`.
fn lease_end(v: &str) -> u64 {
    v.split(' ')
        .next()
        .and_then(|e| e.parse().ok())
        .unwrap_or(0)
}

fn violation(s: &mut State, v: String) {
    if s.ghost.violation.is_none() {
        s.ghost.violation = Some(v);
    }
}

/// A request just returned a guard. A writer's token is above every
/// earlier writer's; a reader's is not below any earlier writer's, except
/// a writer whose hold a failover lost: readers handed the lock together
/// by a release get the counter as the promoted replica has it (a
/// documented limit; writers' tokens are floored at the clock).
pub fn on_hold(s: &mut State, key: u8, c: u8, owner: Owner, fence: u64) {
    if owner.is_permit() {
        return on_permit(s, key, c, owner, fence);
    }
    let g = &s.ghost;
    let max = g.max_fence.get(&key).copied().unwrap_or(0);
    let below = if owner.read {
        let kept = g
            .writer_fences
            .iter()
            .filter(|&&(k, f)| k == key && !g.lost_fences.contains(&(k, f)))
            .map(|&(_, f)| f)
            .max()
            .unwrap_or(0);
        fence < kept
    } else {
        fence <= max
    };
    if below {
        violation(
            s,
            format!(
                "fence: {} holds key {key} with token {fence}, not above {max} of an earlier writer",
                owner_id(c, owner)
            ),
        );
    }
    let g = &mut s.ghost;
    if !owner.read {
        g.max_fence.insert(key, max.max(fence));
        g.writer_fences.insert((key, fence));
    }
    g.holders.insert((key, c, owner, fence));
}

/// A permit holder's guard was returned: its token is one no earlier
/// holder of the key had (permits' and writers') and above every earlier
/// writer's (locks and permits share the counter, and exclude each other).
fn on_permit(s: &mut State, key: u8, c: u8, owner: Owner, fence: u64) {
    let g = &s.ghost;
    let max = g.max_fence.get(&key).copied().unwrap_or(0);
    let reused = g.permit_fences.contains(&(key, fence)) || g.writer_fences.contains(&(key, fence));
    if fence <= max || reused {
        violation(
            s,
            format!(
                "fence: {} holds a permit of key {key} with token {fence}, {}",
                owner_id(c, owner),
                if reused {
                    "handed out before".to_string()
                } else {
                    format!("not above {max} of an earlier writer")
                }
            ),
        );
    }
    let g = &mut s.ghost;
    g.permit_fences.insert((key, fence));
    g.holders.insert((key, c, owner, fence));
    let held = g
        .holders
        .iter()
        .filter(|h| h.0 == key && h.2.is_permit())
        .count();
    if held >= usize::from(owner.permits) {
        g.permits_full = true;
    }
}

/// A holder's hold ended (released, lost, or crashed); `kept_until`: the
/// lock stays taken on purpose until then (model ms).
pub fn on_leave(s: &mut State, key: u8, c: u8, owner: Owner, kept_until: Option<u64>) {
    let g = &mut s.ghost;
    g.holders
        .retain(|&(k, hc, o, _)| !(k == key && hc == c && o == owner));
    g.lost_by_failover.remove(&(key, c, owner));
    if let Some(until) = kept_until {
        g.kept.insert((key, c, owner, until));
    }
}

/// A request gave up busy: something real must have kept it out.
pub fn on_timeout(w: &World, s: &mut State, c: u8, r: u8) {
    let key = w.clients[c as usize].requests[r as usize].key;
    if let Err(why) = occupant(w, s, key) {
        let owner = s.clients[c as usize].reqs[r as usize].owner;
        violation(
            s,
            format!(
                "starved: {} gave up waiting for key {key}: {why}",
                owner_id(c, owner)
            ),
        );
    }
}

/// A renewal's answer reached a holder's watchdog, which decided whether
/// the hold is `lost`: a holder whose lock a failover lost must be, at the
/// first answer the server gives it.
pub fn on_renewal_answer(
    s: &mut State,
    (key, c, owner): (u8, u8, Owner),
    verdict: Verdict,
    lost: bool,
) {
    if verdict != Verdict::NoAnswer && !lost && s.ghost.lost_by_failover.contains(&(key, c, owner))
    {
        violation(
            s,
            format!(
                "untold: {} still holds key {key} after a renewal answered {verdict:?}, though the failover lost its lock",
                owner_id(c, owner)
            ),
        );
    }
}

/// Whether `key`'s lock is marked as having waiters queued behind it
/// (before a release runs).
pub fn queued_behind(s: &State, key: u8) -> bool {
    match s.ks.get(&names(key)[0], EPOCH_MS + s.now) {
        Some(Data::Str(v)) => v.split(' ').nth(2) == Some("q"),
        _ => false,
    }
}

/// A release of a lock marked as queued behind ran: if it freed the lock,
/// it must have served every waiter that hears grants (one whose client
/// listens on the lock's grant channel, its stay not over), or the
/// waiter waits for its next attempt while newcomers may take the lock.
pub fn on_release(s: &mut State, key: u8) {
    let n = names(key);
    let now = EPOCH_MS + s.now;
    if s.ks.get(&n[0], now).is_some() {
        return;
    }
    let Some(Data::List(queue)) = s.ks.get(&n[2], now) else {
        return;
    };
    let stays = match s.ks.get(&n[3], now) {
        Some(Data::Hash(h)) => h.clone(),
        _ => Default::default(),
    };
    let left = queue.iter().find(|o| {
        let live = stays
            .get(o)
            .and_then(|e| e.split(' ').nth(1))
            .and_then(|u| u.parse::<u64>().ok())
            .is_some_and(|until| until > now);
        let listening = parse_owner(o).is_some_and(|(c, _)| s.subs.contains(&(c, key)));
        live && listening
    });
    if let Some(o) = left.cloned() {
        violation(
            s,
            format!("stalled: a release freed key {key} and left {o} queued, though it listens"),
        );
    }
}

/// A copy of `cmd` that a lower transport sent again ran: if the request
/// that sent it is over, what it wrote is excused (it lapses with its
/// lease or queue stay), when the world excuses late copies.
pub fn on_copy(w: &World, s: &mut State, c: u8, cmd: &Cmd) {
    let Cmd::Acquire { key, owner, .. } = *cmd else {
        return;
    };
    let over = !s.clients[c as usize]
        .reqs
        .iter()
        .any(|q| q.owner == owner && !matches!(q.phase, Phase::Done(_)));
    if over && w.excuse_late_copies {
        s.ghost.excused.insert((key, c, owner));
    }
}

/// The owners a keyspace names for `key`: the holder (or readers), the
/// queue and the waiters.
fn named(ks: &Keyspace, key: u8, now: u64) -> BTreeSet<String> {
    let n = names(key);
    let mut out = BTreeSet::new();
    if let Some(Data::Str(v)) = ks.get(&n[0], now) {
        out.insert(v.split(' ').next().unwrap_or("").to_string());
    }
    if let Some(Data::Hash(h)) = ks.get(&n[0], now) {
        out.extend(h.keys().cloned());
    }
    if let Some(Data::List(l)) = ks.get(&n[2], now) {
        out.extend(l.iter().cloned());
    }
    if let Some(Data::Hash(h)) = ks.get(&n[3], now) {
        out.extend(h.keys().cloned());
    }
    if let Some(Data::ZSet(z)) = ks.get(&n[4], now) {
        out.extend(z.keys().cloned());
    }
    out
}

/// Whether the keyspace has `owner`'s hold of `key`.
fn has_hold(ks: &Keyspace, key: u8, id: &str, read: bool, now: u64) -> bool {
    let n = names(key);
    if let Some(Data::Hash(h)) = ks.get(&n[0], now) {
        return h.get(id).is_some_and(|v| lease_end(v) > now);
    }
    let holder = match ks.get(&n[0], now) {
        Some(Data::Str(v)) => v.split(' ').next().unwrap_or("").to_string(),
        _ => return false,
    };
    if read {
        holder == "~r" && matches!(ks.get(&n[4], now), Some(Data::ZSet(z)) if z.contains_key(id))
    } else {
        holder == id
    }
}

/// A failover replaced the keyspace `before` with the replica's: holders
/// whose lock it lacks hold no more (and must be told); owners it names
/// that `before` did not are excused.
pub fn on_failover(w: &World, s: &mut State, before: &Keyspace) {
    let now = EPOCH_MS + s.now;
    let holders: Vec<_> = s.ghost.holders.iter().copied().collect();
    for (key, c, owner, fence) in holders {
        let kept = has_hold(&s.ks, key, &owner_id(c, owner), owner.read, now);
        if kept {
            s.ghost.failover_under_hold.0 = true;
        } else {
            s.ghost.failover_under_hold.1 = true;
            s.ghost.lost_by_failover.insert((key, c, owner));
            if !owner.read && !owner.is_permit() {
                s.ghost.lost_fences.insert((key, fence));
            }
            if w.deployment == Deployment::SentinelAcks {
                violation(
                    s,
                    format!(
                        "acked: {} holds key {key}, and the promoted replica lacks it",
                        owner_id(c, owner)
                    ),
                );
            }
        }
    }
    for key in 0..w.keys {
        let old = named(before, key, now);
        for o in named(&s.ks, key, now).difference(&old) {
            if let Some((c, owner)) = parse_owner(o.trim_end_matches('!')) {
                s.ghost.excused.insert((key, c, owner));
            }
        }
    }
}

/// Whether `c`'s `owner` may have the lock of `key` now: it holds it, its
/// request may yet (an attempt or grant on the way), its client is
/// passing it on (a release in flight, an orphan timer), it keeps it on
/// purpose (`min_hold`, until then), its client died (until the lease
/// ends), or it is excused.
fn legit(w: &World, s: &State, key: u8, c: u8, owner: Owner) -> bool {
    let Some(cl) = s.clients.get(c as usize) else {
        return false;
    };
    if s.ghost.crashed.contains(&c) || s.ghost.excused.contains(&(key, c, owner)) {
        return true;
    }
    let releasing = |cmd: &Cmd| {
        matches!(*cmd, Cmd::Release { key: k, owner: o, .. } | Cmd::Keep { key: k, owner: o, .. }
            if k == key && o == owner)
    };
    let g = &s.ghost;
    g.holders
        .iter()
        .any(|h| h.0 == key && h.1 == c && h.2 == owner)
        || cl.reqs.iter().enumerate().any(|(r, q)| {
            q.owner == owner && acquiring(&q.phase) && w.clients[c as usize].requests[r].key == key
        })
        || cl
            .reqs
            .iter()
            .any(|q| q.owner == owner && matches!(q.phase, Phase::Releasing(_)))
        || cl.ops.values().any(|o| releasing(&o.cmd))
        || cl.out.iter().flatten().any(|sent| releasing(&sent.cmd))
        || cl.unclaimed.contains_key(&owner)
        || g.kept
            .iter()
            .any(|h| h.0 == key && h.1 == c && h.2 == owner && h.3 >= s.now)
}

/// Who has the lock of `key` in the keyspace, and whether that is legit.
pub fn occupant(w: &World, s: &State, key: u8) -> Result<(), String> {
    let n = names(key);
    let now = EPOCH_MS + s.now;
    if let Some(Data::Hash(h)) = s.ks.get(&n[0], now) {
        return permit_occupants(w, s, key, h);
    }
    let Some(Data::Str(v)) = s.ks.get(&n[0], now) else {
        return Ok(());
    };
    let holder = v.split(' ').next().unwrap_or("");
    let owners: Vec<String> = if holder == "~r" {
        match s.ks.get(&n[4], now) {
            Some(Data::ZSet(z)) => z.keys().cloned().collect(),
            _ => vec![],
        }
    } else {
        vec![holder.to_string()]
    };
    let mut why = Vec::new();
    for o in &owners {
        // A hold released with `min_hold` left is renamed `<owner>!`.
        let id = o.trim_end_matches('!');
        match parse_owner(id) {
            Some((c, owner)) if legit(w, s, key, c, owner) => {
                if s.ghost.excused.contains(&(key, c, owner)) {
                    return Ok(());
                }
                // A lock kept on purpose must not outlive its `min_hold`.
                if let Some(&(_, _, _, until)) = s
                    .ghost
                    .kept
                    .iter()
                    .find(|h| h.0 == key && h.1 == c && h.2 == owner)
                {
                    let exp =
                        s.ks.keys
                            .get(&n[0])
                            .and_then(|e| e.expires)
                            .unwrap_or(u64::MAX);
                    if !s.ghost.crashed.contains(&c) && exp > EPOCH_MS + until {
                        why.push(format!(
                            "{id} released with min_hold until {until}, but the lock lives until {}",
                            exp - EPOCH_MS
                        ));
                        continue;
                    }
                }
                return Ok(());
            }
            _ => why.push(format!(
                "the lock is held by {o}, which neither holds nor waits"
            )),
        }
    }
    if why.is_empty() {
        return Ok(());
    }
    Err(why.join("; "))
}

/// Who has a permit of `key` (entries whose lease has not ended; an
/// ended one counts for nothing), and whether each is legit; a permit
/// kept for `min_hold` (`<owner>!`) must not outlive it.
fn permit_occupants(
    w: &World,
    s: &State,
    key: u8,
    h: &crate::keyspace::Fields,
) -> Result<(), String> {
    let now = EPOCH_MS + s.now;
    let mut why = Vec::new();
    for (field, v) in h.iter() {
        let end = lease_end(v);
        if end <= now {
            continue;
        }
        let id = field.trim_end_matches('!');
        match parse_owner(id) {
            Some((c, owner)) if legit(w, s, key, c, owner) => {
                if s.ghost.excused.contains(&(key, c, owner)) || s.ghost.crashed.contains(&c) {
                    continue;
                }
                let kept = s
                    .ghost
                    .kept
                    .iter()
                    .find(|k| k.0 == key && k.1 == c && k.2 == owner);
                if let Some(&(_, _, _, until)) = kept {
                    if end > EPOCH_MS + until {
                        why.push(format!(
                            "{id} released with min_hold until {until}, but its permit lives until {}",
                            end - EPOCH_MS
                        ));
                    }
                }
            }
            _ => why.push(format!(
                "a permit is held by {field}, which neither holds nor waits"
            )),
        }
    }
    if why.is_empty() {
        Ok(())
    } else {
        Err(why.join("; "))
    }
}

/// Nothing in flight: every request over, every connection idle, no
/// grant waiting for its orphan timer.
pub fn quiescent(s: &State) -> bool {
    s.clients.iter().all(|cl| {
        cl.reqs.iter().all(|q| matches!(q.phase, Phase::Done(_)))
            && cl.ops.is_empty()
            && cl.out.iter().all(Vec::is_empty)
            && cl.inbox.iter().all(Vec::is_empty)
            && cl.sub_in.is_empty()
            && cl.unclaimed.is_empty()
    })
}

/// What a quiescent state still has besides token counters and what
/// crashed clients, `min_hold` and the excused left.
pub fn left_behind(w: &World, s: &State) -> Option<String> {
    let now = EPOCH_MS + s.now;
    for k in 0..w.keys {
        if let Err(why) = occupant(w, s, k) {
            return Some(why);
        }
        let n = names(k);
        let excused = |o: &str| {
            parse_owner(o).is_some_and(|(c, owner)| {
                s.ghost.crashed.contains(&c) || s.ghost.excused.contains(&(k, c, owner))
            })
        };
        let mut entries: Vec<String> = Vec::new();
        if let Some(Data::List(l)) = s.ks.get(&n[2], now) {
            entries.extend(l.iter().cloned());
        }
        if let Some(Data::Hash(h)) = s.ks.get(&n[3], now) {
            entries.extend(h.keys().cloned());
        }
        if let Some(o) = entries.iter().find(|o| !excused(o)) {
            return Some(format!(
                "{o} is still queued for key {k}, its request long over"
            ));
        }
    }
    None
}
