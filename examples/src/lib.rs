//! Runnable examples of `lock-runtime`; see `src/bin`.
