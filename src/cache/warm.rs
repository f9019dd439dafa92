//! Cache warming: loading a list of keys with bounded parallelism before serving.

use std::hash::{BuildHasher, Hash};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::Instant;

use super::Cache;
use crate::sync::{AtomicBool, AtomicUsize, Condvar, Mutex, Ordering};

/// What [`Cache::warm`] did.
///
/// ```
/// let cache = herdcache::Cache::builder().max_capacity(100).build()?;
/// cache.insert(0u32, 0u32);
/// let load = |k: &u32| if k % 4 == 3 { Err("not found") } else { Ok(k * 2) };
/// let report = cache.warm(0..8, load, 2);
/// assert_eq!((report.loaded, report.skipped, report.failed), (5, 1, 2));
/// # Ok::<(), herdcache::BuildError>(())
/// ```
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
///
/// ```
/// let cache = herdcache::Cache::builder().max_capacity(100).build()?;
/// let mut last = None;
/// cache.warm_with_progress(0..10u32, |k| Ok::<_, ()>(*k), 4, |p| last = Some(p));
/// let last: herdcache::WarmProgress = last.unwrap();
/// assert_eq!((last.done, last.total, last.report.loaded), (10, 10, 10));
/// # Ok::<(), herdcache::BuildError>(())
/// ```
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

/// The most loads a warm-up runs at once, whatever `concurrency` asks for: each is a thread,
/// and a warm-up wider than its source can take is the herd the cache exists to prevent.
///
/// ```
/// use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
/// use std::sync::Arc;
/// let cache = herdcache::Cache::builder().max_capacity(1_000).build()?;
/// let (running, peak) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
/// let (r, p) = (Arc::clone(&running), Arc::clone(&peak));
/// let load = move |k: &u32| {
///     p.fetch_max(r.fetch_add(1, SeqCst) + 1, SeqCst);
///     r.fetch_sub(1, SeqCst);
///     Ok::<_, ()>(*k)
/// };
/// let report = cache.warm(0..500, load, 1_000); // asks for 1,000 threads
/// assert_eq!(report.loaded, 500);
/// assert!(peak.load(SeqCst) <= herdcache::MAX_WARM_CONCURRENCY);
/// # Ok::<(), herdcache::BuildError>(())
/// ```
pub const MAX_WARM_CONCURRENCY: usize = 64;

/// How each key of a warm-up ended.
#[derive(Clone, Copy)]
enum Outcome {
    Loaded = 0,
    Skipped = 1,
    Failed = 2,
}

/// What the warm-up's caller and its workers share.
struct Shared<K> {
    keys: Vec<K>,
    next: AtomicUsize,
    /// Set when the warm-up returns: workers still running (stuck in a hung loader) take no
    /// further key.
    stop: AtomicBool,
    state: Mutex<Progress>,
    changed: Condvar,
}

#[derive(Default)]
struct Progress {
    /// Finished keys not yet reported: `(index, outcome)`.
    finished: Vec<(usize, Outcome)>,
    /// What each worker is loading, and since when; `None` between keys.
    current: Vec<Option<(usize, Instant)>>,
    /// Workers given up on (stuck past the load timeout): they exit when their loader
    /// returns.
    abandoned: Vec<bool>,
}

