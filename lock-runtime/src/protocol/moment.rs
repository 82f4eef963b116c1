//! A point in time, whichever clock the caller runs on.

use std::fmt::Debug;
use std::time::Duration;

/// A point on a monotonic clock: the runtime's `tokio::time::Instant`, or
/// the model's abstract milliseconds. The protocol only adds durations to
/// moments and measures between them.
pub trait Moment: Copy + Ord + Debug {
    /// `self + d`, or `None` past the clock's end.
    fn checked_after(self, d: Duration) -> Option<Self>;

    /// How long after `earlier` this is; zero if it is not after it.
    fn since(self, earlier: Self) -> Duration;

    /// `self + d`.
    fn after(self, d: Duration) -> Self {
        self.checked_after(d)
            .expect("a moment past the clock's end")
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Milliseconds on a test clock.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
    pub(crate) struct Ms(pub(crate) u64);

    impl Moment for Ms {
        fn checked_after(self, d: Duration) -> Option<Self> {
            Some(Ms(self
                .0
                .checked_add(u64::try_from(d.as_millis()).ok()?)?))
        }

        fn since(self, earlier: Self) -> Duration {
            Duration::from_millis(self.0.saturating_sub(earlier.0))
        }
    }
}
