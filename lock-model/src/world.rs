//! The world: one server (keyspace, clock, pub/sub, and on Sentinel a
//! replica that may lag), up to three clients each running lock requests,
//! and a hostile network between them, as a stateright [`Model`].
//!
//! Each client has a command connection (ordered), a pub/sub connection,
//! and on Sentinel with `replica_acks` a second command connection for
//! acquires (followed by `WAIT`; on one Redis, the I/O thread's connection
//! for renewals where the world says so). The server runs the head of any
//! connection's queue: the real scripts through [`crate::host`], called as
//! [`crate::calls`] says. Faults, each behind a budget in
//! [`crate::plan::Faults`]: a command runs but its reply is lost (the
//! runtime's transport sends it again, a queuing attempt with the rejoin
//! flag, as `node.rs` does); a command is repeated verbatim by a lower
//! transport (Cluster's own retries, Sentinel's `on_primary`); one
//! connection is slow (time passes while its messages are in flight, so its
//! replies come late against pub/sub and the other connections); a request
//! is cancelled at any await; a client crashes; the primary fails over to a
//! replica that lacks the last writes, or every write since its replication
//! stalled. The clock moves from one timer to the next, so leases,
//! `min_hold` and `max_hold` pass.
//!
//! The clients decide as the runtime does: every decision is a call into
//! the runtime's protocol core through [`crate::decide`]. What this file
//! adds is the runtime's I/O, and where the two correspond:
//! - an acquire's send is bounded as `node.rs::retrying_by` bounds it
//!   (`op_timeout`, or the request's `by`, at least `MIN_SEND`);
//! - an undo (`Backend::undo`) travels on the connection its attempt took
//!   (the acks connection on Sentinel with `replica_acks`), behind it;
//!   releases, renewals and keeps take the main connection;
//! - a `WAIT` short of acknowledgements (or, here, a lost `WAIT` reply:
//!   the runtime pipelines it with the acquire, where a cut fails both)
//!   fails the attempt: the Sentinel backend releases the lock behind the
//!   acquire on its connection and gives it back, and the request tries
//!   again under a new owner id (`sentinel.rs::acquire`,
//!   `Fault::GivenBack`); the client's journal of releases replayed after
//!   a failover (`sentinel/journal.rs`) is not modelled;
//! - a request's claim (`claims.rs`) lives from its start to its end: its
//!   mailbox is in [`Req`];
//! - a renewal is bounded by its round's limit (`watchdog.rs::tick`: the
//!   earliest deadline of the batch, at least 5 ms, within `op_timeout`);
//!   with [`World::io_conn`] it goes over the I/O thread's connection, not
//!   the caller's; on Sentinel with `replica_acks` a `WAIT` follows it and
//!   only an acknowledged renewal moves the deadline.
//!
//! What a world checks is in [`crate::plan`], what its state holds in
//! [`crate::state`]; this file moves the state, and the properties
//! ([`crate::properties`]) judge it.

use std::collections::{BTreeMap, BTreeSet};

use stateright::{Model, Property};

use crate::calls::{self, Call};
use crate::decide::{self, Answer, Failed, Listening, Next, Route, Tick, Verdict};
use crate::host;
use crate::keyspace::{Keyspace, Reply};
use crate::plan::{Deployment, Plan, World, ACKS, FAILOVER_MS, IO, MAIN};
use crate::properties;
use crate::state::{
    acquiring, owner_id, parse_owner, Action, Back, Client, Cmd, Fault, Ghost, Grant, Op, Outcome,
    Owner, Phase, Push, Renewal, ReplyKey, Req, Sent, Slot, State, Task, Timer, EPOCH_MS,
};

/// The least a renewal round waits for its answers (`watchdog.rs::tick`).
pub const ROUND_MIN: u64 = 5;

impl World {
    fn plan(&self, c: u8, r: u8) -> &Plan {
        &self.clients[c as usize].requests[r as usize]
    }

    fn needs_confirming(&self) -> bool {
        self.deployment == Deployment::SentinelAcks
    }

    /// The connection an acquire goes on.
    fn acquire_conn(&self) -> u8 {
        match self.deployment {
            Deployment::Redis | Deployment::Sentinel => MAIN,
            Deployment::SentinelAcks => ACKS,
        }
    }

    /// The connection an undo goes on (`Backend::undo`): the attempt's.
    fn undo_conn(&self) -> u8 {
        if self.defects.undo_on_main {
            MAIN
        } else {
            self.acquire_conn()
        }
    }

    /// The connection the watchdog's renewals take.
    fn renew_conn(&self) -> u8 {
        if self.io_conn {
            IO
        } else {
            MAIN
        }
    }

    /// Whether a renewal moves the deadline only once the replicas have it.
    fn renewals_confirmed(&self) -> bool {
        self.deployment == Deployment::SentinelAcks && !self.defects.renewal_unacked
    }

    fn is_slow(&self, c: u8, conn: u8) -> bool {
        self.faults.slow == Some((c, conn))
    }

    /// Send `cmd` for `task` on `conn`; `by`: the request's bound on an
    /// acquire (`node.rs::retrying_by`).
    fn send(&self, s: &mut State, c: u8, conn: u8, cmd: Cmd, task: Task, by: Option<u64>) -> u8 {
        let now = s.now;
        let mut deadline = now + self.timing.op_timeout;
        if let Some(by) = by {
            deadline = deadline.min(by.max(now + self.timing.min_send));
        }
        self.send_until(s, c, conn, cmd, task, deadline)
    }

    /// Send `cmd` for `task` on `conn`, failing with no answer by
    /// `deadline`.
    fn send_until(
        &self,
        s: &mut State,
        c: u8,
        conn: u8,
        cmd: Cmd,
        task: Task,
        deadline: u64,
    ) -> u8 {
        let now = s.now;
        let cl = &mut s.clients[c as usize];
        let op = cl.next_op;
        cl.next_op += 1;
        cl.ops.insert(
            op,
            Op {
                conn,
                cmd: cmd.clone(),
                task,
                deadline,
                sent_at: now,
            },
        );
        cl.out[conn as usize].push(Sent {
            op,
            cmd,
            copy: false,
        });
        op
    }

