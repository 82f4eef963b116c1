//! What an operator does to locks on PostgreSQL: read one
//! (`lock_inspect_v1`), clear one by the release function run as its holder
//! (forced), and list the names held or awaited (`lock_names_v1`).

use std::time::Duration;

use tokio_postgres::types::Type;

use super::pool::Pool;
use super::{one, PostgresBackend};
use crate::backend::fault::Fault;
use crate::backend::Seen;
use crate::key::LockName;

impl PostgresBackend {
    pub(crate) async fn inspect(&self, name: &LockName) -> Result<Seen, Fault> {
        let rows = self
            .pool
            .query(
                Pool::route(&name.hash),
                "inspecting a lock",
                "SELECT * FROM lock_inspect_v1($1)",
                &[(&&*name.hash, Type::TEXT)],
            )
            .await?;
        let row = one(&rows, "inspecting a lock")?;
        let holders: Vec<String> = row.get(0);
        let ttl: Option<i64> = row.get(1);
        let waiters: i32 = row.get(2);
        let fence: i64 = row.get(3);
        Ok(Seen {
            ttl: ttl
                .filter(|_| !holders.is_empty())
                .map(|ms| Duration::from_millis(ms.max(0) as u64)),
            holders,
            waiters: waiters.max(0) as usize,
            fence: (fence > 0).then_some(fence as u64),
        })
    }

    /// End every hold of the lock, each as its holder's release, forced:
    /// the queue is served, and the holder's own later release finds the
    /// lock lost. Returns the holders it removed.
    pub(crate) async fn force_release(&self, name: &LockName) -> Result<Vec<String>, Fault> {
        let mut removed = Vec::new();
        for holder in self.inspect(name).await?.holders {
            if self.run_release(name, &holder, true).await?.0 == 1 {
                removed.push(holder);
            }
        }
        Ok(removed)
    }

    /// End `holder`'s hold if it still holds the lock. Sent twice, the
    /// second finds it gone: the owner id pins it to that one hold.
    pub(crate) async fn force_release_if(
        &self,
        name: &LockName,
        holder: &str,
    ) -> Result<bool, Fault> {
        if !self.inspect(name).await?.holds(holder) {
            return Ok(false);
        }
        Ok(self.run_release(name, holder, true).await?.0 == 1)
    }

    /// The lock names held or awaited that match the glob `pattern`.
    pub(crate) async fn scan(&self, pattern: &str) -> Result<Vec<String>, Fault> {
        // The literal start of the pattern narrows the read.
        let prefix: String = pattern
            .chars()
            .take_while(|c| !matches!(c, '*' | '?' | '[' | '\\'))
            .collect();
        let rows = self
            .pool
            .query(
                0,
                "listing locks",
                "SELECT lock_names_v1($1)",
                &[(&prefix, Type::TEXT)],
            )
            .await?;
        Ok(rows
            .iter()
            .map(|r| r.get::<_, String>(0))
            .filter(|n| crate::glob::matches(pattern, n))
            .collect())
    }
}
