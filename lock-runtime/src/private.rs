//! The attribute's only door into the runtime: re-exports, so that the
//! expansion names nothing the user's crate must depend on. Not public API:
//! names here may change in any release.

pub use std::format;
pub use std::time::Duration;

pub use crate::run::{LockResult, SkipResult};
