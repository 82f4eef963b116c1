use lock_runtime::{distributed_lock, LockError};

pub struct Receipt(u64);

type JobResult = Result<Receipt, LockError>;

#[distributed_lock(key = "job:{id}", on_busy = "skip")]
async fn run_job(id: u64) -> JobResult {
    Ok(Receipt(id))
}

fn main() {}
