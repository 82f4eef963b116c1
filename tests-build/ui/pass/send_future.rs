use lock_runtime::{distributed_lock, LockError};

#[distributed_lock(key = "send:{id}")]
async fn handler(id: u64) -> Result<u64, LockError> {
    tokio::task::yield_now().await;
    Ok(id)
}

fn assert_send<T: Send + 'static>(_: T) {}

fn main() {
    // axum and tokio::spawn need the future to be Send.
    assert_send(handler(1));
}
