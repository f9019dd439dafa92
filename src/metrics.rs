//! The `metrics` feature: a cache's statistics as `metrics` counters and gauges.

use std::hash::{BuildHasher, Hash};

use crate::{Cache, Stats};

/// A counter's exported name and how to read it from a snapshot.
type Exported = (&'static str, fn(&Stats) -> u64);

/// Each monotonic counter of `Stats`, by its exported name (`herdcache_` prefixed).
const COUNTERS: &[Exported] = &[
    ("herdcache_hits_total", |s| s.hits),
    ("herdcache_misses_total", |s| s.misses),
    ("herdcache_inserts_total", |s| s.inserts),
    ("herdcache_updates_total", |s| s.updates),
    ("herdcache_invalidations_total", |s| s.invalidations),
    ("herdcache_evictions_total", |s| s.evictions),
    ("herdcache_expirations_total", |s| s.expirations),
    ("herdcache_loads_total", |s| s.loads),
    ("herdcache_coalesced_waits_total", |s| s.coalesced_waits),
    ("herdcache_load_errors_total", |s| s.load_errors),
    ("herdcache_load_panics_total", |s| s.load_panics),
    ("herdcache_timeouts_total", |s| s.timeouts),
    ("herdcache_refreshes_total", |s| s.refreshes),
    ("herdcache_refresh_failures_total", |s| s.refresh_failures),
    ("herdcache_throttled_total", |s| s.throttled),
    ("herdcache_loads_cancelled_total", |s| s.loads_cancelled),
    ("herdcache_load_timeouts_total", |s| s.load_timeouts),
    ("herdcache_stale_served_total", |s| s.stale_served),
    ("herdcache_shared_hits_total", |s| s.shared_hits),
    ("herdcache_shared_loads_total", |s| s.shared_loads),
    ("herdcache_shared_lock_waits_total", |s| s.shared_lock_waits),
    ("herdcache_shared_wait_timeouts_total", |s| {
        s.shared_wait_timeouts
    }),
    ("herdcache_shared_errors_total", |s| s.shared_errors),
    ("herdcache_shared_codec_errors_total", |s| {
        s.shared_codec_errors
    }),
    ("herdcache_shared_writes_sent_total", |s| {
        s.shared_writes_sent
    }),
    ("herdcache_shared_writes_heard_total", |s| {
        s.shared_writes_heard
    }),
    ("herdcache_shared_broadcast_lag_micros_total", |s| {
        s.shared_broadcast_lag_micros
    }),
    ("herdcache_shared_stale_dropped_total", |s| {
        s.shared_stale_dropped
    }),
    ("herdcache_shared_conflicts_total", |s| s.shared_conflicts),
    ("herdcache_shared_skipped_total", |s| s.shared_skipped),
    ("herdcache_listener_skipped_total", |s| s.listener_skipped),
    ("herdcache_shared_writes_failed_total", |s| {
        s.shared_writes_failed
    }),
    ("herdcache_shared_writes_replayed_total", |s| {
        s.shared_writes_replayed
    }),
];

impl<K, V, S> Cache<K, V, S>
where
    K: Hash + Eq + Send + Sync + 'static,
    V: Send + Sync + 'static,
    S: BuildHasher,
{
    /// Sends the cache's statistics to the installed `metrics` recorder, labelled
    /// `cache = name`: every counter of [`Stats`] as a counter (`herdcache_hits_total`, ...,
    /// set to its absolute value), and as gauges `herdcache_loads_in_flight`,
    /// `herdcache_entries`, `herdcache_weighted_size`, `herdcache_hit_ratio` and
    /// `herdcache_load_latency_seconds` (label `quantile` = `0.5`, `0.99`, `max`).
    ///
    /// Call it where the recorder is scraped or flushed (or on a timer): it sums the
    /// per-thread counters once per call, so it costs what [`stats`](Self::stats) does.
    ///
    /// ```
    /// let cache: herdcache::Cache<u32, u32> = herdcache::Cache::builder().max_capacity(10).build()?;
    /// cache.export_metrics("users");
    /// # Ok::<(), herdcache::BuildError>(())
    /// ```
    pub fn export_metrics(&self, name: &str) {
        let s = self.stats();
        let cache = name.to_owned();
        for (metric, value) in COUNTERS {
            metrics::counter!(*metric, "cache" => cache.clone()).absolute(value(&s));
        }
        let gauges = [
            ("herdcache_loads_in_flight", s.loads_in_flight as f64),
            ("herdcache_entries", self.entry_count() as f64),
            ("herdcache_weighted_size", self.weighted_size() as f64),
            ("herdcache_hit_ratio", s.hit_ratio()),
        ];
        for (metric, value) in gauges {
            metrics::gauge!(metric, "cache" => cache.clone()).set(value);
        }
        for (quantile, d) in [
            ("0.5", s.load_latency_p50),
            ("0.99", s.load_latency_p99),
            ("max", s.load_latency_max),
        ] {
            metrics::gauge!("herdcache_load_latency_seconds", "cache" => cache.clone(), "quantile" => quantile)
                .set(d.as_secs_f64());
        }
    }
}
