use lock_runtime::{distributed_lock, LockError};

pub struct App {
    pub name: String,
}

#[distributed_lock(key = "order:{id}", client = app.name)]
async fn pay(app: &App, id: u64) -> Result<u64, LockError> {
    Ok(id)
}

fn main() {}
