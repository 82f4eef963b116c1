//! Stock and orders of the sale: in Redis or PostgreSQL ([`super::pg_store`])
//! when instances are separate processes, in memory when the demo runs
//! them all in one process.
//!
//! Reads and writes are deliberately separate calls ([`Store::read`], then
//! [`Store::commit`] with the new stock value computed by the caller): a
//! read-modify-write that is only correct when something (the lock) keeps
//! two buyers of one item from interleaving. An atomic `DECR` would hide
//! exactly the bug the demo is about.
//!
//! The store checks fencing tokens: a read or write that carries the lock's
//! token (`current_fence()`) raises the item's highest token seen, and a
//! write whose token is below it is refused, not applied
//! ([`Committed::Stale`]). A buyer whose lock lapsed mid-purchase (its
//! process paused past the lease) cannot overwrite the sale of the buyer
//! that took the lock after it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};

use super::pg_store::PgStore;

/// Where the shop keeps its data. Cheap to clone.
#[derive(Clone)]
pub enum Store {
    /// Shared by every instance that connects to the same Redis.
    Redis(ConnectionManager),
    /// Shared by every instance that connects to the same database.
    Postgres(Arc<PgStore>),
    /// Shared by the instances of one process only.
    Memory(Arc<MemoryStore>),
}

/// What a buyer sees before deciding: stock left (`None` if the item does
/// not exist) and how many orders this user already has for the item.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Snapshot {
    /// Units left according to the stock counter.
    pub stock: Option<i64>,
    /// Orders this user already placed for the item.
    pub bought: u64,
}

/// The public view of an item (`GET /items/{id}`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ItemInfo {
    /// The item id.
    pub id: String,
    /// Units put on sale.
    pub initial: i64,
    /// What the stock counter says is left.
    pub stock: i64,
    /// Order records actually written: the truth, whatever the counter says.
    pub sold: u64,
}

/// The ground truth of one item after a run, from the stored records.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Audit {
    /// Units put on sale.
    pub initial: i64,
    /// What the stock counter says is left.
    pub stock_counter: i64,
    /// Order records written.
    pub sold: u64,
    /// Users with more than one order for the item.
    pub duplicate_buyers: u64,
    /// Writes refused because their token was below one already seen.
    pub stale_refused: u64,
}

/// Initial stock, stock counter, orders, buyers, stale writes refused.
type AuditReply = (
    Option<i64>,
    Option<i64>,
    u64,
    HashMap<String, u64>,
    Option<u64>,
);

/// What [`Store::commit`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Committed {
    /// Written.
    Applied,
    /// Refused, nothing written: its token is below one the store has
    /// already seen for the item (a later holder of the lock read or
    /// wrote it).
    Stale,
}

impl Audit {
    /// Orders beyond the stock that was on sale.
    pub fn oversold(&self) -> u64 {
        (self.sold as i64 - self.initial).max(0) as u64
    }
}

/// A failed store operation.
#[derive(Debug)]
pub struct StoreError(pub String);

impl std::fmt::Display for StoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "store: {}", self.0)
    }
}

impl std::error::Error for StoreError {}

impl From<redis::RedisError> for StoreError {
    fn from(e: redis::RedisError) -> Self {
        StoreError(e.to_string())
    }
}

fn stock_key(item: &str) -> String {
    format!("flash:{item}:stock")
}
fn initial_key(item: &str) -> String {
    format!("flash:{item}:initial")
}
fn buyers_key(item: &str) -> String {
    format!("flash:{item}:buyers")
}
fn orders_key(item: &str) -> String {
    format!("flash:{item}:orders")
}
fn fence_key(item: &str) -> String {
    format!("flash:{item}:fence")
}
fn stale_key(item: &str) -> String {
    format!("flash:{item}:stale")
}

/// A read that carries a token: raises the item's highest token seen
/// (KEYS: stock, buyers, fence; ARGV: user, token).
const READ_FENCED: &str = r"
local seen = tonumber(redis.call('GET', KEYS[3]) or '0')
if tonumber(ARGV[2]) > seen then redis.call('SET', KEYS[3], ARGV[2]) end
return {redis.call('GET', KEYS[1]), redis.call('HGET', KEYS[2], ARGV[1])}
";

/// A write that carries a token: refused (and counted) below the highest
/// token seen, else applied (KEYS: stock, buyers, orders, fence, stale;
/// ARGV: new stock, user, record, token).
const COMMIT_FENCED: &str = r"
local seen = tonumber(redis.call('GET', KEYS[4]) or '0')
if tonumber(ARGV[4]) < seen then
  redis.call('INCR', KEYS[5])
  return 0
