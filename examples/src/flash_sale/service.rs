//! The shop's HTTP service.
//!
//! | route | answer |
//! |---|---|
//! | `POST /orders` `{"user": "u1", "item": "tickets"}` | 201 order, 409 `sold_out` / `already_bought`, 404 unknown item, 503 `lock_busy` |
//! | `GET /items/{id}` | the item's stock and sales |
//! | `GET /health` | 200 with the instance name and mode |
//!
//! The order handler reads the stock and the user's orders, checks them,
//! waits a little (a stand-in for payment checks, fraud scoring, … — and a
//! way to make the race easy to see), then writes the new stock. Without a
//! lock, two buyers of the same item interleave and both sell the last unit.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use lock_runtime::{distributed_lock, LockError};
use metrics_exporter_prometheus::PrometheusHandle;
use serde::{Deserialize, Serialize};

use super::store::{Committed, ItemInfo, Store, StoreError};

/// One service instance: where it keeps data, what it is called, and
/// whether it takes the lock.
pub struct Shop {
    /// Stock and orders, shared by every instance.
    pub store: Store,
    /// Name shown in logs, orders and `/health`.
    pub instance: String,
    /// Take `stock:{item}` around the read-modify-write (`false` = the
    /// `--unsafe` mode, for comparison).
    pub locked: bool,
    /// Pause between the read and the write (zero: only yield to the
    /// scheduler).
    pub race_delay: Duration,
    /// The lock figures this instance's `/metrics` shows (Prometheus
    /// text), if it installed a recorder.
    pub metrics: Option<PrometheusHandle>,
    /// The demo's paused holder: the next locked sale stops this process
    /// (SIGSTOP) just before its write, as a long GC pause or a frozen VM
    /// would; whoever started it sends SIGCONT.
    pub pause_before_write: std::sync::atomic::AtomicBool,
}

/// The body of `POST /orders`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OrderRequest {
    /// Who buys.
    pub user: String,
    /// What they buy.
    pub item: String,
}

/// A placed order (the body of a 201).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Order {
    /// Who bought.
    pub user: String,
    /// What they bought.
    pub item: String,
    /// The instance that sold it.
    pub instance: String,
    /// Units left after this sale, as this instance computed it.
    pub stock_left: i64,
    /// Fencing token of the lock held during the sale (`None` in unsafe
    /// mode).
    pub fence: Option<u64>,
}

/// Why an order was refused.
#[derive(Debug)]
pub enum OrderError {
    /// The item is not on sale (404).
    UnknownItem(String),
    /// No stock left (409 `sold_out`).
    SoldOut,
    /// One order per user per item (409 `already_bought`).
    AlreadyBought,
    /// The lock was busy for the whole wait (503 `lock_busy`), lost midway
    /// (503 `lock_lost`), or the lock service failed (500
    /// `lock_unavailable`): the runtime's own HTTP mapping.
    Lock(LockError),
    /// The store failed (500).
    Store(StoreError),
}

impl From<LockError> for OrderError {
    fn from(e: LockError) -> Self {
        OrderError::Lock(e)
    }
}

impl From<StoreError> for OrderError {
    fn from(e: StoreError) -> Self {
        OrderError::Store(e)
    }
}

impl std::fmt::Display for OrderError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            OrderError::UnknownItem(item) => write!(f, "item `{item}` is not on sale"),
            OrderError::SoldOut => f.write_str("sold out"),
            OrderError::AlreadyBought => f.write_str("this user already bought this item"),
            OrderError::Lock(e) => write!(f, "{e}"),
            OrderError::Store(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for OrderError {}

impl OrderError {
    /// The HTTP status and the machine-readable `error` code.
    pub fn status_and_code(&self) -> (StatusCode, &'static str) {
        match self {
            OrderError::UnknownItem(_) => (StatusCode::NOT_FOUND, "unknown_item"),
            OrderError::SoldOut => (StatusCode::CONFLICT, "sold_out"),
            OrderError::AlreadyBought => (StatusCode::CONFLICT, "already_bought"),
            OrderError::Lock(LockError::Timeout { .. }) => {
                (StatusCode::SERVICE_UNAVAILABLE, "lock_busy")
            }
            OrderError::Lock(LockError::Lost { .. }) => {
                (StatusCode::SERVICE_UNAVAILABLE, "lock_lost")
            }
            OrderError::Lock(_) => (StatusCode::INTERNAL_SERVER_ERROR, "lock_unavailable"),
            OrderError::Store(_) => (StatusCode::INTERNAL_SERVER_ERROR, "store"),
        }
    }
}

/// The JSON body of every refusal.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ErrorBody {
    /// `sold_out`, `already_bought`, `lock_busy`, `unknown_item`, …
    pub error: String,
    /// For people.
    pub message: String,
}

impl IntoResponse for OrderError {
    fn into_response(self) -> Response {
        // Lock errors answer as the runtime maps them (feature `axum`):
        // busy or lost 503 with a JSON body, others 500.
        if let OrderError::Lock(e) = self {
            return e.into_response();
        }
        let (status, code) = self.status_and_code();
        let body = Json(ErrorBody {
            error: code.to_owned(),
            message: self.to_string(),
        });
        if status == StatusCode::SERVICE_UNAVAILABLE {
            (status, [(header::RETRY_AFTER, "1")], body).into_response()
        } else {
            (status, body).into_response()
        }
    }
}

/// `GET /metrics`: the lock figures in Prometheus text format.
async fn metrics(State(shop): State<Arc<Shop>>) -> Response {
    match &shop.metrics {
        Some(handle) => handle.render().into_response(),
        None => (
            StatusCode::NOT_FOUND,
            "no metrics recorder in this instance",
        )
            .into_response(),
    }
}