    /// `client.release_in_background`: the main connection.
    fn release_in_background(&self, s: &mut State, c: u8, key: u8, owner: Owner) {
        self.send(
            s,
            c,
            MAIN,
            Cmd::Release {
                key,
                owner,
                fence: 0,
            },
            Task::Background,
            None,
        );
    }

    /// `client.undo_in_background` (`Backend::undo`).
    fn undo_in_background(&self, s: &mut State, c: u8, key: u8, owner: Owner) {
        let conn = self.undo_conn();
        self.send(
            s,
            c,
            conn,
            Cmd::Release {
                key,
                owner,
                fence: 0,
            },
            Task::Background,
            None,
        );
    }

    // ---------------------------------------------------------------- server

    fn run(&self, s: &mut State, call: Call) -> Reply {
        let subs: BTreeMap<String, i64> = s
            .subs
            .iter()
            .map(|&(c, k)| (calls::grant_channel(k, c), 1))
            .collect();
        let keys: Vec<&str> = call.keys.iter().map(String::as_str).collect();
        let args: Vec<&str> = call.args.iter().map(String::as_str).collect();
        let before = s.replica.is_none() && self.faults.failover > 0 && s.budget.failover > 0;
        let snapshot = before.then(|| s.ks.clone());
        let out = host::eval(
            call.script,
            &mut s.ks,
            EPOCH_MS + s.now,
            &subs,
            &keys,
            &args,
        );
        if let Some(snap) = snapshot {
            if snap != s.ks {
                // The replica lacks this write until it catches up.
                s.replica = Some(snap);
            }
        }
        for (channel, msg) in out.published {
            let Some((_, ch_client)) = channel.rsplit_once(":granted:c") else {
                continue;
            };
            let Ok(to) = ch_client.parse::<u8>() else {
                continue;
            };
            let key = (0..self.keys).find(|&k| channel == calls::grant_channel(k, to));
            let mut parts = msg.split(' ');
            let (Some(key), Some(o), Some(f), Some(at)) =
                (key, parts.next(), parts.next(), parts.next())
            else {
                continue;
            };
            let (Some((_, owner)), Ok(fence), Ok(at)) = (parse_owner(o), f.parse(), at.parse())
            else {
                continue;
            };
            if s.subs.contains(&(to, key)) {
                s.ghost.handed_over = true;
                s.clients[to as usize].sub_in.push(Push::Grant {
                    key,
                    owner,
                    fence,
                    at,
                });
            }
        }
        out.reply
    }

    /// The server runs one command.
    fn execute(&self, s: &mut State, c: u8, cmd: &Cmd) -> ReplyKey {
        let d = &self.defects;
        match *cmd {
            Cmd::Acquire {
                key,
                owner,
                lease,
                stay,
                ..
            } if owner.is_permit() => {
                let id = owner_id(c, owner);
                let call = calls::permit(
                    key,
                    &id,
                    lease,
                    stay,
                    self.timing.fence_ttl,
                    d.permit_admits_one_more,
                );
                let reply = ReplyKey::Acquire(read_acquire(&self.run(s, call)));
                properties::on_permit_script(s, key);
                reply
            }
            Cmd::Release { key, owner, .. } if owner.is_permit() => {
                let id = owner_id(c, owner);
                let call = calls::release_permit(
                    key,
                    &id,
                    self.timing.fence_ttl,
                    d.release_permit_before_fix,
                );
                let reply = match self.run(s, call) {
                    Reply::Int(i) => ReplyKey::Int(i),
                    other => panic!("release_permit.lua answered {other:?}"),
                };
                properties::on_permit_script(s, key);
                reply
            }
            Cmd::Keep { key, owner, left } if owner.is_permit() && !d.keep_by_renewal => {
                let id = owner_id(c, owner);
                match self.run(
                    s,
                    calls::keep_permit(key, &id, left, d.keep_permit_before_fix),
                ) {
                    Reply::Int(i) => ReplyKey::Flag(i == 1),
                    other => panic!("keep_permit.lua answered {other:?}"),
                }
            }
            Cmd::StillQueued { key, owner } if owner.is_permit() => {
                let id = owner_id(c, owner);
                let [waiting, held] = calls::still_queued_permit(key, &id);
                let yes =
                    self.run(s, waiting) == Reply::Int(1) || self.run(s, held) == Reply::Int(1);
                ReplyKey::Flag(yes)
            }
            Cmd::Acquire {
                key,
                owner,
                lease,
                stay,
                rejoin,
            } => {
                let id = owner_id(c, owner);
                let call = calls::acquire(
                    key,
                    &id,
                    lease,
                    (stay, rejoin),
                    self.timing.fence_ttl,
                    d.acquire_before_fixes,
                );
                ReplyKey::Acquire(read_acquire(&self.run(s, call)))
            }
            Cmd::Release { key, owner, fence } => {
                let id = owner_id(c, owner);
                let call = calls::release(
                    key,
                    &id,
                    fence,
                    self.timing.fence_ttl,
                    d.release_before_fixes,
                );
                let queued = properties::queued_behind(s, key);
                let reply = match self.run(s, call) {
                    Reply::Int(i) => ReplyKey::Int(i),
                    other => panic!("release.lua answered {other:?}"),
                };
                if queued {
                    properties::on_release(s, key);
                }
                reply
            }
            Cmd::Renew { key, owner, lease } => {
                let call = calls::renew(key, &owner_id(c, owner), owner.read, lease);
                ReplyKey::Flag(read_renewed(&self.run(s, call)))
            }
            Cmd::Keep { key, owner, left } => {
                let id = owner_id(c, owner);
                if d.keep_by_renewal {
                    // As `guard.rs::keep` did before `keep.lua`: a
                    // renewal with the time left as its lease.
                    let call = calls::renew(key, &id, owner.read, left);
                    ReplyKey::Flag(read_renewed(&self.run(s, call)))
                } else {
                    match self.run(s, calls::keep(key, &id, left)) {
                        Reply::Int(i) => ReplyKey::Flag(i == 1),
                        other => panic!("keep.lua answered {other:?}"),
                    }
                }
            }
            Cmd::StillQueued { key, owner } => {
                let id = owner_id(c, owner);
                let [hexists, get, zscore] = calls::still_queued(key, &id);
                let queued = self.run(s, hexists) == Reply::Int(1);
                let value = self.run(s, get);
                let reads = self.run(s, zscore);
                let holder = match &value {
                    Reply::Bulk(v) => v.split(' ').next().map(str::to_string),
                    _ => None,
                };
                let yes = queued
                    || holder.as_deref() == Some(id.as_str())
                    || (reads != Reply::Nil && holder.as_deref() == Some("~r"));
                ReplyKey::Flag(yes)
            }
            // The replicas acknowledge: `WAIT` answers once they have every
            // write so far; a stalled replica never does.
            Cmd::Wait if s.stalled => ReplyKey::Int(0),
            Cmd::Wait => {
                s.replica = None;
                ReplyKey::Int(1)
            }
        }
    }

