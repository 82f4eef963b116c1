//! `client = <expr>`: a client, a reference to one, or one behind an
//! `Arc`, named from the fn's parameters or its receiver.
use std::sync::Arc;

use lock_runtime::{distributed_lock, LockClient, LockError};

#[derive(Clone)]
pub struct App {
    pub locks: LockClient,
}

#[distributed_lock(key = "order:{id}", client = app.locks)]
async fn by_value(app: App, id: u64) -> Result<u64, LockError> {
    // The body still owns `app`.
    let _moved = app;
    Ok(id)
}

#[distributed_lock(key = "order:{id}", client = &app.locks, wait = "1s")]
async fn by_ref(app: &App, id: u64) -> Result<u64, LockError> {
    Ok(id)
}

#[distributed_lock(key = "order:{id}", client = locks)]
async fn arc(locks: Arc<LockClient>, id: u64) -> Result<u64, LockError> {
    Ok(id)
}

pub struct Service {
    locks: LockClient,
}

impl Service {
    #[distributed_lock(key = "job:{name}", client = self.locks)]
    async fn run(&self, name: &str) -> Result<(), LockError> {
        let _ = name;
        Ok(())
    }
}

fn main() {
    let _ = (by_value, by_ref, arc, Service::run);
}
