//! The I/O thread's connection of a client made with `connect_lazy`:
//! opened on first use, and opened again after an open that failed.
//! (`redis`'s own lazy `ConnectionManager` keeps the error of a first open
//! that failed other than by I/O, such as a refused password or an ACL user
//! not made yet, for good: renewals and background releases, which go over
//! this connection, would then fail for as long as the process runs.)

use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::RedisResult;
use tokio::runtime::Handle;

pub(super) struct LazyManager {
    client: redis::Client,
    config: ConnectionManagerConfig,
    /// The client's I/O runtime: the manager spawns its reconnects on the
    /// runtime it is made on, which must outlive any caller's.
    io: Handle,
    /// How long one open may take.
    within: Duration,
    made: tokio::sync::Mutex<Option<ConnectionManager>>,
}

impl LazyManager {
    pub(super) fn new(
        client: redis::Client,
        config: ConnectionManagerConfig,
        io: Handle,
        within: Duration,
    ) -> Self {
        LazyManager {
            client,
            config,
            io,
            within,
            made: tokio::sync::Mutex::new(None),
        }
    }

    /// The connection, opened now if it is not yet (one open at a time;
    /// a failed one leaves nothing, and the next call opens anew).
    pub(super) async fn get(&self) -> RedisResult<ConnectionManager> {
        let mut made = self.made.lock().await;
        if let Some(conn) = &*made {
            return Ok(conn.clone());
        }
        let (client, config, within) = (self.client.clone(), self.config.clone(), self.within);
        let opened = self
            .io
            .spawn(async move {
                tokio::time::timeout(within, ConnectionManager::new_with_config(client, config))
                    .await
            })
            .await;
        let conn = match opened {
            Ok(Ok(opened)) => opened?,
            Ok(Err(_)) => {
                return Err(redis::RedisError::from(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("opening a connection took longer than {within:?}"),
                )))
            }
            Err(e) => {
                return Err(redis::RedisError::from(std::io::Error::other(format!(
                    "opening a connection: {e}"
                ))))
            }
        };
        *made = Some(conn.clone());
        Ok(conn)
    }
}
