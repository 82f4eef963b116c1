extern crate lock_runtime as my_locks;

use my_locks::LockError;

#[my_locks::distributed_lock(key = "renamed:{id}", crate = "my_locks")]
async fn pay(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

fn main() {
    drop(pay(1));
}
