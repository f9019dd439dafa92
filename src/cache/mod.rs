//! The public shell: [`Cache`], a handle on the cache's core, the engine
//! (`crate::engine`), and its calls, each written in terms of the engine's operations. Only
//! this module and its files hold the engine: `Cache`'s handle on it is private here.
//!
//! - this file: the handle, reads, writes, invalidation, statistics, settings;
//! - `load.rs`: the loading calls of threads (`get_or_load` and its variants, `get_with`,
//!   `optionally_get_with`, `forget`);
//! - `future.rs`: their async forms, and the futures' waits of the miss-path driver;
//! - `bulk.rs`: `get_or_load_all`; `compute.rs`: `compute`; `warm.rs`: `warm`;
//! - `entries.rs`: the cache as a collection (`iter`, `retain`, `peek`, ...).

pub(crate) mod bulk;
pub(crate) mod compute;
pub(crate) mod entries;
pub(crate) mod future;
pub(crate) mod load;
pub(crate) mod warm;

use std::borrow::Borrow;
use std::fmt;
use std::hash::{BuildHasher, Hash};
use std::sync::Arc;
use std::time::Duration;

use crate::clock::duration_to_nanos;
use crate::engine::Engine;
use crate::local::Pinned;
use crate::removal::RemovalCause;
use crate::stats::Stats;

/// What became of a write's shared-tier half (feature `redis`).
#[cfg(feature = "redis")]
type Sent = crate::fleet::Sent;
#[cfg(not(feature = "redis"))]
type Sent = std::convert::Infallible;
use crate::DefaultHashBuilder;

/// A bounded, lock-free, concurrent cache.
///
/// Cloning is cheap (an `Arc` clone) and every clone is the same cache. See the
/// [crate documentation](crate) for a guide.
///
/// ```
/// let cache: herdcache::Cache<u32, &str> =
///     herdcache::Cache::builder().max_capacity(100).build()?;
/// let handle = cache.clone();
/// std::thread::spawn(move || handle.insert(1, "one")).join().unwrap();
/// assert_eq!(cache.get(&1), Some("one")); // one cache behind both handles
/// # Ok::<(), herdcache::BuildError>(())
/// ```
pub struct Cache<K, V, S = DefaultHashBuilder> {
    inner: Arc<Engine<K, V, S>>,
}

impl<K, V, S> Clone for Cache<K, V, S> {
    fn clone(&self) -> Self {
        Cache {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<K, V, S> fmt::Debug for Cache<K, V, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cache")
            .field("entry_count", &self.inner.len())
            .field("max_capacity", &self.inner.settings().max_capacity)
            .finish_non_exhaustive()
    }
}

impl<K, V, S> Cache<K, V, S>
where
    K: Hash + Eq + Send + Sync + 'static,
    V: Send + Sync + 'static,
    S: BuildHasher,
{
    /// Starts the thread that hears the fleet's writes for this cache (feature `redis`).
    #[cfg(feature = "redis")]
    pub(crate) fn listen_to_fleet(&self)
    where
        S: Send + Sync + 'static,
    {
        self.inner.listen_to_fleet();
    }

    /// The handle on a newly built engine.
    pub(crate) fn from_engine(engine: Engine<K, V, S>) -> Self {
        Cache {
            inner: Arc::new(engine),
        }
    }

    /// The value for `key`, cloned, if the cache holds one that has not expired.
    ///
    /// Takes no lock and, once the entry is hot, writes no shared memory. For values that are
    /// expensive to clone, hold an `Arc<T>` or use [`pin`](Self::pin) to borrow instead. A key
    /// whose load is in progress has no value yet: `get` returns `None` without waiting (use
    /// [`get_or_load`](Self::get_or_load) to join the load).
    ///
    /// ```
    /// let cache = herdcache::Cache::builder().max_capacity(10).build()?;
    /// cache.insert("k".to_string(), 7);
    /// assert_eq!(cache.get("k"), Some(7)); // lookups by `&str` for `String` keys
    /// # Ok::<(), herdcache::BuildError>(())
    /// ```
    #[inline]
    pub fn get<Q>(&self, key: &Q) -> Option<V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
        V: Clone,
    {
        let pinned = self.inner.pin();
        self.inner.lookup(key, &pinned).cloned()
    }

    /// Whether the cache holds an unexpired value for `key` (counts as a lookup).
    ///
    /// ```
    /// let cache = herdcache::Cache::builder().max_capacity(10).build()?;
    /// cache.insert(1, "one");
    /// assert!(cache.contains_key(&1));
    /// assert!(!cache.contains_key(&2));
    /// assert_eq!(cache.stats().requests(), 2);
    /// # Ok::<(), herdcache::BuildError>(())
    /// ```
    pub fn contains_key<Q>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let pinned = self.inner.pin();
        self.inner.lookup(key, &pinned).is_some()
    }

