//! Who may still claim a hand-off grant: each client's lock requests that
//! are under way, by owner id.
//!
//! A release hands the lock to a queued owner and tells its client on the
//! client's grant channel. The grant belongs to the request that queued
//! that owner for as long as the request lives, whatever it is doing when
//! the message arrives: parked, sending an attempt again, or waiting for a
//! late answer. A request registers its owner before its first attempt is
//! sent ([`Claims::open`]) and unregisters when it ends, so a grant always
//! finds its request while there is one. A request that ends without the
//! lock takes its attempts back (the release passes a grant on); only a
//! grant whose owner has no request any more is an orphan, released by the
//! client after [`ORPHAN_AFTER`] unless that owner holds the lock.
//!
//! Grants name their client by id, so the claims of every client of the
//! process are found by the front of the owner id.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex, Weak};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use crate::key::client_of;
use crate::own_keys::OwnKeys;
use crate::protocol::{self, Route};

pub(crate) use crate::protocol::ORPHAN_AFTER;

/// How long an owner that got its lock by asking again is remembered, for
/// a grant message of the same hand-off that may still come.
const SETTLED_FOR: Duration = Duration::from_secs(60);

/// A lock handed over by a release.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Grant {
    pub(crate) fence: u64,
    /// When the release handed it over: its lease counts from there.
    pub(crate) at: Stamp,
}

/// When a hand-off happened, on the runtime's clock.
pub(crate) type Stamp = protocol::Stamp<tokio::time::Instant>;

/// What a client does with a grant whose owner has no request any more:
/// (the grant channel it was heard on, the owner).
pub(crate) type OnOrphan = Box<dyn Fn(&str, Arc<str>) + Send + Sync>;

/// Where a request's grant lands.
#[derive(Default)]
pub(crate) struct Mailbox {
    grant: Mutex<Option<Grant>>,
    pub(crate) arrived: Notify,
}

impl Mailbox {
    /// The grant, if one arrived (taken).
    pub(crate) fn take(&self) -> Option<Grant> {
        self.grant.lock().unwrap().take()
    }

    fn put(&self, grant: Grant) {
        *self.grant.lock().unwrap() = Some(grant);
        self.arrived.notify_one();
    }
}

/// One client's requests under way, and owners that settled.
pub(crate) struct Claims {
    /// The client's id.
    client: Arc<str>,
    live: Mutex<HashMap<Arc<str>, Arc<Mailbox>, OwnKeys>>,
    /// Owners holding a lock that a grant message may still name.
    settled: Mutex<HashMap<Arc<str>, Instant, OwnKeys>>,
    on_orphan: OnOrphan,
}

/// The claims of every client of this process, by client id.
static CLIENTS: LazyLock<Mutex<HashMap<Arc<str>, Weak<Claims>>>> = LazyLock::new(Mutex::default);

impl Claims {
    /// The claims of a new client (`client`: its id); `on_orphan` releases
    /// a grant that no request claims. Unregistered when dropped.
    pub(crate) fn register(client: &Arc<str>, on_orphan: OnOrphan) -> Arc<Claims> {
        let claims = Arc::new(Claims {
            client: client.clone(),
            live: Mutex::default(),
            settled: Mutex::default(),
            on_orphan,
        });
        CLIENTS
            .lock()
            .unwrap()
            .insert(client.clone(), Arc::downgrade(&claims));
        claims
    }

    /// The claims of the client that `owner` belongs to.
    fn of(owner: &str) -> Option<Arc<Claims>> {
        let mut clients = CLIENTS.lock().unwrap();
        let found = clients.get(client_of(owner)).map(Weak::upgrade);
        match found {
            Some(Some(c)) => Some(c),
            Some(None) => {
                clients.remove(client_of(owner));
                None
            }
            None => None,
        }
    }

    /// A request of `owner` is under way: from before its first attempt
    /// is sent until the returned claim is dropped, a grant for `owner`
    /// lands in the claim's mailbox.
    pub(crate) fn open(self: &Arc<Self>, owner: &Arc<str>) -> Claim {
        let mailbox = Arc::new(Mailbox::default());
        self.live
            .lock()
            .unwrap()
            .insert(owner.clone(), mailbox.clone());
        Claim {
            claims: self.clone(),
            owner: owner.clone(),
            mailbox,
        }
    }
}

impl Drop for Claims {
    fn drop(&mut self) {
        let mut clients = CLIENTS.lock().unwrap();
        if clients
            .get(&self.client)
            .is_some_and(|w| w.strong_count() == 0)
        {
            clients.remove(&self.client);
        }
    }
}