    // ---------------------------------------------------------------- clients

    /// Start (or go round) the acquire loop: send an attempt.
    fn send_attempt(&self, s: &mut State, c: u8, r: u8) {
        let now = s.now;
        let (key, lease) = {
            let p = self.plan(c, r);
            (p.key, p.lease)
        };
        let req = &mut s.clients[c as usize].reqs[r as usize];
        let a = decide::attempt(&mut req.acq, now, &self.timing);
        let owner = req.owner;
        let op = self.send(
            s,
            c,
            self.acquire_conn(),
            Cmd::Acquire {
                key,
                owner,
                lease,
                stay: a.stay,
                rejoin: a.rejoin,
            },
            Task::Req(r),
            a.by,
        );
        s.clients[c as usize].reqs[r as usize].phase = Phase::Attempting(op);
    }

    /// A new owner id for a request of `p`'s kind.
    fn new_owner(s: &mut State, c: u8, p: &Plan) -> Owner {
        let cl = &mut s.clients[c as usize];
        cl.next_owner += 1;
        Owner {
            n: cl.next_owner,
            read: p.read,
            permits: p.permits,
        }
    }

    fn start_request(&self, s: &mut State, c: u8, r: u8) {
        let p = self.plan(c, r).clone();
        let owner = Self::new_owner(s, c, &p);
        let now = s.now;
        let req = &mut s.clients[c as usize].reqs[r as usize];
        req.owner = owner;
        req.acq = decide::start(now, p.wait, &self.timing);
        self.send_attempt(s, c, r);
    }

    /// The waiter leaves its slot (`Waiter::drop` → `Wakeups::leave`).
    fn leave_slot(&self, s: &mut State, c: u8, r: u8) {
        let key = self.plan(c, r).key;
        let now = s.now;
        let cl = &mut s.clients[c as usize];
        let req = &mut cl.reqs[r as usize];
        if !req.waiter {
            return;
        }
        req.waiter = false;
        if let Some(slot) = cl.slots.get_mut(&key) {
            slot.waiters -= 1;
            if slot.waiters == 0 {
                slot.linger = Some(now + self.timing.linger);
            }
        }
    }

    /// The request ends without a guard (`Unsure::drop`, `Waiter::drop`,
    /// `Claim::drop`).
    fn end_request(&self, s: &mut State, c: u8, r: u8, failed: Failed) {
        // Its commands in flight run or not; their answers go nowhere.
        s.clients[c as usize]
            .ops
            .retain(|_, o| o.task != Task::Req(r));
        Self::unsent_if_down(s, c);
        self.leave_slot(s, c, r);
        let key = self.plan(c, r).key;
        let req = &mut s.clients[c as usize].reqs[r as usize];
        req.phase = Phase::Done(Outcome::Failed(failed));
        req.mailbox = None;
        let (pending, owner) = (req.acq.pending, req.owner);
        if pending {
            self.undo_in_background(s, c, key, owner);
        }
        if failed == Failed::Timeout {
            properties::on_timeout(self, s, c, r);
        }
    }

    /// Carry out what the acquire loop decided.
    fn follow(&self, s: &mut State, c: u8, r: u8, next: Next) {
        match next {
            Next::Hold {
                fence,
                from,
                settle,
            } => {
                if settle {
                    // `Claim::settle`: a grant already in the mailbox is
                    // dropped; one still on its way is expected.
                    let cl = &mut s.clients[c as usize];
                    let req = &mut cl.reqs[r as usize];
                    if req.mailbox.take().is_none() {
                        cl.settled.insert(req.owner);
                    }
                }
                self.hold(s, c, r, fence, from)
            }
            Next::Late { pause, undo } => {
                // Undone in the background under the old owner id (unless
                // given back already); the request goes on under a new
                // one, with a new claim.
                let key = self.plan(c, r).key;
                let old = s.clients[c as usize].reqs[r as usize].owner;
                if undo {
                    self.undo_in_background(s, c, key, old);
                }
                self.leave_slot(s, c, r);
                let p = self.plan(c, r).clone();
                let owner = Self::new_owner(s, c, &p);
                let req = &mut s.clients[c as usize].reqs[r as usize];
                req.owner = owner;
                req.mailbox = None;
                match pause {
                    Ok(until) => req.phase = Phase::Pausing(until),
                    Err(f) => self.end_request(s, c, r, f),
                }
            }
            Next::Pause { until } => {
                s.clients[c as usize].reqs[r as usize].phase = Phase::Pausing(until)
            }
            Next::GiveUp(f) => self.end_request(s, c, r, f),
            Next::Listen => {
                let key = self.plan(c, r).key;
                let cl = &mut s.clients[c as usize];
                if cl.reqs[r as usize].waiter {
                    self.nap(s, c, r);
                    return;
                }
                // `Wakeups::join`; with race 1's switch, a grant kept
                // unclaimed for a waiter about to register is its own.
                let owner = cl.reqs[r as usize].owner;
                if let Some((_, g, _)) = cl.unclaimed.remove(&owner) {
                    cl.reqs[r as usize].mailbox = Some(g);
                }
                let slot = cl.slots.entry(key).or_default();
                slot.waiters += 1;
                slot.linger = None;
                cl.reqs[r as usize].waiter = true;
                if slot.ready {
                    self.nap(s, c, r);
                } else {
                    cl.sub_out.push((true, key));
                    cl.reqs[r as usize].phase = Phase::Subscribing;
                }
            }
        }
    }

