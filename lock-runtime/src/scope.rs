//! The holder identity of an annotated call chain, and the fencing token of
//! the body being run.
//!
//! The outermost `#[distributed_lock]` call opens a task-local scope; nested
//! calls awaited in the same task find the locks it holds there and re-enter
//! them without a round trip. A spawned task starts without a scope, so it is
//! a different holder. Task-locals work the same under `block_on`,
//! `#[tokio::main]`, `#[tokio::test]` and in spawned tasks.
//!
//! A permit is no scope-wide hold: a semaphore admits at most N bodies,
//! and futures joined in one body are as many bodies. A permit joins a
//! child scope that wraps only its own body ([`Scope::body_of`]), so calls
//! nested in that body re-enter it and its body's siblings do not.
//!
//! The scope and the body's tokens are one task-local, set around each
//! annotated body only while that body is polled (not while its lock is
//! taken or released): bodies joined in one task each see their own.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

use crate::hold::Hold;
use crate::key::Mode;

tokio::task_local! {
    static BODY: Body;
}

/// What an annotated body being polled sees: its scope and its tokens.
struct Body {
    scope: Arc<Scope>,
    fences: BodyFences,
}

/// The keys and tokens of the annotated body being polled. A single key
/// (the common case) costs no allocation.
pub(crate) enum BodyFences {
    One(Arc<str>, u64),
    /// Sorted by key.
    Many(Box<[(Arc<str>, u64)]>),
}

impl BodyFences {
    /// From a guard's keys and tokens (sorted by key, as a guard has them).
    pub(crate) fn of<'a>(mut keys: impl Iterator<Item = (&'a Arc<str>, u64)>) -> Self {
        let Some((key, fence)) = keys.next() else {
            return BodyFences::Many(Box::default());
        };
        match keys.next() {
            None => BodyFences::One(key.clone(), fence),
            Some(second) => BodyFences::Many(
                [(key, fence), second]
                    .into_iter()
                    .chain(keys)
                    .map(|(k, f)| (k.clone(), f))
                    .collect(),
            ),
        }
    }

    /// (Token 0 is a lock taken with `fence = false`: it has none.)
    fn first(&self) -> Option<u64> {
        match self {
            BodyFences::One(_, fence) => Some(*fence),
            BodyFences::Many(all) => all.first().map(|(_, f)| *f),
        }
        .filter(|&f| f != 0)
    }

    fn all(&self) -> Vec<(String, u64)> {
        match self {
            BodyFences::One(_, 0) => Vec::new(),
            BodyFences::One(key, fence) => vec![(key.to_string(), *fence)],
            BodyFences::Many(all) => all
                .iter()
                .filter(|(_, f)| *f != 0)
                .map(|(k, f)| (k.to_string(), *f))
                .collect(),
        }
    }
}

/// Whether a hold of mode `held` serves a request of mode `asked`.
fn serves(held: Mode, asked: Mode) -> bool {
    matches!(
        (held, asked),
        (Mode::Write, _) | (Mode::Read, Mode::Read) | (Mode::Permit(_), Mode::Permit(_))
    )
}

/// Process-wide so that owner ids never repeat within one client id.
static NEXT_HOLDER: AtomicU64 = AtomicU64::new(1);

pub(crate) fn next_holder() -> u64 {
    NEXT_HOLDER.fetch_add(1, Ordering::Relaxed)
}

/// A lock held in a scope: (client id, lock name in Redis).
type HoldKey = (Arc<str>, Arc<str>);

#[derive(Default)]
pub(crate) struct Scope {
    /// The scope a permit's body scope is nested in: locks join and
    /// re-enter there, so scope-mates keep sharing them.
    parent: Option<Arc<Scope>>,
    /// Each lock the scope holds, with how many of its guards are open.
    held: Mutex<Holds>,
    /// A lock joined the scope: a scope-mate that waits for the same key
    /// (futures joined in one body) re-enters it instead.
    joined: Notify,
}

/// What a scope knows of a key.
pub(crate) enum Reentry {
    /// Held: one more guard shares it.
    Held(Arc<Hold>),
    /// Held, but the lock was lost: the new call must not run.
    Lost,
    /// Read-held, and the write lock was asked for.
    Upgrade,
    /// A permit held and a lock asked for, or a read lock held and a
    /// permit asked for: one key is a lock or a semaphore, not both.
    Mixed,
    /// Not held here.
    No,
}

