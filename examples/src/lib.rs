//! Runnable examples of `lock-runtime`; see `src/bin`.
//!
//! The library part holds the flash-sale demo ([`flash_sale`]) and the
//! rate-limited upstream ([`rate_limit`]), so that their binaries
//! (`src/bin/flash-sale.rs`, `src/bin/rate-limit.rs`) and their integration
//! tests share one copy of the service, the load and the report.

pub mod flash_sale;
pub mod instances;
pub mod rate_limit;
