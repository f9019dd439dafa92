//! Cache warming: loading a list of keys with bounded parallelism before serving.

use std::hash::{BuildHasher, Hash};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

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

/// The most loads a warm-up runs at once, whatever `concurrency` asks for: each is a thread,
/// and a warm-up wider than its source can take is the herd the cache exists to prevent.
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
    /// `concurrency` threads at once (at least 1, at most [`MAX_WARM_CONCURRENCY`], and at
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
        let permits = self
            .inner
            .limiter
            .as_ref()
            .map_or(usize::MAX, |l| l.permits());
        let workers = concurrency
            .clamp(1, MAX_WARM_CONCURRENCY)
            .min(permits)
            .min(total);
        let loader = Arc::new(loader);
        let spawn = |id: usize| {
            let (cache, shared, loader) = (self.clone(), Arc::clone(&shared), Arc::clone(&loader));
            std::thread::Builder::new()
                .name("herdcache-warm".into())
                .spawn(move || cache.warm_worker(id, &shared, &*loader))
                .is_ok()
        };
        {
            let mut st = shared.state.lock().unwrap_or_else(|e| e.into_inner());
            st.current = vec![None; workers];
            st.abandoned = vec![false; workers];
        }
        let started = (0..workers).filter(|&id| spawn(id)).count();
        let mut counted = vec![false; total];
        let mut report = WarmReport::default();
        let mut done = 0;
        let mut count = |outcome: Outcome, report: &mut WarmReport, done: &mut usize| {
            match outcome {
                Outcome::Loaded => report.loaded += 1,
                Outcome::Skipped => report.skipped += 1,
                Outcome::Failed => report.failed += 1,
            }
            *done += 1;
            progress(WarmProgress {
                done: *done as u64,
                total: total as u64,
                report: *report,
            });
        };
        if started == 0 {
            // No thread could be started: load on this one.
            while done < total {
                let outcome = self.warm_one(&shared.keys[done], &*loader);
                count(outcome, &mut report, &mut done);
            }
            return report;
        }
        let timeout = self.inner.load_timeout;
        let mut st = shared.state.lock().unwrap_or_else(|e| e.into_inner());
        while done < total {
            for (i, outcome) in std::mem::take(&mut st.finished) {
                if !std::mem::replace(&mut counted[i], true) {
                    count(outcome, &mut report, &mut done);
                }
            }
            if done == total {
                break;
            }
            let now = Instant::now();
            let mut wake_at = None;
            if let Some(t) = timeout {
                for id in 0..st.current.len() {
                    let Some((i, since)) = st.current[id] else {
                        continue;
                    };
                    let at = since.checked_add(t).unwrap_or(now);
                    if now < at {
                        wake_at = Some(wake_at.map_or(at, |w: Instant| w.min(at)));
                        continue;
                    }
                    // Stuck in a loader past its deadline: count the key as failed and put
                    // a new worker in this one's place.
                    st.current[id] = None;
                    st.abandoned[id] = true;
                    if !std::mem::replace(&mut counted[i], true) {
                        count(Outcome::Failed, &mut report, &mut done);
                    }
                    let replacement = st.current.len();
                    st.current.push(None);
                    st.abandoned.push(false);
                    drop(st);
                    spawn(replacement);
                    st = shared.state.lock().unwrap_or_else(|e| e.into_inner());
                }
            }
            if done == total {
                break;
            }
            st = match wake_at {
                None => shared.changed.wait(st).unwrap_or_else(|e| e.into_inner()),
                Some(at) => {
                    shared
                        .changed
                        .wait_timeout(st, at.saturating_duration_since(now))
                        .unwrap_or_else(|e| e.into_inner())
                        .0
                }
            };
        }
        shared.stop.store(true, Ordering::Relaxed);
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
            {
                let mut st = shared.state.lock().unwrap_or_else(|e| e.into_inner());
                st.current[id] = Some((i, Instant::now()));
            }
            let outcome = self.warm_one(key, loader);
            let mut st = shared.state.lock().unwrap_or_else(|e| e.into_inner());
            if st.abandoned[id] {
                return;
            }
            st.current[id] = None;
            st.finished.push((i, outcome));
            drop(st);
            shared.changed.notify_one();
        }
    }

    fn warm_one<E, F>(&self, key: &K, loader: &F) -> Outcome
    where
        F: Fn(&K) -> Result<V, E>,
        E: Send + Sync + 'static,
    {
        if self.peek_live(key) {
            return Outcome::Skipped;
        }
        match catch_unwind(AssertUnwindSafe(|| self.get_or_load(key, loader))) {
            Ok(Ok(_)) => Outcome::Loaded,
            Ok(Err(_)) | Err(_) => Outcome::Failed,
        }
    }
}