    /// Nap until the next attempt, unless the mailbox has a grant already
    /// (`Waiter::released` looks there first).
    fn nap(&self, s: &mut State, c: u8, r: u8) {
        let now = s.now;
        let lease = self.plan(c, r).lease;
        let req = &mut s.clients[c as usize].reqs[r as usize];
        match req.mailbox.take() {
            Some(g) => self.granted(s, c, r, g),
            None => {
                req.phase = Phase::Napping(decide::nap_until(
                    &req.acq,
                    req.ttl,
                    lease,
                    now,
                    &self.timing,
                ));
            }
        }
    }

    /// `Woken::Granted` in the acquire loop.
    fn granted(&self, s: &mut State, c: u8, r: u8, g: Grant) {
        let now = s.now;
        let confirming = self.needs_confirming();
        let lease = self.plan(c, r).lease;
        let req = &mut s.clients[c as usize].reqs[r as usize];
        match decide::on_grant(
            &mut req.acq,
            now,
            (g.fence, g.at),
            confirming,
            lease,
            &self.timing,
        ) {
            None => self.send_attempt(s, c, r),
            Some(next) => self.follow(s, c, r, next),
        }
    }

    /// The request returns a guard.
    fn hold(&self, s: &mut State, c: u8, r: u8, fence: u64, from: u64) {
        self.leave_slot(s, c, r);
        let p = self.plan(c, r).clone();
        let now = s.now;
        let cl = &mut s.clients[c as usize];
        let owner = cl.reqs[r as usize].owner;
        cl.watchdog.insert(
            owner,
            Renewal {
                key: p.key,
                lease: p.lease,
                r: decide::start_renewing(p.lease, from, p.max_hold.map(|m| from + m)),
                sending: None,
            },
        );
        let req = &mut cl.reqs[r as usize];
        req.mailbox = None;
        req.held_from = from;
        req.held_fence = fence;
        req.phase = Phase::Held {
            fence,
            from,
            body_end: now + p.body,
        };
        properties::on_hold(s, p.key, c, owner, fence);
    }

    /// The watchdog found the hold lost: the body stops (`OnLost::Abort`)
    /// and its guard is dropped (`Hold::end_in_background`).
    fn lose(&self, s: &mut State, c: u8, owner: Owner) {
        s.clients[c as usize].watchdog.remove(&owner);
        let Some(r) = s.clients[c as usize]
            .reqs
            .iter()
            .position(|q| q.owner == owner && matches!(q.phase, Phase::Held { .. }))
        else {
            return;
        };
        let r = r as u8;
        let Phase::Held { fence, from, .. } = s.clients[c as usize].reqs[r as usize].phase else {
            unreachable!()
        };
        let p = self.plan(c, r).clone();
        properties::on_leave(s, p.key, c, owner, None);
        self.end_in_background(s, c, p.key, owner, (fence, from), p.min_hold);
        s.clients[c as usize].reqs[r as usize].phase = Phase::Done(Outcome::Lost);
    }

    /// A guard's release command: keep (`min_hold` left) or release.
    /// (`fence`: the hold's token.)
    fn release_cmd(
        &self,
        now: u64,
        key: u8,
        owner: Owner,
        (fence, from): (u64, u64),
        min: Option<u64>,
    ) -> Cmd {
        match decide::keep_for(from, min, now) {
            Some(left) => Cmd::Keep { key, owner, left },
            // A writer's release sends its hold's value, a reader's its
            // owner id (`Backend::release_held`).
            None => Cmd::Release {
                key,
                owner,
                fence: if owner.read { 0 } else { fence },
            },
        }
    }

    /// `Hold::end_in_background`: keep or release, on the main connection.
    fn end_in_background(
        &self,
        s: &mut State,
        c: u8,
        key: u8,
        owner: Owner,
        held: (u64, u64),
        min: Option<u64>,
    ) {
        let cmd = self.release_cmd(s.now, key, owner, held, min);
        self.send(s, c, MAIN, cmd, Task::Background, None);
    }

    /// The body is done: `guard.release()` (`release_one`).
    fn body_done(&self, s: &mut State, c: u8, r: u8) {
        let p = self.plan(c, r).clone();
        let Phase::Held { fence, from, .. } = s.clients[c as usize].reqs[r as usize].phase else {
            unreachable!()
        };
        let owner = s.clients[c as usize].reqs[r as usize].owner;
        // Renewals stop first (a renewal already on the wire goes on).
        s.clients[c as usize].watchdog.remove(&owner);
        let cmd = self.release_cmd(s.now, p.key, owner, (fence, from), p.min_hold);
        let kept = matches!(cmd, Cmd::Keep { .. }).then(|| from + p.min_hold.unwrap_or(0));
        properties::on_leave(s, p.key, c, owner, kept);
        let op = self.send(s, c, MAIN, cmd, Task::Req(r), None);
        s.clients[c as usize].reqs[r as usize].phase = Phase::Releasing(op);
    }

    /// An attempt's answer reached the request (after `WAIT` on Sentinel).
    fn answered(&self, s: &mut State, c: u8, r: u8, a: Answer) {
        let now = s.now;
        let lease = self.plan(c, r).lease;
        let req = &mut s.clients[c as usize].reqs[r as usize];
        if let Answer::Busy { ttl, .. } = a {
            req.ttl = ttl;
        }
        let next = decide::on_answer(&mut req.acq, now, a, lease, &self.timing);
        self.follow(s, c, r, next);
    }

