use lock_runtime::{distributed_lock, LockError};

#[distributed_lock(keys = ["account:{from}", 7])]
async fn transfer(from: u64) -> Result<u64, LockError> {
    Ok(from)
}

fn main() {}