impl<K, V, S> Cache<K, V, S>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
    S: BuildHasher + Send + Sync + 'static,
{
    /// Loads every key of `keys` that has no value yet, running `loader` on up to
    /// `concurrency` threads at once (loads past their `load_timeout` aside, see below) (at least 1, at most [`MAX_WARM_CONCURRENCY`], and at
    /// most [`max_concurrent_loads`](crate::CacheBuilder::max_concurrent_loads)).
    ///
    /// Loads go through single flight, so a reader of a key being warmed waits for the same
    /// load, and through `max_concurrent_loads` if set. A failing or panicking loader counts
    /// as failed and does not stop the warm-up.
    ///
    /// It returns once every key is done. With a
    /// [`load_timeout`](crate::CacheBuilder::load_timeout), a key whose loader is still
    /// running at its deadline counts as failed and the warm-up goes on without it (the
    /// loader's thread stays in it until it returns, then exits), so a hung loader cannot hold
    /// the warm-up forever; without one, the warm-up waits for every loader to return.
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
        F: Fn(&K) -> Result<V, E> + Send + Sync + 'static,
        E: Send + Sync + 'static,
    {
        self.warm_with_progress(keys, loader, concurrency, |_| {})
    }

    /// Like [`warm`](Self::warm), calling `progress` after each key (on the calling thread).
    ///
    /// ```
    /// let cache = herdcache::Cache::builder().max_capacity(100).build()?;
    /// let mut percent = Vec::new();
    /// let log = |p: herdcache::WarmProgress| percent.push(100 * p.done / p.total);
    /// let report = cache.warm_with_progress(0..4u32, |k| Ok::<_, ()>(*k), 2, log);
    /// assert_eq!(percent, [25, 50, 75, 100]);
    /// assert_eq!(report.loaded, 4);
    /// # Ok::<(), herdcache::BuildError>(())
    /// ```
    pub fn warm_with_progress<I, E, F, P>(
        &self,
        keys: I,
        loader: F,
        concurrency: usize,
        mut progress: P,
    ) -> WarmReport
    where
        I: IntoIterator<Item = K>,
        F: Fn(&K) -> Result<V, E> + Send + Sync + 'static,
        E: Send + Sync + 'static,
        P: FnMut(WarmProgress),
    {
        let shared = Arc::new(Shared {
            keys: keys.into_iter().collect(),
            next: AtomicUsize::new(0),
            stop: AtomicBool::new(false),
            state: Mutex::new(Progress::default()),
            changed: Condvar::new(),
        });
        let total = shared.keys.len();
        let permits = self.inner.limiter().map_or(usize::MAX, |l| l.permits());
        let workers = concurrency
            .clamp(1, MAX_WARM_CONCURRENCY)
            .min(permits)
            .min(total);
        let loader = Arc::new(loader);
        // Registers a worker slot and starts its thread; false if no thread could be had.
        let spawn = || {
            let id = {
                let mut st = shared.state.lock();
                st.current.push(None);
                st.abandoned.push(false);
                st.current.len() - 1
            };
            let (cache, shared, loader) = (self.clone(), Arc::clone(&shared), Arc::clone(&loader));
            std::thread::Builder::new()
                .name("herdcache-warm".into())
                .spawn(move || cache.warm_worker(id, &shared, &*loader))
                .is_ok()
        };
        // Whatever way this returns (a panicking `progress` included), workers still running
        // take no further key.
        struct StopOnDrop<'a>(&'a AtomicBool);
        impl Drop for StopOnDrop<'_> {
            fn drop(&mut self) {
                self.0.store(true, Ordering::Relaxed);
            }
        }
        let _stop = StopOnDrop(&shared.stop);
        // Without any thread, this one loads (also when a replacement cannot be started).
        let mut inline = (0..workers).filter(|_| spawn()).count() == 0;
        let mut counted = vec![false; total];
        let mut report = WarmReport::default();
        let mut done = 0;
        // Counts key `i` once (a worker given up on may still report it); returns the keys
        // done so far.
        let mut count = |i: usize, outcome: Outcome| -> usize {
            if std::mem::replace(&mut counted[i], true) {
                return done;
            }
            match outcome {
                Outcome::Loaded => report.loaded += 1,
                Outcome::Skipped => report.skipped += 1,
                Outcome::Failed => report.failed += 1,
            }
            done += 1;
            progress(WarmProgress {
                done: done as u64,
                total: total as u64,
                report,
            });
            done
        };
        let timeout = self.inner.settings().load_timeout;
        let mut finished_count = 0;
        while finished_count < total {
            if inline {
                let i = shared.next.fetch_add(1, Ordering::Relaxed);
                if let Some(key) = shared.keys.get(i) {
                    let outcome = self.warm_one(key, &*loader, || {});
                    finished_count = count(i, outcome);
                    continue;
                }
            }
            // Under the lock: what finished, and which workers are stuck in a loader past its
            // deadline (given up on: their key fails, and a new worker takes their place).
            let now = Instant::now();
            let (finished, stuck, wake_at) = {
                let mut st = shared.state.lock();
                let mut stuck = Vec::new();
                let mut wake_at: Option<Instant> = None;
                if let Some(t) = timeout {
                    for id in 0..st.current.len() {
                        let Some((i, since)) = st.current[id] else {
                            continue;
                        };
                        match since.checked_add(t) {
                            Some(at) if now < at => {
                                wake_at = Some(wake_at.map_or(at, |w| w.min(at)));
                            }
                            _ => {
                                st.current[id] = None;
                                st.abandoned[id] = true;
                                stuck.push(i);
                            }
                        }
                    }
                }
                (std::mem::take(&mut st.finished), stuck, wake_at)
            };
            // Outside the lock: `progress` is user code.
            for (i, outcome) in finished {
                finished_count = count(i, outcome);
            }
            for i in stuck {
                finished_count = count(i, Outcome::Failed);
                if !spawn() {
                    inline = true;
                }
            }
            let keys_left = shared.next.load(Ordering::Relaxed) < total;
            if finished_count >= total || (inline && keys_left) {
                continue;
            }
            let st = shared.state.lock();
            if !st.finished.is_empty() {
                continue;
            }
            // A worker that finishes notifies under this lock, so none is missed.
            drop(match wake_at {
                None => shared.changed.wait(st),
                Some(at) => shared
                    .changed
                    .wait_timeout(st, at.saturating_duration_since(now)),
            });
        }
        report
    }

    /// One worker of a warm-up: takes keys by index until none is left, or until the
    /// warm-up gave up on it or returned.
    fn warm_worker<E, F>(&self, id: usize, shared: &Shared<K>, loader: &F)
    where
        F: Fn(&K) -> Result<V, E>,
        E: Send + Sync + 'static,
    {
        loop {
            if shared.stop.load(Ordering::Relaxed) {
                return;
            }
            let i = shared.next.fetch_add(1, Ordering::Relaxed);
            let Some(key) = shared.keys.get(i) else {
                return;
            };
            // Only time spent inside the loader counts toward giving up on this worker: a
            // wait for another caller's load or for a permit ends at the load's deadline.
            let outcome = self.warm_one(key, loader, || {
                let mut st = shared.state.lock();
                st.current[id] = Some((i, Instant::now()));
            });
            let mut st = shared.state.lock();
            if st.abandoned[id] {
                return;
            }
            st.current[id] = None;
            st.finished.push((i, outcome));
            drop(st);
            shared.changed.notify_one();
        }
    }

    /// Loads one key unless it has a live value; `started` runs when its loader starts. No
    /// panic escapes (user code: the key's `Hash` and `Eq`, the loader).
    fn warm_one<E, F>(&self, key: &K, loader: &F, started: impl FnOnce()) -> Outcome
    where
        F: Fn(&K) -> Result<V, E>,
        E: Send + Sync + 'static,
    {
        let run = || {
            if self.inner.peek(key, &self.inner.pin()).is_some() {
                return Outcome::Skipped;
            }
            let load = |k: &K| {
                started();
                loader(k)
            };
            match self.get_or_load(key, load) {
                Ok(_) => Outcome::Loaded,
                Err(_) => Outcome::Failed,
            }
        };
        catch_unwind(AssertUnwindSafe(run)).unwrap_or(Outcome::Failed)
    }
}