    /// A command's answer (or its failure: `None`) reached its task.
    fn to_task(&self, s: &mut State, c: u8, op: u8, task: Task, reply: Option<ReplyKey>) {
        match task {
            Task::Background => {}
            Task::Renewal(owner) => {
                let now = s.now;
                let Some(e) = s.clients[c as usize].watchdog.get_mut(&owner) else {
                    return;
                };
                let Some((sent_op, sent_at, sent, limit)) = e.sending else {
                    return;
                };
                if sent_op != op {
                    return;
                }
                if self.renewals_confirmed() && reply == Some(ReplyKey::Flag(true)) {
                    // The primary renewed: the deadline moves once the
                    // replicas have it too (a `WAIT` behind the renewal on
                    // its connection, within the round's limit).
                    let conn = self.renew_conn();
                    let w = self.send_until(s, c, conn, Cmd::Wait, Task::Renewal(owner), limit);
                    let e = s.clients[c as usize].watchdog.get_mut(&owner).unwrap();
                    e.sending = Some((w, sent_at, sent, limit));
                    return;
                }
                e.sending = None;
                let verdict = match reply {
                    Some(ReplyKey::Flag(true)) | Some(ReplyKey::Int(1)) => Verdict::Renewed,
                    Some(ReplyKey::Flag(false)) => Verdict::NotOwner,
                    // No answer, or a `WAIT` the replicas did not meet.
                    _ => Verdict::NoAnswer,
                };
                let lease = e.lease;
                let lost = decide::on_renewed(&mut e.r, verdict, (sent_at, sent), lease, now);
                let key = e.key;
                properties::on_renewal_answer(s, (key, c, owner), verdict, lost);
                if lost {
                    self.lose(s, c, owner);
                }
            }
            Task::Req(r) => {
                let phase = s.clients[c as usize].reqs[r as usize].phase.clone();
                match phase {
                    Phase::Attempting(o) if o == op => {
                        let a = match reply {
                            Some(ReplyKey::Acquire(a)) => a,
                            _ => Answer::Transient { ran: true },
                        };
                        if self.needs_confirming() && matches!(a, Answer::Granted { .. }) {
                            let w = self.send(s, c, ACKS, Cmd::Wait, Task::Req(r), None);
                            s.clients[c as usize].reqs[r as usize].phase = Phase::Acking(w, a);
                        } else {
                            self.answered(s, c, r, a);
                        }
                    }
                    Phase::Acking(o, a) if o == op => {
                        if reply == Some(ReplyKey::Int(1)) {
                            self.answered(s, c, r, a);
                        } else {
                            // No word from the replicas (or too few): the
                            // attempt releases the lock behind the acquire
                            // on its connection, then gives it back.
                            let key = self.plan(c, r).key;
                            let owner = s.clients[c as usize].reqs[r as usize].owner;
                            let cmd = Cmd::Release {
                                key,
                                owner,
                                fence: 0,
                            };
                            let op = self.send(s, c, ACKS, cmd, Task::Req(r), None);
                            s.clients[c as usize].reqs[r as usize].phase = Phase::Unacking(op);
                        }
                    }
                    Phase::Unacking(o) if o == op => {
                        let released = reply.is_some();
                        self.answered(s, c, r, Answer::GivenBack { released });
                    }
                    Phase::Checking(o) if o == op => {
                        if reply == Some(ReplyKey::Flag(true)) {
                            self.nap(s, c, r);
                        } else {
                            self.send_attempt(s, c, r);
                        }
                    }
                    Phase::Releasing(o) if o == op => {
                        s.clients[c as usize].reqs[r as usize].phase =
                            Phase::Done(Outcome::Released);
                    }
                    _ => {}
                }
            }
        }
    }

    fn deliver(&self, s: &mut State, c: u8, conn: u8) {
        let Back { op, reply } = s.clients[c as usize].inbox[conn as usize].remove(0);
        let Some(o) = s.clients[c as usize].ops.get(&op).cloned() else {
            return;
        };
        match reply {
            // `WAIT` is not sent again (`RedisNode::command`): the attempt
            // fails.
            None if o.cmd == Cmd::Wait => {
                s.clients[c as usize].ops.remove(&op);
                self.to_task(s, c, op, o.task, None);
            }
            None => {
                // The connection was cut after the command ran: the
                // transport sends it again (`node.rs::retrying`); a queuing
                // attempt sent again says it may have queued.
                let cmd = match o.cmd {
                    Cmd::Acquire {
                        key,
                        owner,
                        lease,
                        stay,
                        rejoin,
                    } => Cmd::Acquire {
                        key,
                        owner,
                        lease,
                        stay,
                        rejoin: rejoin || stay.is_some(),
                    },
                    other => other,
                };
                let cl = &mut s.clients[c as usize];
                cl.ops.get_mut(&op).unwrap().cmd = cmd.clone();
                cl.out[conn as usize].push(Sent {
                    op,
                    cmd,
                    copy: false,
                });
            }
            Some(reply) => {
                s.clients[c as usize].ops.remove(&op);
                self.to_task(s, c, op, o.task, Some(reply));
            }
        }
    }

    fn deliver_push(&self, s: &mut State, c: u8) {
        let push = s.clients[c as usize].sub_in.remove(0);
        let now = s.now;
        match push {
            Push::Subscribed(k) => {
                let cl = &mut s.clients[c as usize];
                if let Some(slot) = cl.slots.get_mut(&k) {
                    slot.ready = true;
                }
                let Some(r) = (0..cl.reqs.len() as u8).find(|&r| {
                    cl.reqs[r as usize].phase == Phase::Subscribing && self.plan(c, r).key == k
                }) else {
                    return;
                };
                match decide::listening(&cl.reqs[r as usize].acq, true) {
                    Listening::AskQueued => {
                        let owner = cl.reqs[r as usize].owner;
                        let cmd = Cmd::StillQueued { key: k, owner };
                        let op = self.send(s, c, MAIN, cmd, Task::Req(r), None);
                        s.clients[c as usize].reqs[r as usize].phase = Phase::Checking(op);
                    }
                    Listening::AttemptAgain => self.send_attempt(s, c, r),
                    Listening::Wait => self.nap(s, c, r),
                }
            }
            Push::Grant {
                key,
                owner,
                fence,
                at,
            } => {
                let cl = &mut s.clients[c as usize];
                let req = cl
                    .reqs
                    .iter()
                    .position(|q| q.owner == owner && acquiring(&q.phase));
                // Whose the grant is: the request under way (`claims.rs`),
                // or, with race 1's switch, a registered waiter only.
                let live =
                    req.filter(|&r| !self.defects.orphan_ignores_inflight || cl.reqs[r].waiter);
                let g = Grant { fence, at };
                match decide::route_grant(live.is_some(), cl.settled.contains(&owner)) {
                    Route::Mailbox => {
                        let r = live.unwrap();
                        cl.reqs[r].mailbox = Some(g);
                        if matches!(cl.reqs[r].phase, Phase::Napping(_)) {
                            self.nap(s, c, r as u8);
                        }
                    }
                    Route::Settled => {
                        cl.settled.remove(&owner);
                    }
                    Route::Orphan => {
                        cl.unclaimed
                            .insert(owner, (key, g, now + self.timing.orphan_after));
                    }
                }
            }
        }
    }