    /// Pins the cache for a series of reads that borrow values instead of cloning them.
    ///
    /// While the guard lives, entries removed from the cache are not freed (on any thread),
    /// so keep it for a batch of reads, not indefinitely. A batch also pays for one epoch
    /// pin (a full fence) instead of one per [`get`](Cache::get): over a table larger than
    /// the CPU's cache, that lets the reads' cache misses overlap (docs/BENCHMARKS.md,
    /// "pin per batch").
    ///
    /// ```
    /// use std::sync::Arc;
    /// let cache = herdcache::Cache::builder().max_capacity(10).build()?;
    /// cache.insert(1, Arc::new(String::from("one")));
    /// let guard = cache.pin();
    /// let v: Option<&Arc<String>> = guard.get(&1); // no refcount bump
    /// assert_eq!(v.map(|s| s.as_str()), Some("one"));
    /// # Ok::<(), herdcache::BuildError>(())
    /// ```
    pub fn pin(&self) -> CacheGuard<'_, K, V, S> {
        CacheGuard {
            cache: self,
            pinned: self.inner.pin(),
        }
    }

    /// Inserts `value` for `key`, replacing any previous value, with the cache's
    /// `time_to_live` (if one is set). May evict other entries to stay within capacity.
    ///
    /// Read-your-write: the entry written is never the one evicted to make room for it, so
    /// the next read (from any thread) finds it until later writes push it out, an
    /// invalidation removes it, or it expires. The one exception is an entry heavier than the
    /// whole capacity, which leaves at once with [`RemovalCause::Oversized`].
    ///
    /// An insert wins over a load of the same key in progress: the load's result still goes to
    /// its waiters but is not cached.
    ///
    /// With a shared tier (`CacheBuilder::shared_tier`, feature `redis`), the value is written
    /// there first (one Redis round trip), and every other instance drops its copy.
    ///
    /// ```
    /// let cache = herdcache::Cache::builder().max_capacity(10).build()?;
    /// cache.insert("k", 1);
    /// cache.insert("k", 2); // replaces
    /// assert_eq!(cache.get("k"), Some(2));
    /// assert_eq!(cache.entry_count(), 1);
    /// # Ok::<(), herdcache::BuildError>(())
    /// ```
    pub fn insert(&self, key: K, value: V) {
        let ttl = self.inner.ttl_of(&key, &value);
        self.insert_for(key, value, ttl);
    }

    /// [`insert`](Self::insert), saying whether the write reached the shared tier (feature
    /// `redis`; always `Ok` without a tier). The local half is done either way.
    ///
    /// # Errors
    ///
    /// [`SharedWriteError`](crate::fleet::SharedWriteError) if Redis could not be reached (or
    /// writes wait there already): the write was queued, and other instances and Redis learn
    /// of it as an invalidation of the key when it is replayed, once Redis answers.
    ///
    /// ```
    /// let cache: herdcache::Cache<u32, u32> = herdcache::Cache::builder().max_capacity(10).build()?;
    /// assert_eq!(cache.try_insert(1, 10), Ok(())); // no tier: nothing to reach
    /// # Ok::<(), herdcache::BuildError>(())
    /// ```
    #[cfg(feature = "redis")]
    #[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
    pub fn try_insert(&self, key: K, value: V) -> Result<(), crate::fleet::SharedWriteError> {
        let ttl = self.inner.ttl_of(&key, &value);
        crate::fleet::SharedWriteError::of(self.insert_for(key, value, ttl))
    }

    /// Inserts `value` for `key` with its own time to live, overriding the cache's.
    ///
    /// A zero `ttl` stores an entry that is already expired (it is never returned); a `ttl`
    /// past the clock's range (about 584 years of nanoseconds from the clock's origin) lasts
    /// until the clock's end. No finite `ttl` means "never expires".
    ///
    /// ```
    /// use std::time::Duration;
    /// let clock = herdcache::ManualClock::new();
    /// let cache = herdcache::Cache::builder()
    ///     .max_capacity(10)
    ///     .time_to_live(Duration::from_secs(60))
    ///     .clock(clock.clone())
    ///     .build()?;
    /// cache.insert_with_ttl("short", 1, Duration::from_secs(5));
    /// cache.insert("long", 2); // the cache's 60 s
    /// clock.advance(Duration::from_secs(5));
    /// assert_eq!(cache.get("short"), None);
    /// assert_eq!(cache.get("long"), Some(2));
    /// # Ok::<(), herdcache::BuildError>(())
    /// ```
    pub fn insert_with_ttl(&self, key: K, value: V, ttl: Duration) {
        self.insert_for(key, value, Some(duration_to_nanos(ttl)));
    }

    /// An insert that lives `ttl` nanoseconds (`None`: forever); with a shared tier, written
    /// there first: what became of that write (`None` without a tier).
    fn insert_for(&self, key: K, value: V, ttl: Option<u64>) -> Option<Sent> {
        #[cfg(feature = "redis")]
        let written = self
            .inner
            .write_through(&key, Some(&key), Some((&value, ttl)));
        #[cfg(feature = "redis")]
        let ttl = match written.as_ref().and_then(|w| w.cap) {
            Some(cap) => Some(ttl.map_or(cap, |t| t.min(cap))),
            None => ttl,
        };
        let pinned = self.inner.pin();
        self.inner.insert(key, value, ttl, &pinned);
        #[cfg(feature = "redis")]
        {
            let sent = written.as_ref().map(|w| w.sent);
            if let Some(w) = written {
                self.inner.recheck_write(w);
            }
            sent
        }
        #[cfg(not(feature = "redis"))]
        None
    }

    /// The shared tier as this instance sees it now (feature `redis`), or `None` without one:
    /// whether it hears the other instances' writes, and whether Redis answers.
    ///
    /// ```no_run
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use herdcache::fleet::{RedisTier, Utf8};
    /// let tier = RedisTier::builder("redis://127.0.0.1/")
    ///     .key_prefix("users:")
    ///     .build(|k: &String| k.clone(), Utf8)?;
    /// let cache: herdcache::Cache<String, String> =
    ///     herdcache::Cache::builder().max_capacity(1_000).shared_tier(tier).build()?;
    /// // A readiness probe: serve once this instance hears the fleet's writes.
    /// let ready = cache.shared_status().is_none_or(|s| s.subscribed);
    /// # let _ = ready;
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(feature = "redis")]
    #[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
    pub fn shared_status(&self) -> Option<crate::fleet::TierStatus> {
        self.inner.shared().map(|t| t.status())
    }

    /// Removes `key`'s entry. Returns whether it held a value that [`get`](Self::get) would
    /// have returned (an expired entry is removed too, but returns false).
    ///
    /// A load of the key in progress is detached: its result still goes to its waiters but
    /// is not cached. ([`forget`](Self::forget) instead wakes the waiters to load afresh.)
    ///
    /// With a shared tier (`CacheBuilder::shared_tier`, feature `redis`), the key is
    /// invalidated there too, and every instance drops its copy (see "Coherence" under
    /// `fleet::RedisTier`).
    ///
    /// ```
    /// let cache = herdcache::Cache::builder().max_capacity(10).build()?;
    /// cache.insert(1, "one");
    /// assert!(cache.invalidate(&1));
    /// assert!(!cache.invalidate(&1)); // nothing left to remove
    /// assert_eq!(cache.get(&1), None);
    /// # Ok::<(), herdcache::BuildError>(())
    /// ```
    pub fn invalidate<Q>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.invalidate_with(key, |_| ())
            .0
            .is_some_and(|live| live.is_some())
    }

    /// [`invalidate`](Self::invalidate), saying whether the write reached the shared tier
    /// (feature `redis`; always `Ok` without a tier): `Ok` with `invalidate`'s answer, or an
    /// error if the invalidation was deferred. The local copy is removed either way.
    ///
    /// # Errors
    ///
    /// [`SharedWriteError`](crate::fleet::SharedWriteError), as for
    /// [`try_insert`](Self::try_insert).
    ///
    /// ```
    /// let cache: herdcache::Cache<u32, u32> = herdcache::Cache::builder().max_capacity(10).build()?;
    /// cache.insert(1, 10);
    /// assert_eq!(cache.try_invalidate(&1), Ok(true));
    /// # Ok::<(), herdcache::BuildError>(())
    /// ```
    #[cfg(feature = "redis")]
    #[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
    pub fn try_invalidate<Q>(&self, key: &Q) -> Result<bool, crate::fleet::SharedWriteError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let (live, sent) = self.invalidate_with(key, |_| ());
        crate::fleet::SharedWriteError::of(sent)?;
        Ok(live.is_some_and(|live| live.is_some()))
    }

    /// Removes `key`'s entry (invalidating it in the shared tier first): `None` if there was
    /// none, else what `read` makes of its live value, if it had one. `read` runs after the
    /// removal's bookkeeping, so a panic in it (a user `Clone`) loses only its result.
    /// ... and what became of the shared tier's half (`None` without a tier).
    pub(crate) fn invalidate_with<Q, R>(
        &self,
        key: &Q,
        read: impl FnOnce(&V) -> R,
    ) -> (Option<Option<R>>, Option<Sent>)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        // In progress until the local removal is done (other own writes of the key look).
        #[cfg(feature = "redis")]
        let written = self.inner.write_through(key, None, None);
        #[cfg(feature = "redis")]
        let sent = written.as_ref().map(|w| w.sent);
        #[cfg(not(feature = "redis"))]
        let sent = None;
        let pinned = self.inner.pin();
        let hash = self.inner.hash(key);
        let Some(live) = self
            .inner
            .remove(hash, key, RemovalCause::Invalidated, &pinned)
        else {
            return (None, sent);
        };
        // The guard keeps the removed node alive.
        (Some(live.map(read)), sent)
    }

    /// Removes every entry (detaching loads in progress). Entries inserted while this runs may
    /// or may not survive it. With a shared tier (`CacheBuilder::shared_tier`), every
    /// value in the tier (under its prefix) is invalidated too, and every instance clears its
    /// copies.
    ///
    /// ```
    /// let cache = herdcache::Cache::builder().max_capacity(100).build()?;
    /// for k in 0..10 {
    ///     cache.insert(k, k * 10);
    /// }
    /// cache.invalidate_all();
    /// assert_eq!(cache.entry_count(), 0);
    /// assert_eq!(cache.get(&3), None);
    /// # Ok::<(), herdcache::BuildError>(())
    /// ```
    pub fn invalidate_all(&self) {
        #[cfg(feature = "redis")]
        self.inner.invalidate_all_through();
        self.inner.clear();
    }

    /// [`invalidate_all`](Self::invalidate_all), saying whether the write reached the shared
    /// tier (feature `redis`; always `Ok` without a tier). The local copies are removed
    /// either way.
    ///
    /// # Errors
    ///
    /// [`SharedWriteError`](crate::fleet::SharedWriteError), as for
    /// [`try_insert`](Self::try_insert).
    ///
    /// ```
    /// let cache: herdcache::Cache<u32, u32> = herdcache::Cache::builder().max_capacity(10).build()?;
    /// assert_eq!(cache.try_invalidate_all(), Ok(()));
    /// # Ok::<(), herdcache::BuildError>(())
    /// ```
    #[cfg(feature = "redis")]
    #[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
    pub fn try_invalidate_all(&self) -> Result<(), crate::fleet::SharedWriteError> {
        let sent = self.inner.invalidate_all_through();
        self.inner.clear();
        crate::fleet::SharedWriteError::of(sent)
    }

    /// Entries held, including expired ones not yet removed and keys whose load is in
    /// progress (exact when no write is in progress).
    ///
    /// ```
    /// let cache = herdcache::Cache::builder().max_capacity(10).build()?;
    /// cache.insert(1, "a");
    /// cache.insert(2, "b");
    /// cache.insert(1, "c"); // a replacement, not a new entry
    /// assert_eq!(cache.entry_count(), 2);
    /// # Ok::<(), herdcache::BuildError>(())
    /// ```
    pub fn entry_count(&self) -> u64 {
        self.inner.len() as u64
    }

    /// The capacity: the one the cache was built with, or the last
    /// [`set_capacity`](Self::set_capacity).
    ///
    /// ```
    /// let cache: herdcache::Cache<u32, u32> =
    ///     herdcache::Cache::builder().max_capacity(500).build()?;
    /// assert_eq!(cache.max_capacity(), 500);
    /// # Ok::<(), herdcache::BuildError>(())
    /// ```
    pub fn max_capacity(&self) -> u64 {
        self.inner.capacity()
    }

    /// Changes the capacity (entries, or total weight with a weigher) while the cache runs
    /// (quick_cache's `set_capacity`). Shrinking evicts at once what no longer fits, told to
    /// the [`eviction_listener`](crate::CacheBuilder::eviction_listener) as
    /// [`Size`](crate::RemovalCause::Size); the eviction policy keeps its window's share of
    /// the capacity and learns its best size afresh. The frequency sketch keeps the size the
    /// first capacity gave it.
    ///
    /// # Errors
    ///
    /// [`BuildError::Invalid`](crate::BuildError::Invalid) (setting `max_capacity`) for a
    /// capacity of 0, above [`MAX_CAPACITY_LIMIT`](crate::MAX_CAPACITY_LIMIT), or smaller than
    /// the number of shards a large cache's eviction policy was split into when built (each
    /// needs a share); the capacity is then unchanged.
    ///
    /// ```
    /// let cache: herdcache::Cache<u32, u32> = herdcache::Cache::builder().max_capacity(100).build()?;
    /// for k in 0..100 {
    ///     cache.insert(k, k);
    /// }
    /// cache.set_capacity(10)?;
    /// assert_eq!(cache.max_capacity(), 10);
    /// assert!(cache.entry_count() <= 10);
    /// # Ok::<(), herdcache::BuildError>(())
    /// ```
    pub fn set_capacity(&self, capacity: u64) -> Result<(), crate::BuildError> {
        let invalid = |reason| crate::BuildError::Invalid {
            setting: "max_capacity",
            reason,
        };
        if capacity == 0 {
            return Err(invalid("must be at least 1"));
        }
        if capacity > crate::MAX_CAPACITY_LIMIT {
            return Err(invalid("must be at most 2^48"));
        }
        if capacity < self.inner.policy_shards() as u64 {
            return Err(invalid(
                "must be at least the number of shards the eviction policy was built with",
            ));
        }
        self.inner.set_capacity(capacity);
        Ok(())
    }

    /// The settings the cache was built with, its capacity as it is now (moka's `policy()`).
    ///
    /// ```
    /// use std::time::Duration;
    /// let cache: herdcache::Cache<u32, u32> = herdcache::Cache::builder()
    ///     .max_capacity(500)
    ///     .time_to_live(Duration::from_secs(60))
    ///     .build()?;
    /// let p = cache.policy();
    /// assert_eq!((p.max_capacity, p.time_to_live), (500, Some(Duration::from_secs(60))));
    /// assert_eq!(p.time_to_idle, None);
    /// # Ok::<(), herdcache::BuildError>(())
    /// ```
    pub fn policy(&self) -> CachePolicy {
        let s = self.inner.settings();
        let nanos = Duration::from_nanos;
        CachePolicy {
            max_capacity: self.max_capacity(),
            weighted: s.weighted,
            time_to_live: s.time_to_live.map(nanos),
            time_to_idle: s.time_to_idle_set,
            refresh_after: s.refresh.soft_ttl.map(nanos),
            xfetch_beta: s.refresh.beta,
            stale_if_error: s.refresh.stale_if_error,
            negative_ttl: s.negative_ttl.map(nanos),
            max_stale: nanos(s.max_stale),
            max_concurrent_loads: s.max_concurrent_loads,
            load_timeout: s.load_timeout,
        }
    }

    /// A snapshot of the counters (summed over threads; see [`Stats`]).
    ///
    /// ```
    /// let cache = herdcache::Cache::builder().max_capacity(10).build()?;
    /// cache.insert(1, 10);
    /// let _ = (cache.get(&1), cache.get(&2));
    /// let stats = cache.stats();
    /// assert_eq!((stats.hits, stats.misses, stats.inserts), (1, 1, 1));
    /// # Ok::<(), herdcache::BuildError>(())
    /// ```
    pub fn stats(&self) -> Stats {
        self.inner.counters().snapshot()
    }

    /// Removes every expired value and cached error now, telling the listener of each
    /// ([`RemovalCause::Expired`]); returns how many were removed.
    ///
    /// Writes already sweep the cache a few slots at a time (without a weigher, every entry
    /// is looked at within `max_capacity` writes), keeping a value for
    /// [`max_stale`](crate::CacheBuilder::max_stale) past its expiry as a fallback for a
    /// load that does not finish. This call removes those too: use it when the cache is not
    /// being written and expired values should be freed, for example from a periodic task.
    ///
    /// ```
    /// use std::time::Duration;
    /// let clock = herdcache::ManualClock::new();
    /// let cache = herdcache::Cache::builder()
    ///     .max_capacity(100)
    ///     .time_to_live(Duration::from_secs(10))
    ///     .clock(clock.clone())
    ///     .build()?;
    /// cache.insert(1, "one");
    /// clock.advance(Duration::from_secs(11));
    /// assert_eq!(cache.purge_expired(), 1);
    /// assert_eq!(cache.entry_count(), 0);
    /// # Ok::<(), herdcache::BuildError>(())
    /// ```
    pub fn purge_expired(&self) -> u64 {
        self.inner.purge_expired()
    }
}

