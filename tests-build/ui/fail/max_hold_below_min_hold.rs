use lock_runtime::{distributed_lock, LockError};

#[distributed_lock(key = "job:{id}", lease = "5s", min_hold = "2m", max_hold = "1m")]
async fn run_job(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

fn main() {}
