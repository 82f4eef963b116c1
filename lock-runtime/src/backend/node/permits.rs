//! Semaphores on one Redis server or Redis Cluster: the permit scripts
//! (`docs/SEMAPHORES.md`), reached from `node.rs` for owner ids of
//! `Mode::Permit`. The same connection, retries and idempotence as locks.

use std::borrow::Cow;
use std::time::Duration;

use super::{millis, Query, RedisNode, Wake};
use crate::backend::fault::Fault;
use crate::backend::{Acquired, Queue, Released, Seen};
use crate::key::LockName;
use crate::scripts::{self, Arg};

impl RedisNode {
    /// The KEYS of `permit.lua` and `release_permit.lua`: the semaphore and
    /// its slot's counter; on a Cluster also its queue and waiters, so that
    /// a slot on the move refuses the whole call before it runs.
    fn permit_keys<'a>(&'a self, name: &'a LockName) -> Vec<Cow<'a, str>> {
        let mut keys = vec![Cow::Borrowed(&*name.hash), self.counter(name)];
        if self.is_cluster() {
            keys.extend([name.queue(), name.waiters()].map(Cow::Owned));
        }
        keys
    }

    /// Take a permit of `name` for `owner` (`permit.lua`), or queue it.
    /// `floor`: the lowest token to hand out (Redlock), else the server's
    /// clock. A Redlock attempt (`floor` set) never queues.
    pub(crate) async fn acquire_permit(
        &self,
        name: &LockName,
        owner: &str,
        lease: Duration,
        floor: Option<u64>,
        queue: Queue,
    ) -> Result<Acquired, Fault> {
        let stay = match (queue.stay, floor.is_none()) {
            (None, _) => Arg::Str(""),
            (Some(stay), false) => Arg::Tagged('w', millis(stay)),
            (Some(stay), true) => Arg::Num(millis(stay)),
        };
        let flags = match (queue.fence, self.is_cluster()) {
            (false, false) => "",
            (true, false) => "f",
            (false, true) => "s",
            (true, true) => "fs",
        };
        let mut args = [
            Arg::Str(owner),
            Arg::Num(millis(lease)),
            stay,
            Arg::Str(flags),
            Arg::Num(millis(self.settings.fence_ttl)),
            Arg::Num(0),
        ];
        // Trailing arguments at the script's defaults stay out: the server
        // pays for each (about 2 000 instructions).
        let n = match floor {
            Some(f) => {
                args[5] = Arg::Num(f);
                6
            }
            None if self.settings.fence_ttl != scripts::DEFAULT_FENCE_TTL => 5,
            None if flags != "f" => 4,
            None if !matches!(stay, Arg::Str("")) => 3,
            None => 2,
        };
        let keys = self.permit_keys(name);
        let keys: Vec<&str> = keys.iter().map(|k| &**k).collect();
        let (keys, args) = (&keys, &args[..n]);
        let (reply, acked) = self
            .retrying_by(self.acquire_by(queue.by), |limit| async move {
                let sha = Query::Cmd(scripts::PERMIT.evalsha(keys, args));
                self.eval_once_acked(&scripts::PERMIT, &sha, keys, args, limit)
                    .await
            })
            .await?;
        self.confirmed(super::acquired(&reply, "permit.lua", &self.addr)?, acked)
    }

    /// Run `release_permit.lua` as `owner`: (its answer, whether an earlier
    /// send may have run). Gives the permit back and serves the queue, or
    /// takes a waiter out of it.
    pub(crate) async fn run_release_permit(
        &self,
        name: &LockName,
        owner: &str,
        wake: Wake,
        forced: bool,
    ) -> Result<(i64, bool), Fault> {
        let mut flags = String::with_capacity(3);
        if self.is_cluster() {
            flags.push('s');
        }
        if wake == Wake::Always {
            flags.push('a');
        }
        if forced {
            flags.push('f');
        }
        let keys = self.permit_keys(name);
        let mut keys: Vec<&str> = keys.iter().map(|k| &**k).collect();
        // The counter stays out where the script can name it (it needs it
        // only to hand a permit over), and so do trailing arguments at the
        // script's defaults.
        if !self.is_cluster() && !name.prefix().contains('{') {
            keys.truncate(1);
        }
        let ttl = millis(self.settings.fence_ttl);
        let args = [Arg::Str(owner), Arg::Str(&flags), Arg::Num(ttl)];
        let n = if self.settings.fence_ttl != scripts::DEFAULT_FENCE_TTL {
            3
        } else if !flags.is_empty() {
            2
        } else {
            1
        };
        self.eval_noting_repeats(&scripts::RELEASE_PERMIT, &keys, &args[..n])
            .await
    }