/// The settings a cache was built with, from [`Cache::policy`].
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct CachePolicy {
    /// The capacity now: entries, or total weight with a weigher.
    pub max_capacity: u64,
    /// Whether a weigher is set, so that `max_capacity` is a total weight.
    pub weighted: bool,
    /// The cache-wide time to live.
    pub time_to_live: Option<Duration>,
    /// The time to idle.
    pub time_to_idle: Option<Duration>,
    /// The soft TTL of stale-while-revalidate.
    pub refresh_after: Option<Duration>,
    /// XFetch's beta.
    pub xfetch_beta: Option<f64>,
    /// Whether a failed refresh keeps the current value.
    pub stale_if_error: bool,
    /// How long a load error is cached.
    pub negative_ttl: Option<Duration>,
    /// How long past its expiry a value may stand in for a load that does not finish.
    pub max_stale: Duration,
    /// The most loads at once.
    pub max_concurrent_loads: Option<usize>,
    /// Each load's deadline.
    pub load_timeout: Option<Duration>,
}

/// A pinned view of a [`Cache`] for reads that borrow values, from [`Cache::pin`].
///
/// It cannot be sent to another thread; while it lives, no entry removed from the cache is
/// freed.
///
/// ```
/// let cache = herdcache::Cache::builder().max_capacity(100).build()?;
/// cache.insert("greeting", String::from("hello"));
/// let guard = cache.pin();
/// let v: &String = guard.get("greeting").unwrap(); // borrowed, not cloned
/// assert_eq!(v, "hello");
/// assert!(!guard.contains_key("farewell"));
/// drop(guard); // removed values can be freed again
/// # Ok::<(), herdcache::BuildError>(())
/// ```
pub struct CacheGuard<'a, K, V, S = DefaultHashBuilder> {
    pub(crate) cache: &'a Cache<K, V, S>,
    pub(crate) pinned: Pinned<'a>,
}

