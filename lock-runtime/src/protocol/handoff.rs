//! Clocks of a hand-off: when a waiter queued and when a release handed it
//! the lock, which decide whether a grant is stale and where its lease
//! starts.

use std::time::Duration;

use super::Moment;

/// A busy attempt that joined the lock's queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Queued {
    /// At this server time (ms).
    At(u64),
    /// In this process (memory): grants carry no clock.
    Here,
}

/// When a hand-off happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Stamp<I> {
    /// On the Redis server's clock, in ms; and when its message arrived
    /// here (the hand-off was no later than that).
    ServerMs(u64, I),
    /// On this process's clock.
    Local(I),
}

/// A grant from before the last attempt that queued (on the same clock):
/// the lock was lost since (it expired unrenewed, or the data was lost),
/// and the attempt that queued again saw someone else hold it.
pub fn is_stale<I: Moment>(queued_at: Option<(I, Queued)>, at: Stamp<I>) -> bool {
    match (queued_at, at) {
        (Some((_, Queued::At(q))), Stamp::ServerMs(g, _)) => g < q,
        (Some((sent, Queued::Here)), Stamp::Local(t)) => t < sent,
        _ => false,
    }
}

/// Where a handed-over lease starts on this process's clock, never later
/// than it did: the queuing attempt was sent at `sent` (local), and the
/// backend's clock then read `queued`; the grant happened `at` on that same
/// clock, and its message arrived no earlier. If the server's clock ran
/// ahead of ours in between (a failover to another server, a clock step),
/// the earliest possible start wins: the send.
pub fn lease_start<I: Moment>(started: I, queued_at: Option<(I, Queued)>, at: Stamp<I>) -> I {
    match (queued_at, at) {
        (_, Stamp::Local(t)) => t,
        (Some((sent, Queued::At(q))), Stamp::ServerMs(g, heard)) => {
            let server = Duration::from_millis(g.saturating_sub(q));
            if server > heard.since(sent) {
                sent
            } else {
                sent.after(server)
            }
        }
        (Some((sent, Queued::Here)), Stamp::ServerMs(..)) => sent,
        // The attempt that queued got no answer: the earliest moment this
        // request could have been granted.
        (None, Stamp::ServerMs(..)) => started,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::moment::tests::Ms;

    #[test]
    fn a_handed_over_lease_is_never_booked_later_than_it_started() {
        let started = Ms(0);
        let sent = Ms(10);
        let heard = Ms(510);
        let queued = Some((sent, Queued::At(1_000)));
        // Handed over 300 ms (server clock) after queuing: 300 ms after the
        // send, which is no later than on the server.
        assert_eq!(
            lease_start(started, queued, Stamp::ServerMs(1_300, heard)),
            Ms(310)
        );
        // The server's clock claims more time passed than could have here
        // (another server, a clock step): the send.
        assert_eq!(
            lease_start(started, queued, Stamp::ServerMs(2_000, heard)),
            sent
        );
        // The queuing attempt's answer was lost: the request's start.
        assert_eq!(
            lease_start(started, None, Stamp::ServerMs(1_300, heard)),
            started
        );
        // A grant from before the latest queuing is stale.
        assert!(is_stale(queued, Stamp::ServerMs(999, heard)));
        assert!(!is_stale(queued, Stamp::ServerMs(1_000, heard)));
    }
}