    /// Every timer of the state and when it fires.
    fn timers(&self, s: &State) -> Vec<(u8, Timer, u64)> {
        let mut out = Vec::new();
        for (c, cl) in s.clients.iter().enumerate() {
            if !cl.alive {
                continue;
            }
            let c = c as u8;
            for (r, req) in cl.reqs.iter().enumerate() {
                let at = match req.phase {
                    Phase::NotStarted => Some(self.plan(c, r as u8).start),
                    Phase::Napping(t) | Phase::Pausing(t) => Some(t),
                    Phase::Held { body_end, .. } => Some(body_end),
                    _ => None,
                };
                if let Some(at) = at {
                    out.push((c, Timer::Req(r as u8), at));
                }
            }
            for (&op, o) in &cl.ops {
                out.push((c, Timer::OpDeadline(op), o.deadline));
            }
            // One round at a time (race switch): no hold is looked at while
            // any renewal of the client is out, even one whose hold ended.
            let round_out = self.defects.watchdog_one_round
                && cl.ops.values().any(|o| matches!(o.task, Task::Renewal(_)));
            for (&owner, e) in &cl.watchdog {
                if e.sending.is_none() && !round_out {
                    out.push((c, Timer::Renewal(owner), e.r.due().0));
                }
            }
            for (&owner, &(_, _, at)) in &cl.unclaimed {
                out.push((c, Timer::Orphan(owner), at));
            }
            for (&k, slot) in &cl.slots {
                if let Some(at) = slot.linger {
                    out.push((c, Timer::Linger(k), at));
                }
            }
        }
        out
    }

    fn fire(&self, s: &mut State, c: u8, timer: Timer) {
        let now = s.now;
        match timer {
            Timer::Req(r) => match s.clients[c as usize].reqs[r as usize].phase {
                Phase::NotStarted => self.start_request(s, c, r),
                Phase::Napping(_) | Phase::Pausing(_) => self.send_attempt(s, c, r),
                Phase::Held { .. } => self.body_done(s, c, r),
                _ => unreachable!(),
            },
            Timer::OpDeadline(op) => {
                let o = s.clients[c as usize].ops.remove(&op).unwrap();
                Self::unsent_if_down(s, c);
                self.to_task(s, c, op, o.task, None);
            }
            Timer::Renewal(owner) => {
                // The hold that fell due; in one round at a time (race
                // switch), with every hold that would fall due before its
                // next tick, as `watchdog.rs::tick` batches them.
                let cl = &s.clients[c as usize];
                let mut batch = vec![owner];
                if self.defects.watchdog_one_round {
                    batch.extend(cl.watchdog.iter().filter_map(|(&o, e)| {
                        let due = decide::tick(&e.r, now, e.lease) != Tick::NotYet;
                        (o != owner && e.sending.is_none() && due).then_some(o)
                    }));
                }
                let mut sends = Vec::new();
                for o in batch {
                    let e = &s.clients[c as usize].watchdog[&o];
                    match decide::tick(&e.r, now, e.lease) {
                        Tick::MaxHold => self.lose(s, c, o),
                        Tick::Renew(lease) => {
                            sends.push((o, e.key, decide::ms(lease), e.r.deadline.0))
                        }
                        Tick::NotYet => unreachable!("a renewal due but not sent"),
                    }
                }
                // The round waits for its answers until the earliest
                // deadline of its batch (at least `ROUND_MIN`), within
                // `op_timeout`.
                let Some(earliest) = sends.iter().map(|x| x.3).min() else {
                    return;
                };
                let limit = earliest
                    .max(now + ROUND_MIN)
                    .min(now + self.timing.op_timeout);
                for (o, key, lease, _) in sends {
                    let cmd = Cmd::Renew {
                        key,
                        owner: o,
                        lease,
                    };
                    let conn = self.renew_conn();
                    let op = self.send_until(s, c, conn, cmd, Task::Renewal(o), limit);
                    let e = s.clients[c as usize].watchdog.get_mut(&o).unwrap();
                    e.sending = Some((op, now, lease, limit));
                }
            }
            Timer::Orphan(owner) => {
                let cl = &mut s.clients[c as usize];
                let (key, _, _) = cl.unclaimed.remove(&owner).unwrap();
                if decide::release_orphan(cl.watchdog.contains_key(&owner)) {
                    self.release_in_background(s, c, key, owner);
                }
            }
            Timer::Linger(k) => {
                let cl = &mut s.clients[c as usize];
                if cl.slots.get(&k).is_some_and(|slot| slot.waiters == 0) {
                    cl.slots.remove(&k);
                    cl.sub_out.push((false, k));
                }
            }
        }
    }

    fn cancel(&self, s: &mut State, c: u8, r: u8) {
        let phase = s.clients[c as usize].reqs[r as usize].phase.clone();
        if let Phase::Releasing(op) = phase {
            // `Unfinished::drop`: the release (or keep) goes on in the
            // background.
            s.clients[c as usize].ops.remove(&op);
            let p = self.plan(c, r).clone();
            let req = &s.clients[c as usize].reqs[r as usize];
            let (owner, held) = (req.owner, (req.held_fence, req.held_from));
            self.end_in_background(s, c, p.key, owner, held, p.min_hold);
            s.clients[c as usize].reqs[r as usize].phase = Phase::Done(Outcome::Released);
            return;
        }
        self.end_request(s, c, r, Failed::Cancelled);
    }