impl<K, V, S> fmt::Debug for CacheGuard<'_, K, V, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CacheGuard").finish_non_exhaustive()
    }
}

impl<K, V, S> CacheGuard<'_, K, V, S>
where
    K: Hash + Eq + Send + Sync + 'static,
    V: Send + Sync + 'static,
    S: BuildHasher,
{
    /// The value for `key`, borrowed for as long as the guard lives.
    ///
    /// ```
    /// let cache = herdcache::Cache::builder().max_capacity(10).build()?;
    /// cache.insert(1, vec![1, 2, 3]);
    /// let guard = cache.pin();
    /// assert_eq!(guard.get(&1).map(Vec::len), Some(3));
    /// assert_eq!(guard.get(&2), None);
    /// # Ok::<(), herdcache::BuildError>(())
    /// ```
    #[inline]
    pub fn get<Q>(&self, key: &Q) -> Option<&V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.cache.inner.lookup(key, &self.pinned)
    }

    /// Whether the cache holds an unexpired value for `key`.
    ///
    /// ```
    /// let cache = herdcache::Cache::builder().max_capacity(10).build()?;
    /// cache.insert(1, "one");
    /// let guard = cache.pin();
    /// assert!(guard.contains_key(&1));
    /// assert!(!guard.contains_key(&2));
    /// # Ok::<(), herdcache::BuildError>(())
    /// ```
    pub fn contains_key<Q>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.get(key).is_some()
    }
}

