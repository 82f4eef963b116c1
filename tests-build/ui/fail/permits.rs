//! `permits`: each fn below asks for a semaphore the macro rejects.

use lock_runtime::{distributed_lock, LockError};

const RENDERS: u32 = 4;

// permits not a literal
#[distributed_lock(key = "render:{tenant}", permits = RENDERS)]
async fn permits_not_a_literal(tenant: u64) -> Result<u64, LockError> {
    Ok(tenant + u64::from(RENDERS))
}

// permits too many
#[distributed_lock(key = "render:{tenant}", permits = 5_000_000_000)]
async fn permits_too_many(tenant: u64) -> Result<u64, LockError> {
    Ok(tenant)
}

// permits twice
#[distributed_lock(key = "render:{tenant}", permits = 4, permits = 8)]
async fn permits_twice(tenant: u64) -> Result<u64, LockError> {
    Ok(tenant)
}

// permits with keys
#[distributed_lock(keys = ["render:{a}", "render:{b}"], permits = 4)]
async fn permits_with_keys(a: u64, b: u64) -> Result<u64, LockError> {
    Ok(a + b)
}

// permits with mode
#[distributed_lock(key = "render:{tenant}", mode = "read", permits = 4)]
async fn permits_with_mode(tenant: u64) -> Result<u64, LockError> {
    Ok(tenant)
}

// permits zero
#[distributed_lock(key = "render:{tenant}", permits = 0)]
async fn permits_zero(tenant: u64) -> Result<u64, LockError> {
    Ok(tenant)
}

fn main() {}
