use lock_runtime::{distributed_lock, LockError};

#[distributed_lock(keys = ["account:{from}", "account:{too}"])]
async fn transfer(from: u64, to: u64) -> Result<u64, LockError> {
    Ok(from + to)
}

fn main() {}
