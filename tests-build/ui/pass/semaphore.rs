use lock_runtime::{distributed_lock, LockClient, LockError};

// At most 4 renders per tenant at once, fleet-wide.
#[distributed_lock(key = "render:{tenant}", permits = 4)]
async fn render(tenant: u64) -> Result<u64, LockError> {
    Ok(tenant)
}

// Every other option keeps its meaning beside `permits`.
#[distributed_lock(
    key = "payments:{provider}",
    permits = 10,
    lease = "10s",
    wait = "2s",
    on_lost = "continue",
    min_hold = "1s",
    max_hold = "1m",
    fence = false
)]
async fn charge(provider: &str, cents: u64) -> Result<u64, LockError> {
    let _ = provider;
    Ok(cents)
}

#[distributed_lock(key = "import:{tenant}", permits = 2, on_busy = "skip", client = locks)]
async fn import(locks: &LockClient, tenant: u64) -> Result<Vec<u64>, LockError> {
    Ok(vec![tenant])
}

// A suffixed literal, and the largest a `u32` holds.
#[distributed_lock(key = "any", permits = 4_294_967_295u32)]
async fn unbounded() -> Result<(), LockError> {
    render(1).await.map(drop)
}

fn assert_send<T: Send>(_: T) {}

fn main() {
    let locks = LockClient::memory();
    assert_send(render(1));
    assert_send(charge("psp", 100));
    assert_send(import(&locks, 7));
    assert_send(unbounded());
}
