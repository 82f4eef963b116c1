//! What an operator does to locks on one Redis server or Redis Cluster:
//! read one (`inspect.lua`), clear one by the release script run as its
//! holder, and find them all (`SCAN`, on every primary of a cluster).

use std::time::Duration;

use super::{Conn, Query, RedisNode, Wake};
use crate::backend::fault::Fault;
use crate::backend::Seen;
use crate::key::LockName;
use crate::scripts;

/// Names per `SCAN` step: large enough that a keyspace of millions of
/// fence counters takes few round trips, small enough not to stall Redis.
const SCAN_COUNT: usize = 1000;

/// The token of the hold, from its place in the lock's value (decimal; `-`
/// or nothing: a lock without a token).
fn hold_token(token: &str) -> Option<u64> {
    token.parse().ok()
}

impl RedisNode {
    /// What this server holds of the lock, read in one script call.
    pub(crate) async fn inspect(&self, name: &LockName) -> Result<Seen, Fault> {
        let (what, pttl, token, waiters, holders): (String, i64, String, i64, Vec<String>) =
            self.eval(&scripts::INSPECT, &[&name.hash], &[]).await?;
        if what == "hash" {
            return self.inspect_permits(name).await;
        }
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
            fence: hold_token(&token),
        })
    }

    /// The release script run as `owner`, flagged as forced: it hands the
    /// lock on as that owner's release would, without recording `owner` as
    /// the one that handed over. Whether it ended a hold of `owner`'s.
    ///
    /// Sent again after a lost reply like any release: the owner id pins it
    /// to that one hold, so a second send finds the lock gone or someone
    /// else's, and leaves it.
    pub(crate) async fn release_forced(
        &self,
        name: &LockName,
        owner: &str,
        wake: Wake,
    ) -> Result<bool, Fault> {
        let (ended, repeated) = self.run_release(name, (owner, None), wake, true).await?;
        // As for any release: an earlier send whose reply was lost may have
        // ended it.
        Ok(ended == 1 || repeated)
    }

    /// End every hold of the lock on this server: each holder's release,
    /// forced; for readers one by one, and the last one out hands on.
    /// Returns the holders it removed.
    pub(crate) async fn force_release(
        &self,
        name: &LockName,
        wake: Wake,
    ) -> Result<Vec<String>, Fault> {
        let mut removed = Vec::new();
        for holder in self.inspect(name).await?.holders {
            if self.release_forced(name, &holder, wake).await? {
                removed.push(holder);
            }
        }
        Ok(removed)
    }

    /// End `holder`'s hold, and only if it still holds: the release is
    /// run as `holder`, so a hold that changed hands since the operator
    /// looked is left alone. Read first, so that a holder that released on
    /// its own (its release then counts as `repeated`), or a cluster's
    /// absent hold, is not reported as removed.
    pub(crate) async fn force_release_if(
        &self,
        name: &LockName,
        holder: &str,
        wake: Wake,
    ) -> Result<bool, Fault> {
        if !self.inspect(name).await?.holds(holder) {
            return Ok(false);
        }
        self.release_forced(name, holder, wake).await
    }

    /// Every name matching `pattern` (`SCAN`, never `KEYS`): on a cluster,
    /// on each primary.
    pub(crate) async fn scan(&self, pattern: &str) -> Result<Vec<String>, Fault> {
        match &self.conn {
            Conn::Single(_) | Conn::Lazy(_) => self.scan_node(pattern, None).await,
            #[cfg(feature = "cluster")]
            Conn::Cluster(_) => {
                let mut names = Vec::new();
                for primary in self.primaries().await? {
                    names.extend(self.scan_node(pattern, Some(&primary)).await?);
                }
                Ok(names)
            }
        }
    }

    /// `host:port` of every primary of the cluster, as the cluster client
    /// knows them.
    #[cfg(feature = "cluster")]
    async fn primaries(&self) -> Result<Vec<String>, Fault> {
        use redis::cluster_routing::{MultipleNodeRoutingInfo, RoutingInfo};
        let Conn::Cluster(conn) = &self.conn else {
            return Ok(Vec::new());
        };
        let what = "finding the cluster's primaries";
        let answers = self
            .retrying(|limit| {
                let mut conn = conn.clone();
                let all = RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None));
                async move {
                    tokio::time::timeout_at(
                        limit.until,
                        conn.route_command(redis::cmd("PING"), all),
                    )
                    .await
                    .map_err(|_| Fault::timed_out(what, limit.of))?
                    .map_err(|e| Fault::redis(what, e))
                }
            })
            .await?;
        // One answer per primary, keyed by its address.
        let redis::Value::Map(answers) = answers else {
            return Err(Fault::other(format!(
                "{what}: unexpected reply {answers:?}"
            )));
        };
        answers
            .into_iter()
            .map(|(addr, _)| {
                redis::from_redis_value::<String>(addr)
                    .map_err(|e| Fault::other(format!("{what}: {e}")))
            })
            .collect()
    }

    /// `SCAN` one server to the end: this node's own, or a cluster primary
    /// at `host:port`.
    async fn scan_node(&self, pattern: &str, at: Option<&str>) -> Result<Vec<String>, Fault> {
        let what = match at {
            Some(addr) => format!("scanning for locks on {addr}"),
            None => "scanning for locks".to_owned(),
        };
        let mut names = Vec::new();
        let mut cursor = "0".to_owned();
        loop {
            let mut cmd = redis::cmd("SCAN");
            cmd.arg(&cursor)
                .arg("MATCH")
                .arg(pattern)
                .arg("COUNT")
                .arg(SCAN_COUNT);
            let (next, found): (String, Vec<String>) = match at {
                None => {
                    let cmd = Query::Cmd(cmd.clone());
                    self.retrying(|limit| self.query(&cmd, &what, limit))
                        .await?
                }
                #[cfg(feature = "cluster")]
                Some(addr) => self.at_node(addr, &cmd, &what).await?,
                #[cfg(not(feature = "cluster"))]
                Some(addr) => {
                    return Err(Fault::Config(format!(
                        "{what}: {addr} is a cluster node, and cluster support is not built in"
                    )))
                }
            };
            names.extend(found);
            if next == "0" {
                return Ok(names);
            }
            cursor = next;
        }
    }

    /// One command on the cluster node at `host:port`.
    #[cfg(feature = "cluster")]
    async fn at_node<T: redis::FromRedisValue>(
        &self,
        addr: &str,
        cmd: &redis::Cmd,
        what: &str,
    ) -> Result<T, Fault> {
        use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
        let Conn::Cluster(conn) = &self.conn else {
            return Err(Fault::other(format!("{what}: not a cluster")));
        };
        let (host, port) = addr
            .rsplit_once(':')
            .and_then(|(h, p)| Some((h.to_owned(), p.parse::<u16>().ok()?)))
            .ok_or_else(|| Fault::other(format!("{what}: bad node address `{addr}`")))?;
        let value = self
            .retrying(|limit| {
                let mut conn = conn.clone();
                let node = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                    host: host.clone(),
                    port,
                });
                let cmd = cmd.clone();
                async move {
                    tokio::time::timeout_at(limit.until, conn.route_command(cmd, node))
                        .await
                        .map_err(|_| Fault::timed_out(what, limit.of))?
                        .map_err(|e| Fault::redis(what, e))
                }
            })
            .await?;
        redis::from_redis_value(value).map_err(|e| Fault::other(format!("{what}: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_holds_token_is_the_decimal_in_its_value() {
        assert_eq!(hold_token("1718000000000001"), Some(1_718_000_000_000_001));
        assert_eq!(hold_token(""), None);
        assert_eq!(hold_token("-"), None);
    }
}
