use lock_runtime::{distributed_lock, LockError};

#[distributed_lock(key = "render:{tenant}", mode = "read", permits = 4)]
async fn render(tenant: u64) -> Result<u64, LockError> {
    Ok(tenant)
}

fn main() {}
