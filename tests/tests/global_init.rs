//! The global client's life cycle. Its own binary: it must see the global
//! client before anything initialises it.

use lock_runtime::{distributed_lock, LockClient, LockError};
use std::sync::atomic::{AtomicBool, Ordering};

static RAN: AtomicBool = AtomicBool::new(false);

#[distributed_lock(key = "init:{id}")]
async fn guarded(id: u32) -> Result<u32, LockError> {
    RAN.store(true, Ordering::SeqCst);
    Ok(id)
}

#[tokio::test]
async fn not_initialized_then_already_initialized() {
    assert!(matches!(
        lock_runtime::client(),
        Err(LockError::NotInitialized)
    ));
    assert!(lock_runtime::current_fence().is_none());
    let err = guarded(1).await.unwrap_err();
    assert!(matches!(err, LockError::NotInitialized), "{err:?}");
    assert!(!RAN.load(Ordering::SeqCst), "body ran without a lock");

    lock_runtime::init(LockClient::memory()).unwrap();
    assert!(matches!(
        lock_runtime::init(LockClient::memory()),
        Err(LockError::AlreadyInitialized)
    ));
    assert_eq!(guarded(7).await.unwrap(), 7);
    assert!(RAN.load(Ordering::SeqCst));
}
