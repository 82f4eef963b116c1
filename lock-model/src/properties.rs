//! What must hold in every reachable state of a [`World`].
//!
//! A client counts as holding from when its request returns a guard until
//! its body ends (it releases) or its watchdog tells it the lock is lost.
//! Runs are finite (every fault has a budget, every request a deadline,
//! every body an end), so the two "eventually" properties are checked
//! where a run can end: when a waiter gives up busy, something real must
//! have kept it out; once nothing is in flight any more, nothing may be
//! left behind.

use stateright::Property;

use crate::keyspace::Data;
use crate::world::{acquiring, names, owner_id, Owner, Phase, State, World, EPOCH_MS};

pub const MUTUAL_EXCLUSION: &str = "never two write holders, nor a reader beside a writer";
pub const FENCES_RISE: &str = "a holder's token is above every earlier writer's";
pub const TTLS: &str = "no key without a TTL except the fence counter";
pub const ORPHANS_PASSED_ON: &str = "an orphaned grant is passed on";
pub const WAITERS_SERVED: &str = "a waiter whose wait outlasts the holders gets the lock";
pub const NOTHING_LEFT: &str = "nothing is left behind once nobody holds or waits";
pub const HANDED_OVER: &str = "a release hands the lock to a waiter (sometimes)";

pub fn all() -> Vec<Property<World>> {
    vec![
        Property::always(MUTUAL_EXCLUSION, |_, s: &State| mutual_exclusion(s)),
        Property::always(FENCES_RISE, |_, s: &State| {
            !s.ghost
                .violation
                .as_deref()
                .is_some_and(|v| v.starts_with("fence"))
        }),
        Property::always(TTLS, |_, s: &State| {
            s.ks.keys
                .iter()
                .all(|(k, e)| k.ends_with(":fence") || e.expires.is_some())
        }),
        Property::always(ORPHANS_PASSED_ON, |w: &World, s: &State| {
            !quiescent(s) || (0..w.keys).all(|k| occupant(w, s, k).is_ok())
        }),
        Property::always(WAITERS_SERVED, |_, s: &State| {
            !s.ghost
                .violation
                .as_deref()
                .is_some_and(|v| v.starts_with("starved"))
        }),
        Property::always(NOTHING_LEFT, |w: &World, s: &State| {
            !quiescent(s) || left_behind(w, s).is_none()
        }),
        Property::sometimes(HANDED_OVER, |_, s: &State| s.ghost.handed_over),
    ]
}

fn mutual_exclusion(s: &State) -> bool {
    let mut by_key: std::collections::BTreeMap<u8, (u32, u32)> = Default::default();
    for &(k, _, o, _) in &s.ghost.holders {
        let e = by_key.entry(k).or_default();
        if o.read {
            e.1 += 1;
        } else {
            e.0 += 1;
        }
    }
    by_key.values().all(|&(w, r)| w <= 1 && (w == 0 || r == 0))
}

/// A request just returned a guard.
pub fn on_hold(s: &mut State, key: u8, c: u8, owner: Owner, fence: u64) {
    let g = &mut s.ghost;
    let max = g.max_fence.get(&key).copied().unwrap_or(0);
    let below = if owner.read {
        fence < max
    } else {
        fence <= max
    };
    if below && g.violation.is_none() {
        g.violation = Some(format!(
            "fence: {} holds key {key} with token {fence}, not above {max} of an earlier writer",
            owner_id(c, owner)
        ));
    }
    if !owner.read {
        g.max_fence.insert(key, max.max(fence));
    }
    g.holders.insert((key, c, owner, fence));
    g.free_since.remove(&key);
}

/// A holder's hold ended (released, lost, or crashed); `kept_until`: the
/// lock stays taken on purpose until then (model ms).
pub fn on_leave(s: &mut State, key: u8, c: u8, owner: Owner, kept_until: Option<u64>) {
    let now = s.now;
    let g = &mut s.ghost;
    g.holders
        .retain(|&(k, hc, o, _)| !(k == key && hc == c && o == owner));
    if let Some(until) = kept_until {
        g.kept.insert((key, c, owner, until));
    }
    if !g.holders.iter().any(|h| h.0 == key) {
        let kept = g
            .kept
            .iter()
            .filter(|h| h.0 == key)
            .map(|h| h.3)
            .max()
            .unwrap_or(0);
        g.free_since.insert(key, now.max(kept));
    }
}

