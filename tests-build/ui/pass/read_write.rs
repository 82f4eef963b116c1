use lock_runtime::{distributed_lock, LockError};

#[distributed_lock(key = "doc:{id}", mode = "read")]
async fn show(id: u64) -> Result<u64, LockError> {
    edit_free(id).await
}

#[distributed_lock(key = "doc:{id}", mode = "write", wait = "5s")]
async fn edit(id: u64) -> Result<u64, LockError> {
    show(id).await
}

#[distributed_lock(keys = ["doc:{a}", "doc:{b}"], mode = "read")]
async fn compare(a: u64, b: u64) -> Result<u64, LockError> {
    Ok(a + b)
}

async fn edit_free(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

fn assert_send<T: Send>(_: T) {}

fn main() {
    assert_send(show(1));
    assert_send(edit(1));
    assert_send(compare(1, 2));
}
