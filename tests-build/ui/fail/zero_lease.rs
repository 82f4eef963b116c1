use lock_runtime::{distributed_lock, LockError};

#[distributed_lock(key = "order:{id}", lease = "0s")]
async fn pay(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

fn main() {}