/// A request gave up busy: something real must have kept it out.
pub fn on_timeout(w: &World, s: &mut State, c: u8, r: u8) {
    let key = w.clients[c as usize].requests[r as usize].key;
    if let Err(why) = occupant(w, s, key) {
        if s.ghost.violation.is_none() {
            let owner = s.clients[c as usize].reqs[r as usize].owner;
            s.ghost.violation = Some(format!(
                "starved: {} gave up waiting for key {key}: {why}",
                owner_id(c, owner)
            ));
        }
    }
}

/// Whether `c`'s `owner` may have the lock of `key` now: it holds it, its
/// request may yet (an attempt or grant on the way), its client is
/// passing it on (a release in flight, an orphan timer), it keeps it on
/// purpose (`min_hold`, until then), or its client died (until the lease
/// ends).
fn legit(w: &World, s: &State, key: u8, c: u8, owner: Owner) -> bool {
    let Some(cl) = s.clients.get(c as usize) else {
        return false;
    };
    if s.ghost.crashed.contains(&c) {
        return true;
    }
    let g = &s.ghost;
    g.holders.iter().any(|h| h.0 == key && h.1 == c && h.2 == owner)
        || cl
            .reqs
            .iter()
            .enumerate()
            .any(|(r, q)| q.owner == owner && acquiring(&q.phase) && w.clients[c as usize].requests[r].key == key)
        || cl.reqs.iter().any(|q| q.owner == owner && matches!(q.phase, Phase::Releasing(_)))
        || cl.ops.values().any(|o| {
            matches!(&o.cmd, crate::world::Cmd::Release { key: k, owner: ow } | crate::world::Cmd::Renew { key: k, owner: ow, .. } if *k == key && *ow == owner)
        })
        || cl.out.iter().flatten().any(|sent| {
            matches!(&sent.cmd, crate::world::Cmd::Release { key: k, owner: ow } if *k == key && *ow == owner)
        })
        || cl.unclaimed.contains_key(&owner)
        || g.kept
            .iter()
            .any(|h| h.0 == key && h.1 == c && h.2 == owner && h.3 >= s.now)
}

/// Who has the lock of `key` in the keyspace, and whether that is legit.
pub fn occupant(w: &World, s: &State, key: u8) -> Result<(), String> {
    let n = names(key);
    let now = EPOCH_MS + s.now;
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
        match parse(o) {
            Some((c, owner)) if legit(w, s, key, c, owner) => {
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
                            "{o} released with min_hold until {until}, but the lock lives until {}",
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

fn parse(o: &str) -> Option<(u8, Owner)> {
    let (c, rest) = o.split_once(':')?;
    let c: u8 = c.strip_prefix('c')?.parse().ok()?;
    let (read, n) = match rest.strip_prefix('r') {
        Some(n) => (true, n),
        None => (false, rest),
    };
    Some((
        c,
        Owner {
            n: n.parse().ok()?,
            read,
        },
    ))
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

/// What a quiescent state still has besides fence counters and what
/// crashed clients and `min_hold` left.
pub fn left_behind(w: &World, s: &State) -> Option<String> {
    let now = EPOCH_MS + s.now;
    for k in 0..w.keys {
        if let Err(why) = occupant(w, s, k) {
            return Some(why);
        }
        let n = names(k);
        let crashed = |o: &str| parse(o).is_some_and(|(c, _)| s.ghost.crashed.contains(&c));
        let mut entries: Vec<String> = Vec::new();
        if let Some(Data::List(l)) = s.ks.get(&n[2], now) {
            entries.extend(l.iter().cloned());
        }
        if let Some(Data::Hash(h)) = s.ks.get(&n[3], now) {
            entries.extend(h.keys().cloned());
        }
        if let Some(o) = entries.iter().find(|o| !crashed(o)) {
            return Some(format!(
                "{o} is still queued for key {k}, its request long over"
            ));
        }
    }
    None
}
