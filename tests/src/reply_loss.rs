//! The reply-loss nemesis: a command reaches Redis and runs, and its reply
//! is cut off on the way back ([`Proxy::lose_reply_to`]), so the client
//! cannot know what happened. Run against each lock operation on any
//! deployment whose every node sits behind a proxy.
//!
//! After each operation: no second holder while the lock is held, the
//! outer hold still held after a nested release, nothing left after the
//! outermost release, renewals still working, and tokens strictly
//! increasing (none handed out twice).

use std::time::{Duration, Instant};

use lock_runtime::{distributed_lock, LockClient, LockError};

use crate::proxy::Proxy;

/// The SHA1 that `EVALSHA` names a lock script by.
pub fn script_sha(source: &str) -> Vec<u8> {
    redis::Script::new(source).get_hash().as_bytes().to_vec()
}

pub fn acquire_sha() -> Vec<u8> {
    script_sha(include_str!("../../lock-runtime/scripts/acquire.lua"))
}

pub fn release_sha() -> Vec<u8> {
    script_sha(include_str!("../../lock-runtime/scripts/release.lua"))
}

pub fn renew_sha() -> Vec<u8> {
    script_sha(include_str!("../../lock-runtime/scripts/renew.lua"))
}

pub fn renew_read_sha() -> Vec<u8> {
    script_sha(include_str!("../../lock-runtime/scripts/renew_read.lua"))
}

/// Reads a lock's value (its owner id) on every node, directly.
pub type Owners<'a> = Box<dyn Fn(&str) -> Vec<Option<String>> + Send + Sync + 'a>;

/// A deployment under test.
pub struct Target<'a> {
    pub name: &'static str,
    /// The client whose replies are lost.
    pub client: LockClient,
    /// Another client of the same deployment, which must never get a lock
    /// the first one holds.
    pub rival: LockClient,
    /// Every proxy between `client` and the nodes.
    pub proxies: Vec<&'a Proxy>,
    /// The lock's value (its owner id) on every node, read directly.
    pub owners: Owners<'a>,
    /// How many nodes must hold a lock for it to be held (1; a majority
    /// for Redlock).
    pub quorum: usize,
}

/// One operation's figures.
#[derive(Debug, Clone)]
pub struct Row {
    pub deployment: &'static str,
    pub operation: &'static str,
    /// Replies thrown away by the proxies during the operation.
    pub lost: u64,
    /// Commands sent during the operation that could have lost a reply
    /// (0: the operation needs no round trip).
    pub sent: bool,
}

impl Target<'_> {
    fn arm(&self, pattern: &[u8]) -> u64 {
        for p in &self.proxies {
            p.lose_reply_to(pattern);
        }
        self.lost()
    }

    fn disarm(&self) -> bool {
        let fired = self.proxies.iter().any(|p| !p.armed());
        for p in &self.proxies {
            p.disarm();
        }
        fired
    }

    fn lost(&self) -> u64 {
        self.proxies.iter().map(|p| p.replies_lost()).sum()
    }

    fn held_by(&self, key: &str, owner: &str) -> usize {
        (self.owners)(&format!("lock:{{{key}}}"))
            .iter()
            .filter(|o| o.as_deref() == Some(owner))
            .count()
    }

    fn left(&self, key: &str) -> usize {
        (self.owners)(&format!("lock:{{{key}}}"))
            .iter()
            .filter(|o| o.is_some())
            .count()
    }

    async fn rival_refused(&self, key: &str) -> Result<(), String> {
        match self.rival.lock(key).await {
            Err(LockError::Timeout { .. }) => Ok(()),
            Ok(g) => {
                let fence = g.fence();
                let _ = g.release().await;
                Err(format!(
                    "{}: a second holder got `{key}` (token {fence})",
                    self.name
                ))
            }
            Err(e) => Err(format!("{}: the rival failed on `{key}`: {e}", self.name)),
        }
    }
}

/// Why a run failed: a check, or the lock call that the annotated scope
/// itself made.
#[derive(Debug)]
enum Failure {
    Check(String),
    Lock(LockError),
}

impl From<LockError> for Failure {
    fn from(e: LockError) -> Self {
        Failure::Lock(e)
    }
}

impl From<String> for Failure {
    fn from(e: String) -> Self {
        Failure::Check(e)
    }
}

fn check(ok: bool, what: impl FnOnce() -> String) -> Result<(), String> {
    if ok {
        Ok(())
    } else {
        Err(what())
    }
}

