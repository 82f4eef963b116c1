//! What a body does when its lock is lost while it runs.

/// What a body run under a lock does when the lock is lost while it runs
/// (the watchdog could not renew it in time, or Redis no longer has it).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum OnLost {
    /// Drop the body at its next await point and return
    /// `Err(LockError::Lost)` (`Err(LockError::MaxHoldReached)` when the
    /// hold reached its `max_hold`): nothing runs unprotected past the
    /// loss.
    #[default]
    Abort,
    /// Let the body finish; the loss is logged, and the result stands.
    Continue,
}
