//! Stock and orders of the sale: in Redis when instances are separate
//! processes, in memory when the demo runs them all in one process.
//!
//! Reads and writes are deliberately separate calls ([`Store::read`], then
//! [`Store::commit`] with the new stock value computed by the caller): a
//! read-modify-write that is only correct when something (the lock) keeps
//! two buyers of one item from interleaving. An atomic `DECR` would hide
//! exactly the bug the demo is about.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};

/// Where the shop keeps its data. Cheap to clone.
#[derive(Clone)]
pub enum Store {
    /// Shared by every instance that connects to the same Redis.
    Redis(ConnectionManager),
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

impl Store {
    /// Connect to Redis. The response timeout is raised from the client's
    /// 500 ms default: a loaded 2-core machine can exceed it.
    pub async fn connect(url: &str) -> Result<Store, StoreError> {
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
                    .del(&[buyers_key(item), orders_key(item)])
                    .ignore()
                    .set(stock_key(item), stock)
                    .ignore()
                    .set(initial_key(item), stock)
                    .ignore()
                    .query_async::<()>(&mut con)
                    .await?;
                Ok(())
            }
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

    /// Read the stock counter and the user's orders for `item`.
    pub async fn read(&self, item: &str, user: &str) -> Result<Snapshot, StoreError> {
        match self {
            Store::Redis(con) => {
                let mut con = con.clone();
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
            Store::Memory(m) => {
                let items = m.items.lock().unwrap();
                Ok(match items.get(item) {
                    Some(it) => Snapshot {
                        stock: Some(it.stock),
                        bought: it.buyers.get(user).copied().unwrap_or(0),
                    },
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
    /// order record.
    pub async fn commit(
        &self,
        item: &str,
        user: &str,
        new_stock: i64,
        record: &str,
    ) -> Result<(), StoreError> {
        match self {
            Store::Redis(con) => {
                let mut con = con.clone();
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
                Ok(())
            }
            Store::Memory(m) => {
                let mut items = m.items.lock().unwrap();
                let it = items.entry(item.to_owned()).or_default();
                it.stock = new_stock;
                *it.buyers.entry(user.to_owned()).or_default() += 1;
                it.orders.push(record.to_owned());
                Ok(())
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
                let (initial, stock, sold, buyers): (
                    Option<i64>,
                    Option<i64>,
                    u64,
                    HashMap<String, u64>,
                ) = redis::pipe()
                    .get(initial_key(item))
                    .get(stock_key(item))
                    .llen(orders_key(item))
                    .hgetall(buyers_key(item))
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
                }))
            }
            Store::Memory(m) => {
                let items = m.items.lock().unwrap();
                Ok(items.get(item).map(|it| Audit {
                    initial: it.initial,
                    stock_counter: it.stock,
                    sold: it.orders.len() as u64,
                    duplicate_buyers: it.buyers.values().filter(|n| **n > 1).count() as u64,
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
}