    /// End `owner`'s permit but leave it counted for `left` more
    /// (`min_hold`).
    pub(crate) async fn keep_permit(
        &self,
        name: &LockName,
        owner: &str,
        left: Duration,
    ) -> Result<Released, Fault> {
        let until = tokio::time::Instant::now() + left;
        let keys: &[&str] = &[&name.hash];
        let kept: i64 = self
            .retrying(|limit| async move {
                let left = until.saturating_duration_since(tokio::time::Instant::now());
                let args = [Arg::Str(owner), Arg::Num(millis(left))];
                let sha = Query::Cmd(scripts::KEEP_PERMIT.evalsha(keys, &args));
                self.eval_once(&scripts::KEEP_PERMIT, &sha, keys, &args, limit)
                    .await
            })
            .await?;
        Ok(if kept == 1 {
            Released::Freed
        } else {
            Released::NotOwner
        })
    }

    /// Whether `owner` still waits in the semaphore's queue, or was handed
    /// a permit already.
    pub(crate) async fn still_queued_permit(
        &self,
        name: &LockName,
        owner: &str,
    ) -> Result<bool, Fault> {
        let what = "checking the semaphore queue";
        let mut pipe = redis::Pipeline::new();
        pipe.cmd("HEXISTS").arg(name.waiters()).arg(owner);
        pipe.cmd("HEXISTS").arg(&*name.hash).arg(owner);
        let pipe = Query::Pipe(pipe);
        match self
            .retrying(|limit| self.query::<(bool, bool)>(&pipe, what, limit))
            .await
        {
            Ok((queued, held)) => Ok(queued || held),
            // A lock's string under the name: no permit was handed over.
            Err(Fault::Redis { source, .. }) if source.code() == Some("WRONGTYPE") => {
                let mut cmd = redis::Cmd::new();
                cmd.arg("HEXISTS").arg(name.waiters()).arg(owner);
                let cmd = Query::Cmd(cmd);
                self.retrying(|limit| self.query(&cmd, what, limit)).await
            }
            Err(e) => Err(e),
        }
    }

    /// What this server holds of the semaphore (`inspect_permits.lua`).
    pub(crate) async fn inspect_permits(&self, name: &LockName) -> Result<Seen, Fault> {
        let (what, pttl, token, waiters, holders): (String, i64, String, i64, Vec<String>) = self
            .eval(
                &scripts::INSPECT_PERMITS,
                &[&*name.hash, &name.waiters()],
                &[],
            )
            .await?;
        if what != "held" && what != "free" {
            return Err(Fault::other(format!(
                "`{}` on Redis at {} is a {what}, not a lock of this client (another key prefix?)",
                name.hash, self.addr
            )));
        }
        let ttl = (!holders.is_empty() && pttl > 0).then(|| Duration::from_millis(pttl as u64));
        Ok(Seen {
            holders,
            ttl,
            waiters: waiters.max(0) as usize,
            fence: token.parse().ok(),
        })
    }

    /// Raise the token counter to at least `fence`, and `owner`'s permit to
    /// that token (Redlock: every granted node learns the token handed
    /// out). `Some(counter)`: refused, another permit here carries that
    /// token already (tokens stay unique per key); a token above `counter`
    /// is free here.
    #[allow(dead_code)] // The Redlock backend's (docs/SEMAPHORES.md).
    pub(crate) async fn raise_permit_fence(
        &self,
        name: &LockName,
        owner: &str,
        fence: u64,
    ) -> Result<Option<u64>, Fault> {
        let ttl = millis(self.settings.fence_ttl);
        let counter = self.counter(name);
        let reply: Vec<i64> = self
            .eval(
                &scripts::RAISE_PERMIT_FENCE,
                &[&name.hash, &counter],
                &[Arg::Str(owner), Arg::Num(fence), Arg::Num(ttl)],
            )
            .await?;
        Ok(match reply[..] {
            [0, counter] => Some(counter.max(0) as u64),
            _ => None,
        })
    }
}
