use lock_runtime::{distributed_lock, LockClient, LockError};

#[distributed_lock(key = "order:{id}", client = locks, client = locks)]
async fn pay(locks: &LockClient, id: u64) -> Result<u64, LockError> {
    Ok(id)
}

fn main() {}
