//! Cache warming: loading a list of keys with bounded parallelism before serving.

use std::hash::{BuildHasher, Hash};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use crate::cache::Cache;

/// What [`Cache::warm`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct WarmReport {
    /// Keys whose value was loaded (by this warm-up, or by a concurrent load it joined).
    pub loaded: u64,
    /// Keys that already had a value and were left alone.
    pub skipped: u64,
    /// Keys whose load returned an error or panicked.
    pub failed: u64,
}

/// Progress of a warm-up, passed to the callback of [`Cache::warm_with_progress`] after each
/// key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct WarmProgress {
    /// Keys finished so far.
    pub done: u64,
    /// Keys in the list.
    pub total: u64,
    /// The counts so far.
    pub report: WarmReport,
}

impl<K, V, S> Cache<K, V, S>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
    S: BuildHasher + Send + Sync,
{
    /// Loads every key of `keys` that has no value yet, running `loader` on up to
    /// `concurrency` threads (scoped: all have finished when this returns; 0 means 1).
    ///
    /// Loads go through single flight, so a reader of a key being warmed waits for the same
    /// load, and through `max_concurrent_loads` if set. A failing or panicking loader counts
    /// as failed and does not stop the warm-up.
    ///
    /// ```
    /// let cache = herdcache::Cache::builder().max_capacity(1_000).build()?;
    /// cache.insert(1u32, 10u32);
    /// let report = cache.warm(0..100u32, |k| Ok::<_, ()>(k * 10), 4);
    /// assert_eq!((report.loaded, report.skipped, report.failed), (99, 1, 0));
    /// # Ok::<(), herdcache::BuildError>(())
    /// ```
    pub fn warm<I, E, F>(&self, keys: I, loader: F, concurrency: usize) -> WarmReport
    where
        I: IntoIterator<Item = K>,
        F: Fn(&K) -> Result<V, E> + Sync,
        E: Send + Sync + 'static,
    {
        self.warm_with_progress(keys, loader, concurrency, |_| {})
    }

    /// Like [`warm`](Self::warm), calling `progress` after each key (from the worker threads).
    pub fn warm_with_progress<I, E, F, P>(
        &self,
        keys: I,
        loader: F,
        concurrency: usize,
        progress: P,
    ) -> WarmReport
    where
        I: IntoIterator<Item = K>,
        F: Fn(&K) -> Result<V, E> + Sync,
        E: Send + Sync + 'static,
        P: Fn(WarmProgress) + Sync,
    {
        let keys: Vec<K> = keys.into_iter().collect();
        let total = keys.len() as u64;
        let next = AtomicUsize::new(0);
        let counts = [AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)];
        let done = AtomicU64::new(0);
        let snapshot = |counts: &[AtomicU64; 3]| WarmReport {
            loaded: counts[0].load(Ordering::Relaxed),
            skipped: counts[1].load(Ordering::Relaxed),
            failed: counts[2].load(Ordering::Relaxed),
        };
        let workers = concurrency.clamp(1, keys.len().max(1));
        std::thread::scope(|s| {
            for _ in 0..workers {
                s.spawn(|| loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(key) = keys.get(i) else { break };
                    let outcome = if self.peek_live(key) {
                        1
                    } else {
                        match catch_unwind(AssertUnwindSafe(|| self.get_or_load(key, &loader))) {
                            Ok(Ok(_)) => 0,
                            Ok(Err(_)) | Err(_) => 2,
                        }
                    };
                    counts[outcome].fetch_add(1, Ordering::Relaxed);
                    let done = done.fetch_add(1, Ordering::Relaxed) + 1;
                    progress(WarmProgress {
                        done,
                        total,
                        report: snapshot(&counts),
                    });
                });
            }
        });
        snapshot(&counts)
    }
}
