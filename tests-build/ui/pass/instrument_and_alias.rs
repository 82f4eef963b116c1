use lock_runtime::{distributed_lock, LockError};

#[derive(Debug)]
struct MyErr;

impl From<LockError> for MyErr {
    fn from(_: LockError) -> Self {
        MyErr
    }
}

type Result<T> = std::result::Result<T, MyErr>;

#[tracing::instrument]
#[distributed_lock(key = "above:{id}")]
async fn instrument_above(id: u64) -> Result<u64> {
    Ok(id)
}

#[distributed_lock(key = "below:{id}")]
#[tracing::instrument]
async fn instrument_below(id: u64) -> Result<u64> {
    Ok(id)
}

fn main() {
    drop(instrument_above(1));
    drop(instrument_below(2));
}
