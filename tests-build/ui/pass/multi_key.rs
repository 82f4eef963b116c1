use lock_runtime::{distributed_lock, LockError};

pub struct Account {
    pub id: u64,
}

#[distributed_lock(keys = ["account:{from.id}", "account:{to.id}"], wait = "5s")]
async fn transfer(from: &Account, to: &Account, amount: u64) -> Result<u64, LockError> {
    Ok(amount)
}

fn main() {}
