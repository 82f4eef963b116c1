//! Key templates: each fn below has a template the macro rejects, and the
//! error points into it.

use lock_runtime::{distributed_lock, LockError};

// keys not strings
#[distributed_lock(keys = ["account:{from}", 7])]
async fn keys_not_strings(from: u64) -> Result<u64, LockError> {
    Ok(from)
}

// keys unknown placeholder
#[distributed_lock(keys = ["account:{from}", "account:{too}"])]
async fn keys_unknown_placeholder(from: u64, to: u64) -> Result<u64, LockError> {
    Ok(from + to)
}

// unknown placeholder
#[distributed_lock(key = "order:{order_id}")]
async fn unknown_placeholder(id: u64, amount: u64) -> Result<u64, LockError> {
    Ok(id + amount)
}

// unclosed brace
#[distributed_lock(key = "order:{id")]
async fn unclosed_brace(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

// self in free fn
#[distributed_lock(key = "tenant:{self.tenant}")]
async fn self_in_free_fn(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

fn main() {}
