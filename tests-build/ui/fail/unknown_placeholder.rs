use lock_runtime::{distributed_lock, LockError};

#[distributed_lock(key = "order:{order_id}")]
async fn pay(id: u64, amount: u64) -> Result<u64, LockError> {
    Ok(id + amount)
}

fn main() {}