end
redis.call('SET', KEYS[4], ARGV[4])
redis.call('SET', KEYS[1], ARGV[1])
redis.call('HINCRBY', KEYS[2], ARGV[2], 1)
redis.call('RPUSH', KEYS[3], ARGV[3])
return 1
";

/// Whether `url` names a PostgreSQL database (`postgres://`,
/// `postgresql://`) rather than a Redis: the scheme picks the store, as it
/// picks the lock engine in `LockClient::connect`.
pub fn is_postgres_url(url: &str) -> bool {
    url.starts_with("postgres://") || url.starts_with("postgresql://")
}

impl Store {
    /// Connect to Redis, or to PostgreSQL for a `postgres://` URL
    /// ([`is_postgres_url`]). The Redis response timeout is raised from the
    /// client's 500 ms default: a loaded 2-core machine can exceed it.
    pub async fn connect(url: &str) -> Result<Store, StoreError> {
        if is_postgres_url(url) {
            return Ok(Store::Postgres(Arc::new(PgStore::connect(url).await?)));
        }
        let client = redis::Client::open(url)?;
        let config = ConnectionManagerConfig::new()
            .set_response_timeout(Some(Duration::from_secs(5)))
            .set_connection_timeout(Some(Duration::from_secs(3)))
            .set_number_of_retries(3);
        Ok(Store::Redis(
            client.get_connection_manager_with_config(config).await?,
        ))
    }

    /// A store private to this process.
    pub fn memory() -> Store {
        Store::Memory(Arc::new(MemoryStore::default()))
    }

    /// Put `stock` units of `item` on sale, forgetting earlier orders.
    pub async fn seed(&self, item: &str, stock: i64) -> Result<(), StoreError> {
        match self {
            Store::Redis(con) => {
                let mut con = con.clone();
                redis::pipe()
                    .atomic()
                    .del(&[
                        buyers_key(item),
                        orders_key(item),
                        fence_key(item),
                        stale_key(item),
                    ])
                    .ignore()
                    .set(stock_key(item), stock)
                    .ignore()
                    .set(initial_key(item), stock)
                    .ignore()
                    .query_async::<()>(&mut con)
                    .await?;
                Ok(())
            }
            Store::Postgres(pg) => pg.seed(item, stock).await,
            Store::Memory(m) => {
                m.items.lock().unwrap().insert(
                    item.to_owned(),
                    MemItem {
                        initial: stock,
                        stock,
                        ..MemItem::default()
                    },
                );
                Ok(())
            }
        }
    }

    /// Read the stock counter and the user's orders for `item`; with the
    /// lock's `fence`, no write with a lower token is accepted after this.
    pub async fn read(
        &self,
        item: &str,
        user: &str,
        fence: Option<u64>,
    ) -> Result<Snapshot, StoreError> {
        match self {
            Store::Redis(con) => {
                let mut con = con.clone();
                if let Some(fence) = fence {
                    let (stock, bought): (Option<i64>, Option<u64>) =
                        redis::Script::new(READ_FENCED)
                            .key(stock_key(item))
                            .key(buyers_key(item))
                            .key(fence_key(item))
                            .arg(user)
                            .arg(fence)
                            .invoke_async(&mut con)
                            .await?;
                    return Ok(Snapshot {
                        stock,
                        bought: bought.unwrap_or(0),
                    });
                }
                let (stock, bought): (Option<i64>, Option<u64>) = redis::pipe()
                    .get(stock_key(item))
                    .hget(buyers_key(item), user)
                    .query_async(&mut con)
                    .await?;
                Ok(Snapshot {
                    stock,
                    bought: bought.unwrap_or(0),
                })
            }
            Store::Postgres(pg) => pg.read(item, user, fence).await,
            Store::Memory(m) => {
                let mut items = m.items.lock().unwrap();
                Ok(match items.get_mut(item) {
                    Some(it) => {
                        it.fence = it.fence.max(fence.unwrap_or(0));
                        Snapshot {
                            stock: Some(it.stock),
                            bought: it.buyers.get(user).copied().unwrap_or(0),
                        }
                    }
                    None => Snapshot {
                        stock: None,
                        bought: 0,
                    },
                })
            }
        }
    }

