use lock_runtime::{distributed_lock, LockError};

#[distributed_lock(key = "doc:{id}", mode = "shared")]
async fn show(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

fn main() {}
