//! The lock client's decisions, free of I/O: what a request does on each
//! answer, grant and timer, where a hand-off grant goes, what the watchdog
//! sends and what its answers mean, and whether a release lets go or keeps
//! the lock for its `min_hold`.
//!
//! Plain state and functions of (state, event, `now`) → what to do next,
//! as `quinn-proto` and `h2`'s `proto` keep their state machines. The
//! runtime's loops (`request.rs`, `claims.rs`, `watchdog.rs`, `guard.rs`)
//! do the I/O and call these; the protocol model (`lock-model`) calls the
//! very same functions under every interleaving it explores, with its own
//! clock. Nothing here imports the rest of the crate: no tokio, no
//! backend, no client.

pub mod acquiring;
pub mod grants;
pub mod handoff;
pub mod moment;
pub mod releasing;
pub mod renewing;

pub use acquiring::{Acquiring, AfterBusy, Listening, OnGrant, Outgoing, Timing};
pub use grants::{orphan_released, route, Route, ORPHAN_AFTER};
pub use handoff::{is_stale, lease_start, Queued, Stamp};
pub use moment::Moment;
pub use releasing::{keep_for, keep_until};
pub use renewing::{interval, Renewing, Tick, Verdict};
