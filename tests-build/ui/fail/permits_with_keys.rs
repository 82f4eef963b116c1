use lock_runtime::{distributed_lock, LockError};

#[distributed_lock(keys = ["render:{a}", "render:{b}"], permits = 4)]
async fn render(a: u64, b: u64) -> Result<u64, LockError> {
    Ok(a + b)
}

fn main() {}