/// The mailbox of `owner`'s request, if one is under way.
pub(crate) fn mailbox(owner: &str) -> Option<Arc<Mailbox>> {
    let claims = Claims::of(owner)?;
    let live = claims.live.lock().unwrap();
    live.get(owner).cloned()
}

/// Hand `grant` to `owner`'s request; false if it has none (in-process
/// hand-off: the next waiter is served instead).
pub(crate) fn deliver(owner: &str, grant: Grant) -> bool {
    match mailbox(owner) {
        Some(m) => {
            m.put(grant);
            true
        }
        None => false,
    }
}

/// A grant message for `owner` heard on `channel`: to its request if one
/// is under way; else ignored if the owner holds the lock through an
/// attempt of its own; else an orphan, which the client releases.
pub(crate) fn granted(channel: &str, owner: &str, grant: Grant) {
    let Some(claims) = Claims::of(owner) else {
        return;
    };
    let live = claims.live.lock().unwrap().get(owner).cloned();
    let settled = live.is_none() && {
        let mut settled = claims.settled.lock().unwrap();
        let now = Instant::now();
        settled.retain(|_, at| now.duration_since(*at) < SETTLED_FOR);
        settled.remove(owner).is_some()
    };
    match protocol::route(live.is_some(), settled) {
        Route::Mailbox => live.expect("a live request").put(grant),
        Route::Settled => {}
        Route::Orphan => (claims.on_orphan)(channel, owner.into()),
    }
}

/// A request under way (see [`Claims::open`]).
pub(crate) struct Claim {
    claims: Arc<Claims>,
    owner: Arc<str>,
    mailbox: Arc<Mailbox>,
}

impl Claim {
    pub(crate) fn mailbox(&self) -> &Arc<Mailbox> {
        &self.mailbox
    }

    /// The request holds its lock through an attempt of its own (answered
    /// `Repeated` after a hand-off, say): a grant message for its owner that
    /// is still on its way names a lock already held, and is no orphan.
    pub(crate) fn settle(&self) {
        if self.mailbox.take().is_some() {
            return;
        }
        let now = Instant::now();
        let mut settled = self.claims.settled.lock().unwrap();
        settled.retain(|_, at| now.duration_since(*at) < SETTLED_FOR);
        settled.insert(self.owner.clone(), now);
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        let mut live = self.claims.live.lock().unwrap();
        if live
            .get(&self.owner)
            .is_some_and(|m| Arc::ptr_eq(m, &self.mailbox))
        {
            live.remove(&self.owner);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn grant(fence: u64) -> Grant {
        static HEARD: LazyLock<tokio::time::Instant> = LazyLock::new(tokio::time::Instant::now);
        Grant {
            fence,
            at: Stamp::ServerMs(1, *HEARD),
        }
    }

    fn client(id: &str) -> (Arc<str>, Arc<Claims>, Arc<AtomicUsize>) {
        let orphans = Arc::new(AtomicUsize::new(0));
        let o = orphans.clone();
        let id: Arc<str> = id.into();
        let claims = Claims::register(
            &id,
            Box::new(move |_, _| {
                o.fetch_add(1, Ordering::SeqCst);
            }),
        );
        (id, claims, orphans)
    }

    #[test]
    fn a_grant_reaches_a_request_under_way_whatever_it_does() {
        let (_, claims, orphans) = client("claims-t1");
        let name = "lock:{k}:granted:claims-t1";
        let owner: Arc<str> = "claims-t1:1".into();
        let claim = claims.open(&owner);
        // No waiter registered anywhere: the request is still sending.
        granted(name, &owner, grant(7));
        assert_eq!(
            orphans.load(Ordering::SeqCst),
            0,
            "released under its request"
        );
        assert_eq!(claim.mailbox().take(), Some(grant(7)));
        drop(claim);
        // The request is over: now the grant is an orphan.
        granted(name, &owner, grant(8));
        assert_eq!(orphans.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn a_settled_owner_s_late_grant_is_no_orphan() {
        let (_, claims, orphans) = client("claims-t2");
        let name = "lock:{k}:granted:claims-t2";
        let owner: Arc<str> = "claims-t2:1".into();
        let claim = claims.open(&owner);
        claim.settle();
        drop(claim);
        granted(name, &owner, grant(3));
        assert_eq!(orphans.load(Ordering::SeqCst), 0);
        assert!(
            !deliver("claims-t2:9", grant(1)),
            "a grant found a stranger"
        );
    }
}
