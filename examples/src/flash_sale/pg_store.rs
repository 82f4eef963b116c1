//! The shop's stock and orders in PostgreSQL, in the database that also
//! holds the locks (the `--postgres` variant of the demo).
//!
//! As in Redis, the read and the write are separate statements: a
//! read-modify-write that is only correct under the lock. The fencing
//! token is checked in the shop's own table, in the transaction that
//! writes: `flash_items.fence` holds the highest token seen for the item,
//! a fenced read raises it, and the sale's `UPDATE` applies only where it
//! is not above the writer's token, the order being inserted in the same
//! transaction only if that `UPDATE` hit the row. The lock library's own
//! tables are never read.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::{Mutex, MutexGuard};
use tokio_postgres::{Client, NoTls};

use super::store::{Audit, Committed, Snapshot, StoreError};

/// Connections per store: a sale's transaction has one to itself.
const CONNECTIONS: usize = 4;

/// Taken while the tables are created, so that instances starting
/// together do not race on `CREATE … IF NOT EXISTS`.
const SCHEMA_LOCK: i64 = 0x666c_6173_685f_7631;

/// `flash_items.fence`: the highest token seen for the item (0: none);
/// `stale`: writes refused for a lower one. Orders have no unique
/// `(item, buyer)` key on purpose: the unsafe run must be able to show
/// duplicate purchases.
const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS flash_items (
    id      text PRIMARY KEY,
    initial bigint NOT NULL,
    stock   bigint NOT NULL,
    fence   bigint NOT NULL DEFAULT 0,
    stale   bigint NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS flash_orders (
    item   text NOT NULL,
    buyer  text NOT NULL,
    record text NOT NULL,
    fence  bigint
);
CREATE INDEX IF NOT EXISTS flash_orders_item_buyer ON flash_orders (item, buyer);
";

/// A read without a token (the `--unsafe` instances).
const READ: &str = "
SELECT (SELECT stock FROM flash_items WHERE id = $1),
       (SELECT count(*) FROM flash_orders WHERE item = $1 AND buyer = $2)";

/// A read with the lock's token: raises the item's highest token seen, so
/// that a holder whose lease lapsed cannot write between this read and
/// this holder's write.
const READ_FENCED: &str = "
WITH seen AS (
    UPDATE flash_items SET fence = greatest(fence, $3) WHERE id = $1 RETURNING stock
)
SELECT (SELECT stock FROM seen),
       (SELECT count(*) FROM flash_orders WHERE item = $1 AND buyer = $2)";

/// The sale's write without a token.
const SELL: &str = "UPDATE flash_items SET stock = $2 WHERE id = $1";

/// The sale's write with the lock's token: no row is hit if a later holder
/// read or wrote the item. Equal tokens are the same holder (its own read,
/// or a reentry), so `<=`.
const SELL_FENCED: &str =
    "UPDATE flash_items SET stock = $2, fence = $3 WHERE id = $1 AND fence <= $3";

const INSERT_ORDER: &str =
    "INSERT INTO flash_orders (item, buyer, record, fence) VALUES ($1, $2, $3, $4)";

const COUNT_STALE: &str = "UPDATE flash_items SET stale = stale + 1 WHERE id = $1";

const AUDIT: &str = "
SELECT i.initial, i.stock, i.stale,
       (SELECT count(*) FROM flash_orders o WHERE o.item = i.id),
       (SELECT count(*) FROM (SELECT FROM flash_orders o WHERE o.item = i.id
                              GROUP BY o.buyer HAVING count(*) > 1) d)
FROM flash_items i WHERE i.id = $1";

/// A few connections to one database; each statement or transaction takes
/// one to itself.
pub struct PgStore {
    connections: Vec<Mutex<Client>>,
    next: AtomicUsize,
}

impl From<tokio_postgres::Error> for StoreError {
    fn from(e: tokio_postgres::Error) -> Self {
        // The server's message, not only "db error".
        match e.as_db_error() {
            Some(db) => StoreError(format!("{}: {}", db.code().code(), db.message())),
            None => StoreError(e.to_string()),
        }
    }
}

impl PgStore {
    /// Connect and create the shop's tables if they are missing.
    pub(crate) async fn connect(url: &str) -> Result<PgStore, StoreError> {
        let mut config: tokio_postgres::Config = url.parse()?;
        config.connect_timeout(Duration::from_secs(5));
        let mut connections = Vec::with_capacity(CONNECTIONS);
        for _ in 0..CONNECTIONS {
            let (client, connection) = config.connect(NoTls).await?;
            // A broken connection fails every later statement on it, each
            // reported where it is used: debug is enough here (the demo's
            // last connections end so when it stops its temporary server).
            tokio::spawn(async move {
                if let Err(e) = connection.await {
                    tracing::debug!(error = %e, "store connection closed");
                }
            });
            connections.push(Mutex::new(client));
        }
        let store = PgStore {
            connections,
            next: AtomicUsize::new(0),
        };
        store
            .connection()
            .await
            .batch_execute(&format!(
                "BEGIN; SELECT pg_advisory_xact_lock({SCHEMA_LOCK}); {SCHEMA} COMMIT;"
            ))
            .await?;
        Ok(store)
    }

    /// A free connection if there is one, else the next in turn.
    async fn connection(&self) -> MutexGuard<'_, Client> {
        for c in &self.connections {
            if let Ok(guard) = c.try_lock() {
                return guard;
            }
        }
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.connections.len();
        self.connections[i].lock().await
    }

    pub(crate) async fn seed(&self, item: &str, stock: i64) -> Result<(), StoreError> {
        let mut client = self.connection().await;
        let tx = client.transaction().await?;
        tx.execute("DELETE FROM flash_orders WHERE item = $1", &[&item])
            .await?;
        tx.execute(
            "INSERT INTO flash_items (id, initial, stock) VALUES ($1, $2, $2)
             ON CONFLICT (id) DO UPDATE
             SET initial = excluded.initial, stock = excluded.stock, fence = 0, stale = 0",
            &[&item, &stock],
        )
        .await?;
        tx.commit().await?;
        Ok(())
    }

    pub(crate) async fn read(
        &self,
        item: &str,
        user: &str,
        fence: Option<u64>,
    ) -> Result<Snapshot, StoreError> {
        let client = self.connection().await;
        let row = match fence {
            Some(fence) => {
                client
                    .query_one(READ_FENCED, &[&item, &user, &to_bigint(fence)?])
                    .await?
            }
            None => client.query_one(READ, &[&item, &user]).await?,
        };
        Ok(Snapshot {
            stock: row.try_get(0)?,
            bought: row.try_get::<_, i64>(1)? as u64,
        })
    }

    /// One transaction: the stock written (with a token: only if no later
    /// token was seen), and the order inserted only if it was.
    pub(crate) async fn commit(
        &self,
        item: &str,
        user: &str,
        new_stock: i64,
        record: &str,
        fence: Option<u64>,
    ) -> Result<Committed, StoreError> {
        let fence = fence.map(to_bigint).transpose()?;
        let mut client = self.connection().await;
        let tx = client.transaction().await?;
        let hit = match fence {
            Some(fence) => {
                tx.execute(SELL_FENCED, &[&item, &new_stock, &fence])
                    .await?
            }
            None => tx.execute(SELL, &[&item, &new_stock]).await?,
        };
        let committed = if hit == 1 {
            tx.execute(INSERT_ORDER, &[&item, &user, &record, &fence])
                .await?;
            Committed::Applied
        } else if fence.is_some() && tx.execute(COUNT_STALE, &[&item]).await? == 1 {
            Committed::Stale
        } else {
            return Err(StoreError(format!("item `{item}` is not on sale")));
        };
        tx.commit().await?;
        Ok(committed)
    }

    pub(crate) async fn audit(&self, item: &str) -> Result<Option<Audit>, StoreError> {
        let client = self.connection().await;
        let Some(row) = client.query_opt(AUDIT, &[&item]).await? else {
            return Ok(None);
        };
        Ok(Some(Audit {
            initial: row.try_get(0)?,
            stock_counter: row.try_get(1)?,
            stale_refused: row.try_get::<_, i64>(2)? as u64,
            sold: row.try_get::<_, i64>(3)? as u64,
            duplicate_buyers: row.try_get::<_, i64>(4)? as u64,
        }))
    }
}

/// A token as PostgreSQL's `bigint`.
fn to_bigint(fence: u64) -> Result<i64, StoreError> {
    i64::try_from(fence).map_err(|_| StoreError(format!("token {fence} exceeds a bigint")))
}
