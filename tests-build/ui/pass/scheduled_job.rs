use lock_runtime::{distributed_lock, LockError};

#[distributed_lock(key = "job:nightly-report", wait = "0s", on_busy = "skip", min_hold = "50s", max_hold = "10m")]
async fn nightly_report() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "job:{id}", on_busy = "error", lease = "10s", max_hold = "10s")]
async fn count(id: u64) -> Result<Vec<u64>, LockError> {
    Ok(vec![id])
}

fn assert_send<T: Send>(_: T) {}

fn main() {
    assert_send(nightly_report());
    assert_send(count(1));
    let client = lock_runtime::LockClient::memory();
    assert_send(client.lock("k").try_acquire());
}
