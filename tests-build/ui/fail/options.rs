//! The attribute's options: each fn below has one wrong, and the error
//! points at it.

use lock_runtime::{distributed_lock, LockClient, LockError};

// bad duration
#[distributed_lock(key = "order:{id}", wait = "5 parsecs")]
async fn bad_duration(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

// bad mode
#[distributed_lock(key = "doc:{id}", mode = "shared")]
async fn bad_mode(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

// bad on busy
#[distributed_lock(key = "job:{id}", on_busy = "wait")]
async fn bad_on_busy(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

// bad on lost
#[distributed_lock(key = "order:{id}", on_lost = "retry")]
async fn bad_on_lost(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

// duplicate option
#[distributed_lock(key = "order:{id}", lease = "30s", lease = "10s")]
async fn duplicate_option(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

// misspelt option
#[distributed_lock(key = "order:{id}", wiat = "5s")]
async fn misspelt_option(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

// unknown option
#[distributed_lock(key = "order:{id}", ttl = "30s")]
async fn unknown_option(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

// non string value
#[distributed_lock(key = "order:{id}", lease = 30)]
async fn non_string_value(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

// zero lease
#[distributed_lock(key = "order:{id}", lease = "0s")]
async fn zero_lease(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

// max hold below lease
#[distributed_lock(key = "job:{id}", lease = "30s", max_hold = "10s")]
async fn max_hold_below_lease(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

// max hold below min hold
#[distributed_lock(key = "job:{id}", lease = "5s", min_hold = "2m", max_hold = "1m")]
async fn max_hold_below_min_hold(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

// missing key
#[distributed_lock(lease = "30s")]
async fn missing_key(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

// client twice
#[distributed_lock(key = "order:{id}", client = locks, client = locks)]
async fn client_twice(locks: &LockClient, id: u64) -> Result<u64, LockError> {
    Ok(id)
}

// key and keys
#[distributed_lock(key = "a:{x}", keys = ["b:{x}"])]
async fn key_and_keys(x: u64) -> Result<u64, LockError> {
    Ok(x)
}

fn main() {}