    /// Write a sale: set the stock counter to `new_stock` (computed by the
    /// caller from its earlier read), count the user's order, append the
    /// order record. With the lock's `fence`, refused if a higher token
    /// was seen for the item.
    pub async fn commit(
        &self,
        item: &str,
        user: &str,
        new_stock: i64,
        record: &str,
        fence: Option<u64>,
    ) -> Result<Committed, StoreError> {
        match self {
            Store::Redis(con) => {
                let mut con = con.clone();
                if let Some(fence) = fence {
                    let applied: i64 = redis::Script::new(COMMIT_FENCED)
                        .key(stock_key(item))
                        .key(buyers_key(item))
                        .key(orders_key(item))
                        .key(fence_key(item))
                        .key(stale_key(item))
                        .arg(new_stock)
                        .arg(user)
                        .arg(record)
                        .arg(fence)
                        .invoke_async(&mut con)
                        .await?;
                    return Ok(if applied == 1 {
                        Committed::Applied
                    } else {
                        Committed::Stale
                    });
                }
                redis::pipe()
                    .atomic()
                    .set(stock_key(item), new_stock)
                    .ignore()
                    .hincr(buyers_key(item), user, 1)
                    .ignore()
                    .rpush(orders_key(item), record)
                    .ignore()
                    .query_async::<()>(&mut con)
                    .await?;
                Ok(Committed::Applied)
            }
            Store::Postgres(pg) => pg.commit(item, user, new_stock, record, fence).await,
            Store::Memory(m) => {
                let mut items = m.items.lock().unwrap();
                let it = items.entry(item.to_owned()).or_default();
                if let Some(fence) = fence {
                    if fence < it.fence {
                        it.stale += 1;
                        return Ok(Committed::Stale);
                    }
                    it.fence = fence;
                }
                it.stock = new_stock;
                *it.buyers.entry(user.to_owned()).or_default() += 1;
                it.orders.push(record.to_owned());
                Ok(Committed::Applied)
            }
        }
    }

    /// The public view of `item`, or `None` if it is not on sale.
    pub async fn item(&self, item: &str) -> Result<Option<ItemInfo>, StoreError> {
        let audit = self.audit(item).await?;
        Ok(audit.map(|a| ItemInfo {
            id: item.to_owned(),
            initial: a.initial,
            stock: a.stock_counter,
            sold: a.sold,
        }))
    }

    /// Count what was really sold, from the order records.
    pub async fn audit(&self, item: &str) -> Result<Option<Audit>, StoreError> {
        match self {
            Store::Redis(con) => {
                let mut con = con.clone();
                let (initial, stock, sold, buyers, stale): AuditReply = redis::pipe()
                    .get(initial_key(item))
                    .get(stock_key(item))
                    .llen(orders_key(item))
                    .hgetall(buyers_key(item))
                    .get(stale_key(item))
                    .query_async(&mut con)
                    .await?;
                let Some(initial) = initial else {
                    return Ok(None);
                };
                Ok(Some(Audit {
                    initial,
                    stock_counter: stock.unwrap_or(0),
                    sold,
                    duplicate_buyers: buyers.values().filter(|n| **n > 1).count() as u64,
                    stale_refused: stale.unwrap_or(0),
                }))
            }
            Store::Postgres(pg) => pg.audit(item).await,
            Store::Memory(m) => {
                let items = m.items.lock().unwrap();
                Ok(items.get(item).map(|it| Audit {
                    initial: it.initial,
                    stock_counter: it.stock,
                    sold: it.orders.len() as u64,
                    duplicate_buyers: it.buyers.values().filter(|n| **n > 1).count() as u64,
                    stale_refused: it.stale,
                }))
            }
        }
    }
}

/// The in-memory store: one map behind a mutex, never held across an
/// `.await`, so it races exactly like Redis does between read and commit.
#[derive(Default)]
pub struct MemoryStore {
    items: Mutex<HashMap<String, MemItem>>,
}

#[derive(Default)]
struct MemItem {
    initial: i64,
    stock: i64,
    buyers: HashMap<String, u64>,
    orders: Vec<String>,
    /// The highest token seen.
    fence: u64,
    /// Writes refused for a lower token.
    stale: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A write whose token is below one the store has seen for the item is
    /// refused and counted; equal or higher ones are applied.
    #[tokio::test]
    async fn a_write_below_the_highest_token_seen_is_refused() {
        let store = Store::memory();
        store.seed("i", 2).await.unwrap();
        // The paused holder (token 5) read; then the next holder (token 9).
        store.read("i", "a", Some(5)).await.unwrap();
        store.read("i", "b", Some(9)).await.unwrap();
        assert_eq!(
            store.commit("i", "b", 1, "b", Some(9)).await.unwrap(),
            Committed::Applied
        );
        assert_eq!(
            store.commit("i", "a", 1, "a", Some(5)).await.unwrap(),
            Committed::Stale
        );
        let audit = store.audit("i").await.unwrap().unwrap();
        assert_eq!(
            (audit.sold, audit.stock_counter, audit.stale_refused),
            (1, 1, 1)
        );
    }
}
