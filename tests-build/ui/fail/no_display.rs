use lock_runtime::{distributed_lock, LockError};

struct OrderId(u64);

#[distributed_lock(key = "order:{id}")]
async fn pay(id: OrderId) -> Result<u64, LockError> {
    Ok(id.0)
}

fn main() {}