#[cfg(all(test, not(herdcache_loom)))]
mod tests {
    //! Small end-to-end runs of the cache's unsafe paths (per-thread handles, counter blocks,
    //! eviction through the table), sized for Miri.
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use super::Cache;

    struct Tracked(Arc<AtomicUsize>);
    impl Drop for Tracked {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    #[test]
    fn threads_share_one_cache_and_every_value_is_dropped_once() {
        let drops = Arc::new(AtomicUsize::new(0));
        let per_thread = if cfg!(miri) { 40 } else { 2_000 };
        {
            let cache: Cache<u64, Tracked> = Cache::builder().max_capacity(16).build().unwrap();
            let threads: Vec<_> = (0..2u64)
                .map(|t| {
                    let (cache, drops) = (cache.clone(), Arc::clone(&drops));
                    std::thread::spawn(move || {
                        for i in 0..per_thread {
                            cache.insert(t * 1_000 + i % 24, Tracked(Arc::clone(&drops)));
                            let _ = cache.pin().get(&(i % 24)).is_some();
                        }
                    })
                })
                .collect();
            for t in threads {
                t.join().unwrap();
            }
            assert!(cache.entry_count() <= 16);
            assert_eq!(
                cache.stats().inserts + cache.stats().updates,
                2 * per_thread
            );
            cache.invalidate_all();
        }
        assert_eq!(drops.load(Ordering::Relaxed), 2 * per_thread as usize);
    }