impl Scope {
    /// A request for `hash` of `mode` in this scope. A write hold serves
    /// every mode; a read hold serves reads, and a permit permits: a
    /// request that asks for more than the scope holds would wait for the
    /// scope itself, and is refused at once.
    ///
    /// Returns the scope that holds it, which a re-entered guard leaves.
    pub(crate) fn reenter(
        self: &Arc<Self>,
        client: &Arc<str>,
        hash: &Arc<str>,
        mode: Mode,
    ) -> (Reentry, Arc<Scope>) {
        let mut at = self;
        loop {
            match at.reenter_here(client, hash, mode) {
                Reentry::No => match &at.parent {
                    Some(parent) => at = parent,
                    None => return (Reentry::No, self.clone()),
                },
                found => return (found, at.clone()),
            }
        }
    }

    fn reenter_here(&self, client: &Arc<str>, hash: &Arc<str>, mode: Mode) -> Reentry {
        let mut held = self.held.lock().unwrap();
        match held.find(client, hash) {
            Some((hold, _)) if !serves(Mode::of(&hold.owner), mode) => {
                if Mode::of(&hold.owner) == Mode::Read && mode == Mode::Write {
                    Reentry::Upgrade
                } else {
                    Reentry::Mixed
                }
            }
            Some((hold, _)) if hold.is_lost() => Reentry::Lost,
            Some((hold, guards)) => {
                *guards += 1;
                Reentry::Held(hold.clone())
            }
            None => Reentry::No,
        }
    }

    /// A fresh grant joins the scope. If a scope-mate's grant of the same
    /// key is there and still held, the new one stays a lone guard; a lost
    /// one is replaced (its guards then each count as the last of theirs).
    /// A lock asked for in a permit's body joins the scope around it.
    pub(crate) fn insert(&self, client: &Arc<str>, hold: &Arc<Hold>) {
        if let Some(parent) = self.lock_scope(hold) {
            return parent.insert(client, hold);
        }
        let mut held = self.held.lock().unwrap();
        match held.find(client, &hold.name.hash) {
            Some((h, _)) if !h.is_lost() => {}
            Some((h, guards)) => (*h, *guards) = (hold.clone(), 1),
            None => held.add(client, hold),
        }
        drop(held);
        self.joined.notify_waiters();
    }

    /// One guard of `hold` ends; true if it was the last one, so the lock
    /// is to be released. Under the scope's lock, so a reentry cannot slip
    /// in between the count reaching zero and the release.
    pub(crate) fn leave(&self, client: &Arc<str>, hold: &Arc<Hold>) -> bool {
        if let Some(parent) = self.lock_scope(hold) {
            return parent.leave(client, hold);
        }
        self.held.lock().unwrap().leave(client, hold)
    }

    /// Where a lock held in this scope joins: a permit's body scope passes
    /// it up, so that the body's scope-mates share it as before.
    fn lock_scope(&self, hold: &Hold) -> Option<&Arc<Scope>> {
        self.parent
            .as_ref()
            .filter(|_| Mode::of(&hold.owner).permits().is_none())
    }

    /// The scope of a fresh permit's body, nested in `parent`: the permit
    /// is its one hold, with one guard (the caller's).
    pub(crate) fn body_of(
        parent: Option<Arc<Scope>>,
        client: &Arc<str>,
        hold: &Arc<Hold>,
    ) -> Arc<Scope> {
        let scope = Scope {
            parent,
            ..Scope::default()
        };
        scope.held.lock().unwrap().add(client, hold);
        Arc::new(scope)
    }

    /// Resolves when a lock joins the scope, or the scope around it that
    /// a permit's body scope passes its locks up to (see
    /// [`insert`](Self::insert)).
    pub(crate) fn joined(&self) -> tokio::sync::futures::Notified<'_> {
        let mut at = self;
        while let Some(parent) = &at.parent {
            at = parent;
        }
        at.joined.notified()
    }
}

/// The locks a scope holds, each with its count of open guards: a short
/// list searched in place (a scope mostly holds a key or two, and hashing
/// them cost more than the search), a map once it holds many.
enum Holds {
    Few(Vec<(HoldKey, Arc<Hold>, usize)>),
    Many(HashMap<HoldKey, (Arc<Hold>, usize)>),
}

/// Past this many locks, a scope's holds go into a map.
const FEW: usize = 8;

impl Default for Holds {
    fn default() -> Self {
        Holds::Few(Vec::new())
    }
}