    fn crash(&self, s: &mut State, c: u8) {
        let cl = &mut s.clients[c as usize];
        let held: Vec<(u8, Owner, u64)> = cl
            .watchdog
            .iter()
            .map(|(o, e)| (e.key, *o, e.r.deadline.0))
            .collect();
        cl.alive = false;
        for req in &mut cl.reqs {
            req.phase = Phase::Done(Outcome::Crashed);
        }
        cl.ops.clear();
        cl.inbox = Default::default();
        cl.sub_in.clear();
        cl.sub_out.clear();
        cl.slots.clear();
        cl.unclaimed.clear();
        cl.settled.clear();
        cl.watchdog.clear();
        s.subs.retain(|&(sc, _)| sc != c);
        s.ghost.crashed.insert(c);
        for (key, owner, until) in held {
            properties::on_leave(s, key, c, owner, Some(until));
        }
    }

    /// The primary dies and the replica takes over as it is, after
    /// [`FAILOVER_MS`]. Every connection to the old primary breaks: replies
    /// not yet read are lost (their commands are sent again to the new
    /// primary; a `WAIT` fails), grant messages not yet read are lost, and
    /// the waiters, whose subscriptions went with it, ask again
    /// (`Subscriber::retire`).
    fn failover(&self, s: &mut State) {
        let before = s.ks.clone();
        let mut ks = s.replica.take().expect("a failover loses writes");
        ks.expire(EPOCH_MS + s.now);
        s.ks = ks;
        s.stalled = false;
        s.down_until = Some(s.now + FAILOVER_MS);
        s.subs.clear();
        properties::on_failover(self, s, &before);
        for c in 0..s.clients.len() as u8 {
            let cl = &mut s.clients[c as usize];
            if !cl.alive {
                continue;
            }
            for inbox in &mut cl.inbox {
                for b in inbox.iter_mut() {
                    b.reply = None;
                }
            }
            // What was on its way to the old primary is lost with it; the
            // transport sends a command again while its caller waits for
            // it (a `WAIT` fails instead).
            let ops = &cl.ops;
            for conn in 0..2 {
                let (keep, lost): (Vec<Sent>, Vec<Sent>) = std::mem::take(&mut cl.out[conn])
                    .into_iter()
                    .partition(|x| !x.copy && ops.contains_key(&x.op));
                let (wait, keep): (Vec<Sent>, Vec<Sent>) =
                    keep.into_iter().partition(|x| x.cmd == Cmd::Wait);
                drop(lost);
                cl.out[conn] = keep;
                cl.inbox[conn].extend(wait.into_iter().map(|x| Back {
                    op: x.op,
                    reply: None,
                }));
            }
            cl.sub_in.clear();
            cl.sub_out.clear();
            cl.slots.clear();
            for r in 0..cl.reqs.len() {
                let req = &mut cl.reqs[r];
                req.waiter = false;
                if matches!(req.phase, Phase::Napping(_) | Phase::Subscribing) {
                    req.phase = Phase::Napping(s.now);
                }
            }
        }
    }

    /// While there is no primary, a send whose caller stopped waiting for
    /// it never reaches a server.
    fn unsent_if_down(s: &mut State, c: u8) {
        if s.down_until.is_none() {
            return;
        }
        let cl = &mut s.clients[c as usize];
        let ops = &cl.ops;
        for out in &mut cl.out {
            out.retain(|x| ops.contains_key(&x.op));
        }
    }

    /// Whether every connection but the slow one is idle (the clock may
    /// move only then: messages take no time, except on the slow one, and
    /// except commands waiting for a primary during a failover).
    fn idle_but_slow(&self, s: &State) -> bool {
        let down = s.down_until.is_some();
        s.clients.iter().enumerate().all(|(c, cl)| {
            let c = c as u8;
            (0..2u8).all(|conn| {
                self.is_slow(c, conn)
                    || ((down || cl.out[conn as usize].is_empty())
                        && cl.inbox[conn as usize].is_empty())
            }) && (self.is_slow(c, 2) || ((down || cl.sub_out.is_empty()) && cl.sub_in.is_empty()))
        })
    }

    fn initial(&self) -> State {
        let mut subs = BTreeSet::new();
        let clients = self
            .clients
            .iter()
            .enumerate()
            .map(|(c, plan)| {
                let mut slots = BTreeMap::new();
                for &k in &plan.lingering {
                    subs.insert((c as u8, k));
                    slots.insert(
                        k,
                        Slot {
                            waiters: 0,
                            ready: true,
                            linger: Some(self.timing.linger),
                        },
                    );
                }
                Client {
                    alive: true,
                    reqs: plan
                        .requests
                        .iter()
                        .map(|p| Req {
                            owner: Owner {
                                n: 0,
                                read: p.read,
                                permits: p.permits,
                            },
                            phase: Phase::NotStarted,
                            acq: decide::start(0, 0, &self.timing),
                            ttl: None,
                            waiter: false,
                            mailbox: None,
                            held_from: 0,
                            held_fence: 0,
                        })
                        .collect(),
                    next_owner: 0,
                    next_op: 0,
                    ops: BTreeMap::new(),
                    out: Default::default(),
                    inbox: Default::default(),
                    sub_out: Vec::new(),
                    sub_in: Vec::new(),
                    slots,
                    unclaimed: BTreeMap::new(),
                    settled: BTreeSet::new(),
                    watchdog: BTreeMap::new(),
                }
            })
            .collect();
        State {
            now: 0,
            ks: Keyspace::default(),
            replica: None,
            down_until: None,
            stalled: false,
            subs,
            clients,
            budget: self.faults,
            ghost: Ghost::default(),
        }
    }
}

