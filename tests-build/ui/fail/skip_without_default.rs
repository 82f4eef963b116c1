use lock_runtime::{distributed_lock, LockError};

pub struct Receipt(u64);

#[distributed_lock(key = "job:{id}", on_busy = "skip")]
async fn run_job(id: u64) -> Result<Receipt, LockError> {
    Ok(Receipt(id))
}

fn main() {}
