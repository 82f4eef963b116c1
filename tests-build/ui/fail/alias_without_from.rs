use lock_runtime::distributed_lock;

#[derive(Debug)]
pub struct ApiError;

type ApiResult<T> = Result<T, ApiError>;

#[distributed_lock(key = "order:{id}")]
async fn pay(id: u64) -> ApiResult<u64> {
    Ok(id)
}

fn main() {}
