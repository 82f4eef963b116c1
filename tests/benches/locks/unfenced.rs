//! The unfenced lock (`client.lock(k).fence(false)`, shared/API.md "Locks
//! without a token") in the cases that compare fenced and unfenced rows.

use lock_runtime::LockRequest;

/// `request` without a fencing token, or `None` while this build of the
/// runtime has no `LockRequest::fence`: the unfenced rows are then left out
/// and say so.
///
/// THE SWITCH: once `LockRequest::fence(bool)` exists, replace the body's one
/// line with `Some(request.fence(false))`.
pub fn unfenced(request: LockRequest) -> Option<LockRequest> {
    Some(request.fence(false))
}

/// Whether the unfenced rows run in this build.
pub fn available(client: &lock_runtime::LockClient) -> bool {
    unfenced(client.lock("lockbench:probe")).is_some()
}

/// Why an unfenced row is empty.
pub const MISSING: &str = "not in this build: the runtime has no `LockRequest::fence(false)` yet";