/// The routes of one instance.
pub fn router(shop: Arc<Shop>) -> Router {
    Router::new()
        .route("/orders", post(create_order))
        .route("/items/{id}", get(item))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .with_state(shop)
}

/// Serve `shop` on `listener` until `shutdown` completes, then finish the
/// requests in flight.
pub async fn serve(
    listener: tokio::net::TcpListener,
    shop: Arc<Shop>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let addr = listener.local_addr()?;
    tracing::info!(instance = %shop.instance, %addr, locked = shop.locked, "serving");
    let instance = shop.instance.clone();
    axum::serve(listener, router(shop))
        .with_graceful_shutdown(shutdown)
        .await?;
    tracing::info!(%instance, "stopped");
    Ok(())
}

/// Completes on ctrl-c or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => tracing::info!("ctrl-c: shutting down"),
        () = term => tracing::info!("SIGTERM: shutting down"),
    }
}

async fn create_order(
    State(shop): State<Arc<Shop>>,
    Json(req): Json<OrderRequest>,
) -> Result<(StatusCode, Json<Order>), OrderError> {
    let result = if shop.locked {
        place_order_locked(&shop, &req).await
    } else {
        place_order(&shop, &req).await
    };
    match &result {
        Ok(order) => tracing::debug!(
            instance = %shop.instance, user = %req.user, item = %req.item,
            stock_left = order.stock_left, fence = ?order.fence, "sold"
        ),
        // A busy lock is the service working as intended: 503, retry.
        Err(e @ OrderError::Lock(LockError::Timeout { .. })) => tracing::info!(
            instance = %shop.instance, user = %req.user, item = %req.item, reason = %e, "lock busy"
        ),
        Err(e @ (OrderError::Lock(_) | OrderError::Store(_))) => tracing::warn!(
            instance = %shop.instance, user = %req.user, item = %req.item, error = %e, "order failed"
        ),
        Err(e) => tracing::debug!(
            instance = %shop.instance, user = %req.user, item = %req.item, reason = %e, "refused"
        ),
    }
    result.map(|order| (StatusCode::CREATED, Json(order)))
}

/// [`place_order`] under the item's lock: one buyer of an item at a time,
/// across every instance. Waits up to 2 s for the lock, then answers 503.
#[distributed_lock(key = "stock:{req.item}", lease = "10s", wait = "2s")]
pub async fn place_order_locked(shop: &Shop, req: &OrderRequest) -> Result<Order, OrderError> {
    place_order(shop, req).await
}

/// The order logic itself: read, check, (pause), write. Correct only when
/// no other buyer of the same item runs between the read and the write.
pub async fn place_order(shop: &Shop, req: &OrderRequest) -> Result<Order, OrderError> {
    // The lock's token goes with the read and the write: the store refuses
    // a write whose token is below one it has seen for the item.
    let fence = lock_runtime::current_fence();
    let snapshot = shop.store.read(&req.item, &req.user, fence).await?;
    let Some(stock) = snapshot.stock else {
        return Err(OrderError::UnknownItem(req.item.clone()));
    };
    if snapshot.bought > 0 {
        return Err(OrderError::AlreadyBought);
    }
    if stock <= 0 {
        return Err(OrderError::SoldOut);
    }
    // Payment checks, fraud scoring, …: anything that awaits between the
    // read and the write lets other buyers in.
    if shop.race_delay.is_zero() {
        tokio::task::yield_now().await;
    } else {
        tokio::time::sleep(shop.race_delay).await;
    }
    if fence.is_some()
        && shop
            .pause_before_write
            .swap(false, std::sync::atomic::Ordering::SeqCst)
    {
        pause_this_process();
    }
    let record = format!(
        "{}|{}|{}",
        req.user,
        shop.instance,
        fence.map_or_else(|| "-".to_owned(), |f| f.to_string())
    );
    let committed = shop
        .store
        .commit(&req.item, &req.user, stock - 1, &record, fence)
        .await?;
    if committed == Committed::Stale {
        // A later holder took the lock while this one was paused: the
        // store refused the write, and the buyer may retry.
        tracing::warn!(instance = %shop.instance, item = %req.item, ?fence, "stale write refused by the store");
        return Err(OrderError::Lock(LockError::Lost {
            key: format!("stock:{}", req.item),
        }));
    }
    Ok(Order {
        user: req.user.clone(),
        item: req.item.clone(),
        instance: shop.instance.clone(),
        stock_left: stock - 1,
        fence,
    })
}

async fn item(
    State(shop): State<Arc<Shop>>,
    Path(id): Path<String>,
) -> Result<Json<ItemInfo>, OrderError> {
    match shop.store.item(&id).await? {
        Some(info) => Ok(Json(info)),
        None => Err(OrderError::UnknownItem(id)),
    }
}

/// The body of `GET /health`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Health {
    /// Always `ok`.
    pub status: String,
    /// The instance name.
    pub instance: String,
    /// `locked` or `unsafe`.
    pub mode: String,
}

async fn health(State(shop): State<Arc<Shop>>) -> Json<Health> {
    Json(Health {
        status: "ok".into(),
        instance: shop.instance.clone(),
        mode: if shop.locked { "locked" } else { "unsafe" }.into(),
    })
}

/// Stop this whole process (every thread, the lock's watchdog too) until
/// someone sends SIGCONT.
fn pause_this_process() {
    tracing::warn!("pausing this process (SIGSTOP) before its write, as the demo asked");
    #[cfg(unix)]
    // SAFETY: raising a signal on this process; SIGSTOP cannot be caught.
    unsafe {
        libc::raise(libc::SIGSTOP);
    }
}
