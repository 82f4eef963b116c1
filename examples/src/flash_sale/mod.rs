//! The flash-sale demo: a shop that must not sell more than it has.
//!
//! - [`store`]: stock and orders, in Redis, PostgreSQL ([`pg_store`]) or in
//!   memory, read and written in separate steps (a read-modify-write that
//!   races without a lock);
//! - [`service`]: the axum service (`POST /orders`, `GET /items/{id}`,
//!   `GET /health`), with the order handler under `#[distributed_lock]`
//!   unless started with `--unsafe`;
//! - [`spawn`]: child processes (a temporary `redis-server`, service
//!   instances) that die with the process that started them;
//! - [`temp_postgres`]: a temporary PostgreSQL server, for `--postgres`;
//! - [`loadgen`]: concurrent buyers, round-robin over the instances;
//! - [`scenario`]: one run (seed, start instances, load, stop, audit);
//! - [`report`]: the verdict table.

pub mod loadgen;
pub mod lock_figures;
pub mod pg_store;
pub mod report;
pub mod scenario;
pub mod service;
pub mod spawn;
pub mod store;
pub mod temp_postgres;
