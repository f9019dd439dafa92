//! The validated configuration a cache is built from.

use std::time::Duration;

use crate::clock::TimeSource;

/// Settings that passed validation.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub(crate) max_capacity: usize,
    pub(crate) initial_capacity: usize,
    /// Default hard TTL in nanoseconds, if any.
    pub(crate) time_to_live: Option<u64>,
    /// Time to idle, in idle units (see `clock::IDLE_SHIFT`), if any.
    pub(crate) time_to_idle: Option<u32>,
    /// The time to idle as set (`time_to_idle` is what entries count in).
    pub(crate) time_to_idle_set: Option<Duration>,
    /// Whether a weigher is set (`max_capacity` is then a weight).
    pub(crate) weighted: bool,
    /// How long a load error is cached, in nanoseconds, if at all.
    pub(crate) negative_ttl: Option<u64>,
    pub(crate) refresh: crate::refresh::RefreshSettings,
    pub(crate) max_concurrent_loads: Option<usize>,
    pub(crate) load_timeout: Option<Duration>,
    /// Nanoseconds.
    pub(crate) max_stale: u64,
    /// Runs the loads and refreshes that calls hand off.
    pub(crate) spawner: Option<crate::spawn::SharedSpawner>,
    pub(crate) clock: TimeSource,
}
