//! Return types named through aliases: the check is the type system's.
use lock_runtime::{distributed_lock, LockError};

#[derive(Debug)]
pub struct ApiError;

impl From<LockError> for ApiError {
    fn from(_: LockError) -> Self {
        ApiError
    }
}

type ApiResult<T> = Result<T, ApiError>;
type Count = Result<u32, ApiError>;

#[distributed_lock(key = "order:{id}")]
async fn pay(id: u64) -> ApiResult<u64> {
    Ok(id)
}

#[distributed_lock(key = "job:{id}", on_busy = "skip")]
async fn job(id: u64) -> ApiResult<Vec<u64>> {
    Ok(vec![id])
}

#[distributed_lock(key = "count:{id}", on_busy = "skip")]
async fn count(id: u32) -> Count {
    Ok(id)
}

fn main() {
    let _ = (pay(1), job(2), count(3));
}
