use lock_runtime::{distributed_lock, LockError};

#[distributed_lock(key = "a:{x}", keys = ["b:{x}"])]
async fn both(x: u64) -> Result<u64, LockError> {
    Ok(x)
}

fn main() {}
