//! Semaphores on one Redis server or Redis Cluster: the permit scripts
//! (`docs/SEMAPHORES.md`), reached from `node.rs` for owner ids of
//! `Mode::Permit`.

use std::time::Duration;

use super::RedisNode;
use crate::backend::fault::Fault;
use crate::backend::{Acquired, Queue};
use crate::key::LockName;

impl RedisNode {
    /// Take a permit of `name` for `owner` (`permit.lua`), or queue it.
    pub(crate) async fn acquire_permit(
        &self,
        name: &LockName,
        owner: &str,
        lease: Duration,
        floor: Option<u64>,
        queue: Queue,
    ) -> Result<Acquired, Fault> {
        let _ = (name, owner, lease, floor, queue);
        Err(Fault::Config(
            "semaphores are not available on this deployment yet".into(),
        ))
    }
}
