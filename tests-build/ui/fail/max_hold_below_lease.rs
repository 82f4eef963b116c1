use lock_runtime::{distributed_lock, LockError};

#[distributed_lock(key = "job:{id}", lease = "30s", max_hold = "10s")]
async fn run_job(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

fn main() {}