/// Opens an annotated scope (on the global client) for the manual
/// reentries below: inside it, a second `client.lock(k)` of a key the
/// scope holds re-enters.
#[distributed_lock(key = "reply-loss-scope:{scope}")]
async fn in_scope(
    scope: &str,
    target: &Target<'_>,
    key: &str,
    rows: &mut Vec<Row>,
    tokens: &mut Vec<u64>,
) -> Result<(), Failure> {
    let t = target;

    // Fresh acquire: the grant's reply is lost.
    let before = t.arm(&acquire_sha());
    let outer = t
        .client
        .lock(key)
        .wait(Duration::from_secs(10))
        .await
        .map_err(|e| format!("{}: fresh acquire: {e}", t.name))?;
    let fired = t.disarm();
    let lost = t.lost() - before;
    check(fired && lost >= 1, || {
        format!("{}: the acquire's reply was not lost", t.name)
    })?;
    check(t.held_by(key, outer.holder()) >= t.quorum, || {
        format!("{}: the granted lock is not in Redis", t.name)
    })?;
    t.rival_refused(key).await?;
    check(tokens.iter().all(|&x| x < outer.fence()), || {
        format!(
            "{}: token {} handed out again or lower: {tokens:?}",
            t.name,
            outer.fence()
        )
    })?;
    tokens.push(outer.fence());
    rows.push(Row {
        deployment: t.name,
        operation: "fresh acquire",
        lost,
        sent: true,
    });

    // Reentry and nested release: armed for any lock script, they must
    // send nothing, so nothing can be lost or counted twice.
    let before = t.arm(&acquire_sha());
    let inner = t
        .client
        .lock(key)
        .await
        .map_err(|e| format!("{}: reentry: {e}", t.name))?;
    check(!t.disarm() && inner.fence() == outer.fence(), || {
        format!("{}: the reentry went to Redis or changed the token", t.name)
    })?;
    rows.push(Row {
        deployment: t.name,
        operation: "reentry",
        lost: t.lost() - before,
        sent: false,
    });
    let before = t.arm(&release_sha());
    inner
        .release()
        .await
        .map_err(|e| format!("{}: nested release: {e}", t.name))?;
    check(!t.disarm(), || {
        format!("{}: the nested release went to Redis", t.name)
    })?;
    check(t.held_by(key, outer.holder()) >= t.quorum, || {
        format!("{}: the outer hold is gone after a nested release", t.name)
    })?;
    t.rival_refused(key).await?;
    rows.push(Row {
        deployment: t.name,
        operation: "nested release",
        lost: t.lost() - before,
        sent: false,
    });

    // Outermost release: its reply is lost; it must still be released,
    // and reported so.
    let before = t.arm(&release_sha());
    outer
        .release()
        .await
        .map_err(|e| format!("{}: outermost release: {e}", t.name))?;
    let fired = t.disarm();
    let lost = t.lost() - before;
    check(fired && lost >= 1, || {
        format!("{}: the release's reply was not lost", t.name)
    })?;
    check(t.left(key) == 0, || {
        format!("{}: the lock lingers after the outermost release", t.name)
    })?;
    rows.push(Row {
        deployment: t.name,
        operation: "outermost release",
        lost,
        sent: true,
    });
    Ok(())
}

/// Run every operation once under reply loss; returns a row each.
pub async fn run(
    target: &Target<'_>,
    key: &str,
    tokens: &mut Vec<u64>,
) -> Result<Vec<Row>, String> {
    let mut rows = Vec::new();
    in_scope(&crate::unique("scope"), target, key, &mut rows, tokens)
        .await
        .map_err(|e| match e {
            Failure::Check(why) => why,
            Failure::Lock(e) => format!("{}: the scope's own lock: {e}", target.name),
        })?;
    let t = target;

    // A renewal tick whose reply is lost: the lock stays held and renewed.
    let lease = Duration::from_millis(900);
    let g = t
        .client
        .lock(key)
        .lease(lease)
        .await
        .map_err(|e| format!("{}: lock for renewal: {e}", t.name))?;
    check(tokens.iter().all(|&x| x < g.fence()), || {
        format!(
            "{}: token {} handed out again or lower: {tokens:?}",
            t.name,
            g.fence()
        )
    })?;
    tokens.push(g.fence());
    let before = t.arm(&renew_sha());
    let deadline = Instant::now() + lease * 3;
    while t.proxies.iter().all(|p| p.armed()) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let fired = t.disarm();
    let lost = t.lost() - before;
    check(fired, || format!("{}: no renewal was sent", t.name))?;
    tokio::time::sleep(lease * 2).await;
    check(!g.is_lost(), || {
        format!("{}: a lost renewal reply lost the lock", t.name)
    })?;
    t.rival_refused(key).await?;
    g.release()
        .await
        .map_err(|e| format!("{}: release after the renewal: {e}", t.name))?;
    check(t.left(key) == 0, || format!("{}: the lock lingers", t.name))?;
    rows.push(Row {
        deployment: t.name,
        operation: "renewal tick",
        lost,
        sent: true,
    });

    // The rival's next token is above every one handed out.
    let g = t
        .rival
        .lock(key)
        .await
        .map_err(|e| format!("{}: rival after the run: {e}", t.name))?;
    check(tokens.iter().all(|&x| x < g.fence()), || {
        format!(
            "{}: token {} handed out again or lower: {tokens:?}",
            t.name,
            g.fence()
        )
    })?;
    tokens.push(g.fence());
    g.release().await.map_err(|e| e.to_string())?;
    Ok(rows)
}

/// The figures as a table.
pub fn print(rows: &[Row]) {
    println!("\n== reply loss: the command ran, its reply never came ==");
    println!(
        "  {:<12} {:<18} {:>12} {:>14}",
        "deployment", "operation", "replies lost", "round trips"
    );
    for r in rows {
        println!(
            "  {:<12} {:<18} {:>12} {:>14}",
            r.deployment,
            r.operation,
            r.lost,
            if r.sent { "yes" } else { "none needed" }
        );
    }
}
