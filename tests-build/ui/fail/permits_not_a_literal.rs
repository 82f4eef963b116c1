use lock_runtime::{distributed_lock, LockError};

const RENDERS: u32 = 4;

#[distributed_lock(key = "render:{tenant}", permits = RENDERS)]
async fn render(tenant: u64) -> Result<u64, LockError> {
    Ok(tenant + u64::from(RENDERS))
}

fn main() {}
