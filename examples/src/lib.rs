//! Runnable examples of `lock-runtime`; see `src/bin`.
//!
//! The library part holds the flash-sale demo ([`flash_sale`]), so that its
//! binary (`src/bin/flash-sale.rs`) and its integration test share one copy
//! of the service, the load generator and the report.

pub mod flash_sale;