impl Holds {
    /// The hold of `client`'s lock `hash` and its guards, if held here.
    fn find(&mut self, client: &Arc<str>, hash: &Arc<str>) -> Option<(&mut Arc<Hold>, &mut usize)> {
        match self {
            Holds::Few(few) => few
                .iter_mut()
                .find(|((c, n), _, _)| is(n, hash) && is(c, client))
                .map(|(_, h, guards)| (h, guards)),
            Holds::Many(many) => many
                .get_mut(&(client.clone(), hash.clone()))
                .map(|(h, guards)| (h, guards)),
        }
    }

    /// A hold not held here yet, with one guard.
    fn add(&mut self, client: &Arc<str>, hold: &Arc<Hold>) {
        let key = (client.clone(), hold.name.hash.clone());
        match self {
            Holds::Few(few) if few.len() < FEW => few.push((key, hold.clone(), 1)),
            Holds::Few(few) => {
                let mut many: HashMap<_, _> = few
                    .drain(..)
                    .map(|(k, h, guards)| (k, (h, guards)))
                    .collect();
                many.insert(key, (hold.clone(), 1));
                *self = Holds::Many(many);
            }
            Holds::Many(many) => {
                many.insert(key, (hold.clone(), 1));
            }
        }
    }

    /// One guard of `hold` ends: true if it was the last (or `hold` is not
    /// the one held here under its key), and it is gone.
    fn leave(&mut self, client: &Arc<str>, hold: &Arc<Hold>) -> bool {
        let Some((h, guards)) = self.find(client, &hold.name.hash) else {
            return true;
        };
        if !Arc::ptr_eq(h, hold) {
            return true;
        }
        *guards -= 1;
        if *guards > 0 {
            return false;
        }
        match self {
            Holds::Few(few) => few.retain(|(_, h, _)| !Arc::ptr_eq(h, hold)),
            Holds::Many(many) => {
                many.remove(&(client.clone(), hold.name.hash.clone()));
            }
        }
        true
    }
}

/// The same name: often the very same string.
fn is(a: &Arc<str>, b: &Arc<str>) -> bool {
    Arc::ptr_eq(a, b) || **a == **b
}

/// The scope of the annotated body this task is in, if any.
pub(crate) fn current() -> Option<Arc<Scope>> {
    BODY.try_with(|b| b.scope.clone()).ok()
}

/// Run an annotated body in `scope`: nested calls re-enter its holds, and
/// `current_fence()` and `current_fences()` inside it are its keys' tokens.
/// (A plain fn: an `async fn` would hold `body` twice, as its argument and
/// inside the task-local's future.)
pub(crate) fn body<F: Future>(
    scope: Arc<Scope>,
    fences: BodyFences,
    body: F,
) -> impl Future<Output = F::Output> {
    BODY.scope(Body { scope, fences }, body)
}

/// The fencing token of the annotated body this code runs in (the innermost
/// one, when bodies nest), or `None` outside one.
///
/// Each body sees its own token, also when several run side by side in one
/// task (`tokio::join!`, `select!`). Pass it to the resource you protect
/// (see the crate docs on fencing) so a holder that was paused past its
/// lease cannot overwrite newer work.
///
/// A multi-key body's is the token of its first key in sorted order (the
/// guard's [`fence`](crate::LockGuard::fence)); [`current_fences`] has them
/// all.
pub fn current_fence() -> Option<u64> {
    BODY.try_with(|b| b.fences.first()).ok().flatten()
}

/// Every key of the annotated body this code runs in (the innermost one)
/// with its token, sorted by key; empty outside one. A single-key body has
/// one entry, whose token is [`current_fence`]'s.
///
/// ```
/// use lock_runtime::{distributed_lock, LockClient, LockError};
///
/// #[distributed_lock(keys = ["account:{from}", "account:{to}"])]
/// async fn transfer(from: u64, to: u64) -> Result<Vec<(String, u64)>, LockError> {
///     // Send each account's token with its write.
///     Ok(lock_runtime::current_fences())
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), LockError> {
/// let fences = lock_runtime::with_client(LockClient::memory(), transfer(9, 1)).await?;
/// let keys: Vec<&str> = fences.iter().map(|(k, _)| k.as_str()).collect();
/// assert_eq!(keys, ["account:1", "account:9"]);
/// # Ok(()) }
/// ```
pub fn current_fences() -> Vec<(String, u64)> {
    BODY.try_with(|b| b.fences.all()).unwrap_or_default()
}