    /// A key whose `Hash` covers its salt and whose `Eq` ignores it.
    #[derive(Debug)]
    struct Salted(u64, u64);

    impl std::hash::Hash for Salted {
        fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
            state.write_u64(self.0);
            state.write_u64(self.1);
        }
    }

    impl PartialEq for Salted {
        fn eq(&self, other: &Self) -> bool {
            self.0 == other.0
        }
    }

    impl Eq for Salted {}

    /// A table hasher that keeps the first word written (a `Salted`'s id).
    #[derive(Default)]
    struct FirstWord(Option<u64>);

    impl std::hash::Hasher for FirstWord {
        fn finish(&self) -> u64 {
            self.0.unwrap_or(0).wrapping_mul(0x9E37_79B9_7F4A_7C15)
        }
        fn write(&mut self, _: &[u8]) {
            unreachable!("a `Salted` writes words");
        }
        fn write_u64(&mut self, n: u64) {
            self.0.get_or_insert(n);
        }
    }

    /// Policy keys hashed from the key, as the shared tier's are, can disagree with the table
    /// about which writes are of one key: here the table matches a key's writes by id, and
    /// the policy sees a new key, often in another shard, at each salt. The replaced write
    /// is then reported removed and the new one is a new key, so the cache keeps its bound
    /// and its policy weighs exactly what the table holds. (Without the tier, policy keys
    /// derive from the table hash and cannot disagree with it; tests/user_code.rs covers
    /// that.)
    #[test]
    #[cfg_attr(miri, ignore = "65,536 entries: too slow under Miri")]
    fn policy_keys_that_disagree_with_the_table_keep_the_bound_and_the_policy_whole() {
        // Large enough for several policy shards.
        const CAP: u64 = 1 << 16;
        crate::engine::STORED_PKEYS.with(|s| s.set(true));
        let c: Cache<Salted, u64, _> = Cache::builder()
            .max_capacity(CAP)
            .hasher(std::hash::BuildHasherDefault::<FirstWord>::default())
            .build()
            .unwrap();
        crate::engine::STORED_PKEYS.with(|s| s.set(false));
        assert!(c.inner.policy_shards() > 1, "premise: several shards");
        // The shared tier's invalidations find an entry by its last write's policy key.
        #[cfg(feature = "redis")]
        for id in 0..64 {
            c.insert(Salted(id, 0), id);
            c.insert(Salted(id, 1), id);
            let pkey = c
                .inner
                .pkey_with(|| unreachable!("stored keys"), &Salted(id, 1));
            assert!(c.inner.remove_by_pkey(pkey), "key {id} found by policy key");
            assert_eq!(c.get(&Salted(id, 2)), None);
        }
        for id in 0..2 * CAP {
            c.insert(Salted(id, 0), id);
            c.insert(Salted(id, 1), id);
            assert!(c.entry_count() <= CAP, "{} entries", c.entry_count());
        }
        assert_eq!(
            c.weighted_size(),
            c.entry_count(),
            "the policy weighs exactly the entries the table holds"
        );
        c.invalidate_all();
        assert_eq!((c.entry_count(), c.weighted_size()), (0, 0));
    }
}
