use lock_runtime::{distributed_lock, LockError};

#[distributed_lock(key = "order:{id}")]
fn pay(id: u64) -> Result<(), LockError> {
    let _ = id;
    Ok(())
}

fn main() {}
