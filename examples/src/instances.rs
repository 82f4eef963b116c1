//! The clients of several instances of one service, for the examples that
//! show what a lock or a semaphore does across instances.

use lock_runtime::{LockClient, LockError};

use crate::flash_sale::spawn::TempRedis;

/// `n` clients, as `n` instances would have: each connected to
/// `REDIS_URL`, else to a temporary `redis-server` if one is on `PATH`,
/// else all sharing one in-memory backend.
pub struct Instances {
    pub clients: Vec<LockClient>,
    /// Where they lock, for the example's first line.
    pub on: String,
    /// The temporary server, stopped when dropped (after the clients).
    pub redis: Option<TempRedis>,
}

impl Instances {
    pub async fn connect(n: usize) -> Result<Self, LockError> {
        let redis = match std::env::var("REDIS_URL") {
            Ok(_) => None,
            Err(_) => TempRedis::start().ok().flatten(),
        };
        let url = std::env::var("REDIS_URL")
            .ok()
            .or_else(|| redis.as_ref().map(TempRedis::url));
        let shared_memory = LockClient::memory();
        let mut clients = Vec::with_capacity(n);
        for _ in 0..n {
            clients.push(match &url {
                Some(url) => LockClient::connect(url).await?,
                None => shared_memory.clone(),
            });
        }
        let on = url.unwrap_or_else(|| "the in-memory backend".into());
        Ok(Instances { clients, on, redis })
    }
}
