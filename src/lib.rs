//! placeholder
#![warn(missing_docs, missing_debug_implementations)]
#![deny(unsafe_op_in_unsafe_fn)]

mod builder;
mod cache;
mod clock;
mod entry;
mod local;
mod policy;
mod stats;
mod sync;
mod table;

pub use builder::{BuildError, CacheBuilder, MAX_CAPACITY_LIMIT, MAX_DURATION};
pub use cache::{Cache, CacheGuard};
pub use clock::{Clock, ManualClock, SystemClock};
pub use stats::Stats;

/// The default hasher: foldhash, randomly seeded for each cache.
pub type DefaultHashBuilder = foldhash::fast::RandomState;

/// The lock-free table under the cache, exported for the fuzz and loom crates. Not part of
/// the stable API.
#[doc(hidden)]
pub mod raw {
    pub use crate::table::{Decision, Iter, Node, Outcome, Table};
}