fn read_acquire(reply: &Reply) -> Answer {
    let num = |r: &Reply| -> Option<i64> {
        match r {
            Reply::Int(i) => Some(*i),
            Reply::Bulk(b) => b.parse().ok(),
            _ => None,
        }
    };
    match reply {
        Reply::Array(items) => {
            let flag = num(&items[0]).unwrap();
            let n = num(&items[1]).unwrap();
            let at = items.get(2).and_then(num).unwrap_or(0);
            match flag {
                1 | 2 => Answer::Granted { fence: n as u64 },
                _ => Answer::Busy {
                    ttl: (n > 0).then_some(n as u64),
                    queued: (at > 0).then_some(at as u64),
                },
            }
        }
        Reply::Error(_) => Answer::Refused,
        other => panic!("acquire.lua answered {other:?}"),
    }
}

/// A renewal script's flags (one lock): renewed or not.
fn read_renewed(reply: &Reply) -> bool {
    match reply {
        Reply::Bulk(b) => b == "1",
        other => panic!("renew answered {other:?}"),
    }
}

impl Model for World {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![self.initial()]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        let b = &s.budget;
        let up = s.down_until.is_none();
        for (c, cl) in s.clients.iter().enumerate() {
            let c = c as u8;
            for conn in 0..2u8 {
                if up && !cl.out[conn as usize].is_empty() {
                    actions.push(Action::Serve {
                        client: c,
                        conn,
                        fault: Fault::None,
                    });
                    if b.lose_reply > 0 && cl.alive {
                        actions.push(Action::Serve {
                            client: c,
                            conn,
                            fault: Fault::LoseReply,
                        });
                    }
                    if b.resend_verbatim > 0 && cl.alive {
                        actions.push(Action::Serve {
                            client: c,
                            conn,
                            fault: Fault::ResendVerbatim,
                        });
                    }
                }
                if !cl.inbox[conn as usize].is_empty() {
                    actions.push(Action::Deliver { client: c, conn });
                }
            }
            if up && !cl.sub_out.is_empty() {
                actions.push(Action::ServeSub { client: c });
            }
            if !cl.sub_in.is_empty() {
                actions.push(Action::DeliverPush { client: c });
            }
            if cl.alive && b.cancel > 0 {
                for (r, req) in cl.reqs.iter().enumerate() {
                    if acquiring(&req.phase) || matches!(req.phase, Phase::Releasing(_)) {
                        actions.push(Action::Cancel {
                            client: c,
                            req: r as u8,
                        });
                    }
                }
            }
            if cl.alive && b.crash > 0 && cl.reqs.iter().any(|q| q.phase != Phase::NotStarted) {
                actions.push(Action::Crash { client: c });
            }
        }
        if s.replica.is_some() {
            if !s.stalled {
                actions.push(Action::Replicate);
            }
            if b.failover > 0 {
                actions.push(Action::Failover);
            }
        }
        if b.stall > 0 && b.failover > 0 && !s.stalled && up && self.deployment != Deployment::Redis
        {
            actions.push(Action::Stall);
        }
        let timers = self.timers(s);
        let mut due = false;
        for &(c, t, at) in &timers {
            if at <= s.now {
                due = true;
                actions.push(Action::Fire {
                    client: c,
                    timer: t,
                });
            }
        }
        if !due && self.idle_but_slow(s) {
            let expiries =
                s.ks.keys
                    .values()
                    .filter_map(|e| e.expires)
                    .map(|t| t + 1 - EPOCH_MS);
            if let Some(next) = timers
                .iter()
                .map(|t| t.2)
                .chain(expiries)
                .chain(s.down_until)
                .filter(|&t| t > s.now)
                .min()
            {
                actions.push(Action::Tick(next));
            }
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut s = last.clone();
        match action {
            Action::Serve {
                client: c,
                conn,
                fault,
            } => {
                let sent = s.clients[c as usize].out[conn as usize].remove(0);
                let reply = self.execute(&mut s, c, &sent.cmd);
                if sent.copy {
                    properties::on_copy(self, &mut s, c, &sent.cmd);
                }
                let alive = s.clients[c as usize].alive;
                match fault {
                    Fault::None if alive => s.clients[c as usize].inbox[conn as usize].push(Back {
                        op: sent.op,
                        reply: Some(reply),
                    }),
                    Fault::None => {}
                    Fault::LoseReply => {
                        s.budget.lose_reply -= 1;
                        s.clients[c as usize].inbox[conn as usize].push(Back {
                            op: sent.op,
                            reply: None,
                        });
                    }
                    Fault::ResendVerbatim => {
                        s.budget.resend_verbatim -= 1;
                        s.clients[c as usize].out[conn as usize].push(Sent { copy: true, ..sent });
                    }
                }
            }
            Action::ServeSub { client: c } => {
                let (sub, k) = s.clients[c as usize].sub_out.remove(0);
                if sub {
                    s.subs.insert((c, k));
                    if s.clients[c as usize].alive {
                        s.clients[c as usize].sub_in.push(Push::Subscribed(k));
                    }
                } else {
                    s.subs.remove(&(c, k));
                }
            }
            Action::Deliver { client, conn } => self.deliver(&mut s, client, conn),
            Action::DeliverPush { client } => self.deliver_push(&mut s, client),
            Action::Fire { client, timer } => self.fire(&mut s, client, timer),
            Action::Tick(t) => {
                s.now = t;
                s.ks.expire(EPOCH_MS + t);
                // Replication lags less than a step of the clock, unless
                // it stalled.
                if !s.stalled {
                    s.replica = None;
                }
                if s.down_until.is_some_and(|d| d <= t) {
                    s.down_until = None;
                }
            }
            Action::Cancel { client, req } => {
                s.budget.cancel -= 1;
                self.cancel(&mut s, client, req);
            }
            Action::Crash { client } => {
                s.budget.crash -= 1;
                self.crash(&mut s, client);
            }
            Action::Replicate => s.replica = None,
            Action::Failover => {
                s.budget.failover -= 1;
                self.failover(&mut s);
            }
            Action::Stall => {
                s.budget.stall -= 1;
                s.stalled = true;
                // The replica has what it had: the primary's writes so far,
                // or fewer if it lags already.
                if s.replica.is_none() {
                    s.replica = Some(s.ks.clone());
                }
            }
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        properties::all()
    }
}
