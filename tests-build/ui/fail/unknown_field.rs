use lock_runtime::{distributed_lock, LockError};

struct Req {
    item: u64,
}

#[distributed_lock(key = "stock:{req.itme}")]
async fn buy(req: Req) -> Result<u64, LockError> {
    Ok(req.item)
}

fn main() {}
