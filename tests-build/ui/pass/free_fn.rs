use lock_runtime::{distributed_lock, LockError};

#[derive(Debug)]
enum AppError {
    Lock(LockError),
    Declined,
}

impl From<LockError> for AppError {
    fn from(e: LockError) -> Self {
        AppError::Lock(e)
    }
}

fn check(amount: u64) -> Result<(), AppError> {
    if amount == 0 {
        return Err(AppError::Declined);
    }
    Ok(())
}

#[distributed_lock(key = "order:{id}:{{literal}}", lease = "30s", wait = "5s", on_lost = "continue")]
pub async fn pay(id: u64, amount: u64) -> Result<u64, AppError> {
    check(amount)?;
    if amount > 100 {
        return Ok(100);
    }
    Ok(amount)
}

fn main() {
    let _ = pay(1, 2);
    let _ = AppError::Lock(LockError::NotInitialized);
}
