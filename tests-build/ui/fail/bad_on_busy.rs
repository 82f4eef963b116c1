use lock_runtime::{distributed_lock, LockError};

#[distributed_lock(key = "job:{id}", on_busy = "wait")]
async fn run_job(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

fn main() {}
