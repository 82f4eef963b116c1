use lock_runtime::distributed_lock;

#[derive(Debug)]
struct MyError;

const _: Option<lock_runtime::LockError> = None;

#[distributed_lock(key = "order:{id}")]
async fn pay(id: u64) -> Result<u64, MyError> {
    Ok(id)
}

fn main() {}
