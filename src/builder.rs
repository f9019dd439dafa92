//! [`CacheBuilder`]: settings, and their validation into a [`Cache`].

use std::fmt;
use std::hash::{BuildHasher, Hash};
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use crate::cache::Cache;
use crate::clock::{Clock, SystemClock, TimeSource};
use crate::engine::Engine;
use crate::error::BuildError;
use crate::settings::Settings;
use crate::DefaultHashBuilder;

/// Largest accepted `max_capacity`: far beyond any memory, small enough that table sizing
/// arithmetic cannot overflow.
///
/// ```
/// use herdcache::{Cache, MAX_CAPACITY_LIMIT};
/// let err = Cache::<u64, u64>::builder()
///     .max_capacity(MAX_CAPACITY_LIMIT + 1)
///     .build()
///     .unwrap_err();
/// assert_eq!(err.setting(), "max_capacity");
/// ```
pub const MAX_CAPACITY_LIMIT: u64 = 1 << 48;

/// Largest accepted `initial_capacity`: the table is allocated for it at `build`, so a larger
/// request is more likely a mistake than a plan (the table grows past it as entries come).
///
/// ```
/// use herdcache::{Cache, MAX_CAPACITY_LIMIT, MAX_INITIAL_CAPACITY};
/// let err = Cache::<u64, u64>::builder()
///     .max_capacity(MAX_CAPACITY_LIMIT)
///     .initial_capacity(MAX_INITIAL_CAPACITY + 1)
///     .build()
///     .unwrap_err();
/// assert_eq!(err.setting(), "initial_capacity");
/// ```
pub const MAX_INITIAL_CAPACITY: usize = 1 << 28;

/// Longest accepted duration setting. A longer TTL is almost certainly a unit mistake; to
/// keep entries forever, set no TTL.
///
/// ```
/// use std::time::Duration;
/// use herdcache::{Cache, MAX_DURATION};
/// let forever: Cache<u64, u64> = Cache::builder()
///     .max_capacity(10)
///     .time_to_live(MAX_DURATION)
///     .build()?;
/// let err = Cache::<u64, u64>::builder()
///     .max_capacity(10)
///     .time_to_live(MAX_DURATION + Duration::from_secs(1))
///     .build()
///     .unwrap_err();
/// assert_eq!(err.setting(), "time_to_live");
/// # let _ = forever;
/// # Ok::<(), herdcache::BuildError>(())
/// ```
pub const MAX_DURATION: Duration = Duration::from_secs(100 * 365 * 24 * 60 * 60);

/// Starts a cache's shared-tier subscriber.
#[cfg(feature = "redis")]
type StartListener<K, V, S> = fn(&Cache<K, V, S>);

/// Builds a [`Cache`]; every setting is checked by [`build`](Self::build), so a bad one
/// is an error there, never a panic later.
///
/// ```
/// use std::time::Duration;
/// use herdcache::Cache;
///
/// let cache: Cache<u64, String> = Cache::builder()
///     .max_capacity(10_000)
///     .time_to_live(Duration::from_secs(30))
///     .build()?;
/// # Ok::<(), herdcache::BuildError>(())
/// ```
pub struct CacheBuilder<K, V, S = DefaultHashBuilder> {
    pub(crate) max_capacity: Option<u64>,
    pub(crate) initial_capacity: Option<usize>,
    pub(crate) time_to_live: Option<Duration>,
    pub(crate) time_to_idle: Option<Duration>,
    pub(crate) negative_ttl: Option<Duration>,
    pub(crate) refresh_after: Option<Duration>,
    pub(crate) xfetch_beta: Option<f64>,
    pub(crate) stale_if_error: bool,
    pub(crate) max_concurrent_loads: Option<usize>,
    pub(crate) load_timeout: Option<Duration>,
    pub(crate) max_stale: Option<Duration>,
    pub(crate) spawner: Option<crate::spawn::SharedSpawner>,
    pub(crate) clock: Option<Arc<dyn Clock>>,
    #[cfg(feature = "redis")]
    pub(crate) shared: Option<crate::fleet::RedisTier<K, V>>,
    /// Starts the tier's subscriber once the cache exists (set by `shared_tier`, where the
    /// bounds it needs are known).
    #[cfg(feature = "redis")]
    listen: Option<StartListener<K, V, S>>,
    pub(crate) hooks: crate::removal::Hooks<K, V>,
    pub(crate) hasher: S,
    _marker: PhantomData<fn(K, V)>,
}

impl<K, V, S> fmt::Debug for CacheBuilder<K, V, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CacheBuilder")
            .field("max_capacity", &self.max_capacity)
            .field("initial_capacity", &self.initial_capacity)
            .field("time_to_live", &self.time_to_live)
            .field("time_to_idle", &self.time_to_idle)
            .field("negative_ttl", &self.negative_ttl)
            .field("refresh_after", &self.refresh_after)
            .field("xfetch_beta", &self.xfetch_beta)
            .field("stale_if_error", &self.stale_if_error)
            .field("max_concurrent_loads", &self.max_concurrent_loads)
            .field("load_timeout", &self.load_timeout)
            .field("max_stale", &self.max_stale)
            .field("spawner", &self.spawner.is_some())
            .field("clock", &self.clock)
            .field("hooks", &self.hooks)
            .finish_non_exhaustive()
    }
}

impl<K, V> Default for CacheBuilder<K, V, DefaultHashBuilder> {
    fn default() -> Self {
        Self::new()
    }
}

impl<K, V> CacheBuilder<K, V, DefaultHashBuilder> {
    /// A builder with no settings; `max_capacity` must be given before `build`.
    /// ([`Cache::builder`] is the same.)
    ///
    /// ```
    /// use herdcache::{Cache, CacheBuilder};
    /// let missing = CacheBuilder::<u32, u32>::new().build();
    /// assert_eq!(missing.unwrap_err().setting(), "max_capacity");
    /// let cache: Cache<u32, u32> = CacheBuilder::new().max_capacity(10).build()?;
    /// assert_eq!(cache.max_capacity(), 10);
    /// # Ok::<(), herdcache::BuildError>(())
    /// ```
    pub fn new() -> Self {
        CacheBuilder {
            max_capacity: None,
            initial_capacity: None,
            time_to_live: None,
            time_to_idle: None,
            negative_ttl: None,
            refresh_after: None,
            xfetch_beta: None,
            stale_if_error: false,
            max_concurrent_loads: None,
            load_timeout: None,
            max_stale: None,
            spawner: None,
            clock: None,
            #[cfg(feature = "redis")]
            shared: None,
            #[cfg(feature = "redis")]
            listen: None,
            hooks: crate::removal::Hooks::default(),
            hasher: DefaultHashBuilder::default(),
            _marker: PhantomData,
        }
    }
}

impl<K, V, S> CacheBuilder<K, V, S> {
    /// The most entries the cache holds, or with a [`weigher`](Self::weigher) the most total
    /// weight (required; 1 to [`MAX_CAPACITY_LIMIT`]).
    ///
    /// Concurrent inserts may exceed it briefly: each inserting thread adds its entry and
    /// then evicts, so the count stays within `max_capacity` plus the number of threads
    /// inserting at that moment, and returns to at most `max_capacity` once they return.
    ///
    /// A cache of at least 32,768 entries without a weigher splits its eviction policy into
    /// shards by key (so that writers of different keys do not wait for one lock), each
    /// bounding its share of `max_capacity`. Keys spread evenly, but not exactly: such a
    /// cache may evict a few entries before it holds `max_capacity` in all (0.01% at a
    /// million entries), never more than `max_capacity`.
    ///
    /// ```
    /// let cache = herdcache::Cache::builder().max_capacity(2).build()?;
    /// cache.insert(1, "a");
    /// cache.insert(2, "b");
    /// cache.insert(3, "c");
    /// assert!(cache.entry_count() <= 2);
    /// # Ok::<(), herdcache::BuildError>(())
    /// ```
    pub fn max_capacity(mut self, entries: u64) -> Self {
        self.max_capacity = Some(entries);
        self
    }

    /// Entries to size the table for up front, avoiding early resizes (optional; at most
    /// [`MAX_INITIAL_CAPACITY`]). The table grows on demand either way, and never needs room
    /// for more entries than `max_capacity`: a larger value (moka takes one) counts as
    /// `max_capacity`. If the table for it cannot be allocated, `build` returns a
    /// [`BuildError`] naming this setting (it does not abort).
    ///
    /// ```
    /// let cache: herdcache::Cache<u64, u64> = herdcache::Cache::builder()
    ///     .max_capacity(100_000)
    ///     .initial_capacity(10_000) // expected soon after start: no resizes on the way
    ///     .build()?;
    /// assert_eq!(cache.entry_count(), 0);
    /// let err = herdcache::Cache::<u64, u64>::builder()
    ///     .max_capacity(10)
    ///     .initial_capacity(herdcache::MAX_INITIAL_CAPACITY + 1)
    ///     .build()
    ///     .unwrap_err();
    /// assert_eq!(err.setting(), "initial_capacity");
    /// # Ok::<(), herdcache::BuildError>(())
    /// ```
    pub fn initial_capacity(mut self, entries: usize) -> Self {
        self.initial_capacity = Some(entries);
        self
    }

    /// Hard time to live: an entry is never returned once this long has passed since it was
    /// inserted (optional; from 1 ns to [`MAX_DURATION`]). `insert_with_ttl` overrides it per
    /// entry.
    ///
    /// ```
    /// use std::time::Duration;
    /// let clock = herdcache::ManualClock::new();
    /// let cache = herdcache::Cache::builder()
    ///     .max_capacity(100)
    ///     .time_to_live(Duration::from_secs(30))
    ///     .clock(clock.clone())
    ///     .build()?;
    /// cache.insert("k", 1);
    /// clock.advance(Duration::from_secs(29));
    /// assert_eq!(cache.get("k"), Some(1)); // read or not, it lives 30 s
    /// clock.advance(Duration::from_secs(1));
    /// assert_eq!(cache.get("k"), None);
    /// # Ok::<(), herdcache::BuildError>(())
    /// ```
    pub fn time_to_live(mut self, ttl: Duration) -> Self {
        self.time_to_live = Some(ttl);
        self
    }

    /// Time to idle: a value not read for this long expires, whatever its time to live
    /// (optional; from 1 ns to a year). A read (`get`, a hit of a loading call, `pin().get`)
    /// renews it; `peek` and iteration do not. Deadlines are kept in units of about 16.8 ms,
    /// rounded up, so a value expires at most two units (about 34 ms) after the idle time,
    /// never before.
    ///
    /// Hits stay free of shared writes: an entry's deadline moves at most once per unit
    /// (test before set), so a hot entry's line is written about 60 times a second at most.
    /// Each hit reads the clock. Expired values leave as expired values do: when read, when
    /// a write's sweep comes to them, or by [`purge_expired`](Cache::purge_expired).
    ///
    /// ```
    /// use std::time::Duration;
    /// let clock = herdcache::ManualClock::new();
    /// let cache = herdcache::Cache::builder()
    ///     .max_capacity(100)
    ///     .time_to_idle(Duration::from_secs(60))
    ///     .clock(clock.clone())
    ///     .build()?;
    /// cache.insert("read", 1);
    /// cache.insert("unread", 2);
    /// for _ in 0..3 {
    ///     clock.advance(Duration::from_secs(40));
    ///     assert_eq!(cache.get("read"), Some(1)); // each read renews it
    /// }
    /// assert_eq!(cache.get("unread"), None); // 120 s without a read
    /// # Ok::<(), herdcache::BuildError>(())
    /// ```
    pub fn time_to_idle(mut self, tti: Duration) -> Self {
        self.time_to_idle = Some(tti);
        self
    }

    /// Negative caching: a loader error is cached for `ttl`, and loads of the key within that
    /// time return the cached error without calling the loader (optional; from 1 ns to
    /// [`MAX_DURATION`]). Off by default: errors go to the load's waiters and are not kept.
    ///
    /// ```
    /// use std::{cell::Cell, time::Duration};
    /// let clock = herdcache::ManualClock::new();
    /// let cache: herdcache::Cache<u32, u32> = herdcache::Cache::builder()
    ///     .max_capacity(100)
    ///     .negative_ttl(Duration::from_secs(5))
    ///     .clock(clock.clone())
    ///     .build()?;
    /// let calls = Cell::new(0);
    /// let load = |_: &u32| { calls.set(calls.get() + 1); Err::<u32, _>("not found") };
    /// assert!(cache.get_or_load(&1, load).is_err());
    /// assert!(cache.get_or_load(&1, load).is_err()); // the cached error: no call
    /// assert_eq!(calls.get(), 1);
    /// clock.advance(Duration::from_secs(5));
    /// assert!(cache.get_or_load(&1, load).is_err()); // expired: the loader runs again
    /// assert_eq!(calls.get(), 2);
    /// # Ok::<(), herdcache::BuildError>(())
    /// ```
    pub fn negative_ttl(mut self, ttl: Duration) -> Self {
        self.negative_ttl = Some(ttl);
        self
    }

    /// Stale-while-revalidate: once a value is `soft_ttl` old, the next
    /// [`get_or_load`](Cache::get_or_load) of it starts one refresh while every reader keeps
    /// getting the current value until its hard expiry (optional; must be shorter than
    /// `time_to_live` when that is set).
    ///
    /// A key read at least once per soft TTL is loaded once per soft TTL: with a soft TTL of
    /// half the TTL, twice per TTL. (For fewer loads per TTL on hot keys, see
    /// [`xfetch`](Self::xfetch).)
    ///
    /// ```
    /// use std::time::Duration;
    /// let clock = herdcache::ManualClock::new();
    /// let cache: herdcache::Cache<u32, u32> = herdcache::Cache::builder()
    ///     .max_capacity(100)
    ///     .time_to_live(Duration::from_secs(60))
    ///     .refresh_after(Duration::from_secs(10))
    ///     .clock(clock.clone())
    ///     .build()?;
    /// assert_eq!(cache.get_or_load(&1, |_| Ok::<_, ()>(1)), Ok(1));
    /// clock.advance(Duration::from_secs(11));
    /// // Past the soft TTL: this call wins the refresh (others keep reading 1 meanwhile).
    /// assert_eq!(cache.get_or_load(&1, |_| Ok::<_, ()>(2)), Ok(2));
    /// # Ok::<(), herdcache::BuildError>(())
    /// ```
    pub fn refresh_after(mut self, soft_ttl: Duration) -> Self {
        self.refresh_after = Some(soft_ttl);
        self
    }

    /// XFetch probabilistic early refresh: a `get_or_load` hit refreshes the value when
    /// `now - delta * beta * ln(U) >= expiry`, with `delta` the measured load time and `U`
    /// uniform in (0, 1], so a hot key is refreshed shortly before it expires, by one reader.
    /// Off by default; 1.0 is the usual choice. Requires `time_to_live`; `beta` must be
    /// finite, above 0 and at most 1000.
    ///
    /// How early: a read `d` before the expiry refreshes with probability
    /// `exp(-d / (delta * beta))`, so at `R` reads a second the first refresh comes about
    /// `delta * beta * ln(R * delta * beta)` before the expiry: hotter keys, slower loads and
    /// larger betas refresh earlier. It never comes more than `delta + ttl / 5` before the
    /// expiry, nor before 4/5 of a TTL after the previous load of the key started, so however
    /// hot the key, whatever the beta and however far a slow load has raised `delta`, it is
    /// loaded at most about 1.25 times per TTL (for example 20k reads/s, 20 ms loads and a
    /// 250 ms TTL: unbounded, beta 2 would start a refresh about 0.37 s ahead, longer than
    /// the TTL itself).
    ///
    /// ```
    /// use std::time::Duration;
    /// let cache: herdcache::Cache<u64, String> = herdcache::Cache::builder()
    ///     .max_capacity(10_000)
    ///     .time_to_live(Duration::from_secs(60))
    ///     .xfetch(1.0)
    ///     .build()?;
    /// // XFetch refreshes ahead of an expiry: without a time to live it is refused.
    /// let err = herdcache::Cache::<u64, String>::builder()
    ///     .max_capacity(10_000)
    ///     .xfetch(1.0)
    ///     .build()
    ///     .unwrap_err();
    /// assert_eq!(err.setting(), "xfetch");
    /// # let _ = cache;
    /// # Ok::<(), herdcache::BuildError>(())
    /// ```
    pub fn xfetch(mut self, beta: f64) -> Self {
        self.xfetch_beta = Some(beta);
        self
    }

    /// Stale-if-error: when an early refresh fails, keep serving the current value until its
    /// hard expiry, and retry after a backoff that doubles per consecutive failure (100 ms up
    /// to 30 s). Off by default: a failed refresh removes the entry and returns the error to
    /// the caller that ran it.
    ///
    /// ```
    /// use std::time::Duration;
    /// let clock = herdcache::ManualClock::new();
    /// let cache: herdcache::Cache<u32, &str> = herdcache::Cache::builder()
    ///     .max_capacity(100)
    ///     .time_to_live(Duration::from_secs(60))
    ///     .refresh_after(Duration::from_secs(10))
    ///     .stale_if_error(true)
    ///     .clock(clock.clone())
    ///     .build()?;
    /// cache.insert(1, "v1");
    /// clock.advance(Duration::from_secs(11));
    /// // The refresh fails: the current value is kept, and served.
    /// assert_eq!(cache.get_or_load(&1, |_| Err::<&str, _>("source down")), Ok("v1"));
    /// assert_eq!(cache.get(&1), Some("v1"));
    /// # Ok::<(), herdcache::BuildError>(())
    /// ```
    pub fn stale_if_error(mut self, enabled: bool) -> Self {
        self.stale_if_error = enabled;
        self
    }

    /// Admission control: at most `loads` loads (initial loads and refreshes, all keys
    /// together) run at once (optional; at least 1). A caller over the bound serves the stale
    /// value it would replace, if there is one; otherwise it waits for a permit, until its
    /// deadline if it has one and, with a [`load_timeout`](Self::load_timeout), for at most
    /// that long (then [`LoadError::LoadTimedOut`](crate::LoadError::LoadTimedOut)). A due
    /// refresh that finds no permit is skipped (readers keep the current value). Hits never
    /// touch the limiter.
    ///
    /// A loader that itself loads other keys from the same cache holds a permit while waiting
    /// for another: with `loads` such loaders at once, they wait on each other. Give nested
    /// loads a deadline, or a bound above the nesting depth.
    ///
    /// ```
    /// let cache: herdcache::Cache<u64, u64> = herdcache::Cache::builder()
    ///     .max_capacity(10_000)
    ///     .max_concurrent_loads(16) // what the database behind the loader can take
    ///     .build()?;
    /// assert_eq!(cache.get_or_load(&1, |k| Ok::<_, ()>(k + 1)), Ok(2));
    /// let err = herdcache::Cache::<u64, u64>::builder()
    ///     .max_capacity(10_000)
    ///     .max_concurrent_loads(0)
    ///     .build()
    ///     .unwrap_err();
    /// assert_eq!(err.setting(), "max_concurrent_loads");
    /// # Ok::<(), herdcache::BuildError>(())
    /// ```
    pub fn max_concurrent_loads(mut self, loads: usize) -> Self {
        self.max_concurrent_loads = Some(loads);
        self
    }

    /// Each load's own deadline, counted from its start (optional, strongly recommended; from
    /// 1 ns to [`MAX_DURATION`]).
    ///
    /// **Without it (the default), nothing bounds a load.** A loader that hangs (a dead
    /// connection, a lost reply), a leading future that is neither polled nor dropped, or a
    /// [`Spawner`](crate::Spawner) that holds a task without running it blocks its key for
    /// ever: every caller of the key waits on that load (callers with their own deadline,
    /// such as [`get_or_load_timeout`](crate::Cache::get_or_load_timeout), give up at it), and
    /// with [`max_concurrent_loads`](Self::max_concurrent_loads) it holds one of the cache's
    /// permits for ever too. There is no default deadline because no duration suits every
    /// source: a load that legitimately takes minutes would be cut off by any guess.
    ///
    /// At the deadline the load is detached:
    ///
    /// - its waiters get the value it replaces if that expired at most
    ///   [`max_stale`](Self::max_stale) ago (during an early refresh, the still-valid
    ///   value), else [`LoadError::LoadTimedOut`](crate::LoadError::LoadTimedOut);
    /// - its load permit is returned, and the next caller starts a fresh load (a reader
    ///   that meets an early refresh past its deadline detaches it too);
    /// - a caller that waits for a load permit waits at most this long;
    /// - a late result is discarded: it never replaces what was written since;
    /// - it is counted in [`Stats::load_timeouts`](crate::Stats::load_timeouts).
    ///
    /// A loader future (`get_or_load_async`, `get_or_load_spawned`) is dropped, so cancelled,
    /// at its deadline. A thread's loader cannot be stopped: the thread that runs it stays in
    /// it until it returns, but nobody waits for it any more.
    ///
    /// ```
    /// use std::time::Duration;
    /// let cache: herdcache::Cache<u64, String> = herdcache::Cache::builder()
    ///     .max_capacity(10_000)
    ///     .max_concurrent_loads(64)
    ///     .load_timeout(Duration::from_secs(2))
    ///     .build()?;
    /// # Ok::<(), herdcache::BuildError>(())
    /// ```
    pub fn load_timeout(mut self, timeout: Duration) -> Self {
        self.load_timeout = Some(timeout);
        self
    }

    /// How long past its expiry a value may still be served in place of a load that did not
    /// finish for the caller: to a waiter whose own deadline passed
    /// ([`get_or_load_timeout`](Cache::get_or_load_timeout)), to the waiters of a load past
    /// its [`load_timeout`](Self::load_timeout), and to a caller held back by
    /// [`max_concurrent_loads`](Self::max_concurrent_loads) (from 0 to [`MAX_DURATION`];
    /// default 60 seconds). A value expired longer ago is never served: the waiter gets its
    /// timeout error instead, and a held-back caller queues for a permit.
    ///
    /// ```
    /// use std::time::Duration;
    /// let cache: herdcache::Cache<u64, String> = herdcache::Cache::builder()
    ///     .max_capacity(10_000)
    ///     .time_to_live(Duration::from_secs(30))
    ///     .max_stale(Duration::from_secs(300))
    ///     .build()?;
    /// # Ok::<(), herdcache::BuildError>(())
    /// ```
    pub fn max_stale(mut self, bound: Duration) -> Self {
        self.max_stale = Some(bound);
        self
    }

    /// Where the loads that calls hand off run: the loads (and early refreshes) of
    /// [`get_or_load_spawned`](Cache::get_or_load_spawned), as [`LoadTask`](crate::LoadTask)s
    /// that outlive the future that started them, and the early refreshes of
    /// [`get_or_load_background`](Cache::get_or_load_background), as
    /// [`RefreshJob`](crate::RefreshJob)s, so that no reader waits for one. Those two calls
    /// need a spawner: on a cache built without one they return
    /// [`LoadError::NoSpawner`](crate::LoadError::NoSpawner) at once. The other calls never
    /// use it.
    ///
    /// [`ThreadSpawner`](crate::ThreadSpawner) runs each on a thread of its own;
    /// `TokioSpawner` (feature `tokio`) on a tokio runtime; implement
    /// [`Spawner`](crate::Spawner) for any other executor or pool.
    ///
    /// ```
    /// let runtime = tokio::runtime::Runtime::new()?;
    /// let cache: herdcache::Cache<u64, u64> = herdcache::Cache::builder()
    ///     .max_capacity(100)
    ///     .spawner(herdcache::TokioSpawner::new(runtime.handle().clone()))
    ///     .build()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn spawner(mut self, spawner: impl crate::Spawner) -> Self {
        self.spawner = Some(crate::spawn::SharedSpawner(Arc::new(spawner)));
        self
    }

    /// Coordinates loads across instances through a shared Redis tier with soft locks (feature
    /// `redis`): see [`RedisTier`](crate::fleet::RedisTier). Each load this cache leads first
    /// asks the tier, and only one instance of the fleet loads from the source at a time;
    /// `insert`, `invalidate` and `invalidate_all` go through the tier and reach every
    /// instance within the tier's coherence bound. Give the tier after
    /// [`hasher`](Self::hasher), if you set one.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use herdcache::{fleet::{RedisTier, Utf8}, Cache};
    ///
    /// let tier = RedisTier::builder("redis://127.0.0.1:6379/")
    ///     .build(|id: &u64| id.to_string(), Utf8)?;
    /// let cache: Cache<u64, String> = Cache::builder()
    ///     .max_capacity(10_000)
    ///     .time_to_live(Duration::from_secs(60))
    ///     .shared_tier(tier)
    ///     .build()?;
    /// // About one instance of the fleet runs this loader; the others get its value.
    /// let name = cache.get_or_load(&42, |id| Ok::<_, std::io::Error>(format!("user {id}")))?;
    /// # let _ = name;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[cfg(feature = "redis")]
    #[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
    pub fn shared_tier(mut self, tier: crate::fleet::RedisTier<K, V>) -> Self
    where
        K: Hash + Eq + Send + Sync + 'static,
        V: Send + Sync + 'static,
        S: BuildHasher + Send + Sync + 'static,
    {
        self.shared = Some(tier);
        self.listen = Some(|cache| cache.listen_to_fleet());
        self
    }

    /// Weighs entries, so that [`max_capacity`](Self::max_capacity) bounds their total
    /// weight rather than their number: `weigher(key, value)` is called once per write (on
    /// the writing thread, before the entry is stored). A weight of 0 counts as 1, so the
    /// cache never holds more than `max_capacity` entries whatever the weigher says; an entry
    /// heavier than the whole capacity is evicted by its own write, reported as
    /// [`RemovalCause::Oversized`](crate::RemovalCause::Oversized). Cached load errors
    /// weigh 1. A weigher that panics fails the write that called it, which then changes
    /// nothing (except that when it panics putting back a failed refresh's still-valid value,
    /// that entry is removed instead).
    ///
    /// Weights are `u64` (byte sizes of any value fit), and the cache fills to its capacity
    /// exactly: nothing is evicted while the total weight, the new entry's included, is at
    /// most `max_capacity`.
    ///
    /// ```
    /// let cache: herdcache::Cache<u32, String> = herdcache::Cache::builder()
    ///     .max_capacity(1_000) // bytes of string data
    ///     .weigher(|_key, value: &String| value.len() as u64)
    ///     .build()?;
    /// cache.insert(1, "x".repeat(600));
    /// cache.insert(2, "y".repeat(600)); // 1,200 bytes > 1,000: one of them is evicted
    /// assert_eq!(cache.entry_count(), 1);
    /// # Ok::<(), herdcache::BuildError>(())
    /// ```
    pub fn weigher(mut self, weigher: impl Fn(&K, &V) -> u64 + Send + Sync + 'static) -> Self {
        self.hooks.weigher = Some(Arc::new(weigher));
        self
    }

    /// Chooses each value's time to live from the value itself: `expire_after(key, value)`
    /// is called once per insert and per load (on the writing thread, before the entry is
    /// stored); `Some(ttl)` is that value's time to live, `None` leaves it the cache's
    /// [`time_to_live`](Self::time_to_live) (or no expiry). [`insert_with_ttl`](Cache::insert_with_ttl)
    /// still sets its own. Zero stores a value already expired, and a time past the clock's
    /// range lasts until its end, as for `insert_with_ttl`. A function that panics fails the
    /// write that called it, which then changes nothing (a load's waiters get
    /// [`LoadError::Panicked`](crate::LoadError::Panicked)).
    ///
    /// With a shared tier, the tier keeps its own bound on what it stores; this sets how
    /// long each instance keeps its copy.
    ///
    /// ```
    /// use std::time::Duration;
    /// // A token that says when it expires: the cache keeps it no longer.
    /// #[derive(Clone)]
    /// struct Token { valid_for: Duration }
    /// let cache: herdcache::Cache<u32, Token> = herdcache::Cache::builder()
    ///     .max_capacity(1_000)
    ///     .time_to_live(Duration::from_secs(3_600))
    ///     .expire_after(|_key, token: &Token| Some(token.valid_for))
    ///     .build()?;
    /// let token = cache.get_or_load(&7, |_| {
    ///     Ok::<_, std::io::Error>(Token { valid_for: Duration::from_secs(90) })
    /// })?;
    /// # let _ = token;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn expire_after(
        mut self,
        expire_after: impl Fn(&K, &V) -> Option<Duration> + Send + Sync + 'static,
    ) -> Self {
        self.hooks.expire_after = Some(Arc::new(expire_after));
        self
    }

    /// Called once for each value that leaves the cache, with its key and why
    /// ([`RemovalCause`](crate::RemovalCause)): evicted for size, expired, invalidated,
    /// replaced, or heavier than the whole capacity. It runs on the thread that removed the value, after the removal, outside any
    /// lock; a panic in it is caught and dropped. Cached load errors are not reported.
    ///
    /// It may use the cache (insert, load, invalidate). Listeners never nest: what its own
    /// writes remove is reported once it has returned, in order, on the same thread, so it
    /// cannot recurse into itself. Such a chain of listener calls is bounded: past
    /// [`MAX_LISTENER_CHAIN`](crate::MAX_LISTENER_CHAIN) notifications in one chain, the rest
    /// of its removals are not reported (counted in
    /// [`Stats::listener_skipped`](crate::Stats::listener_skipped), and a warning with the
    /// `tracing` feature). Only a listener that writes a new key to its full cache on every
    /// call makes a chain that long, and that chain would never end by itself: each of its
    /// writes evicts again, and the operation that started it, holding its epoch pin, kept
    /// every evicted value in memory meanwhile.
    ///
    /// ```
    /// use std::sync::{Arc, Mutex};
    /// use herdcache::RemovalCause;
    ///
    /// let log = Arc::new(Mutex::new(Vec::new()));
    /// let seen = log.clone();
    /// let cache = herdcache::Cache::builder()
    ///     .max_capacity(100)
    ///     .eviction_listener(move |k: &u32, v: &u32, cause| seen.lock().unwrap().push((*k, *v, cause)))
    ///     .build()?;
    /// cache.insert(1, 10);
    /// cache.insert(1, 11);
    /// cache.invalidate(&1);
    /// assert_eq!(
    ///     *log.lock().unwrap(),
    ///     [(1, 10, RemovalCause::Replaced), (1, 11, RemovalCause::Invalidated)]
    /// );
    /// # Ok::<(), herdcache::BuildError>(())
    /// ```
    pub fn eviction_listener(
        mut self,
        listener: impl Fn(&K, &V, crate::RemovalCause) + Send + Sync + 'static,
    ) -> Self {
        self.hooks.listener = Some(Arc::new(listener));
        self
    }

    /// The clock expiry is measured with (default: [`SystemClock`]). Pass a
    /// [`ManualClock`](crate::ManualClock) to test time-dependent behaviour without sleeping.
    ///
    /// ```
    /// use std::time::Duration;
    /// let clock = herdcache::ManualClock::new();
    /// let cache = herdcache::Cache::builder()
    ///     .max_capacity(10)
    ///     .clock(clock.clone())
    ///     .build()?;
    /// cache.insert_with_ttl("session", 1, Duration::from_secs(5));
    /// clock.advance(Duration::from_secs(5)); // no sleep
    /// assert_eq!(cache.get("session"), None);
    /// # Ok::<(), herdcache::BuildError>(())
    /// ```
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Some(Arc::new(clock));
        self
    }

    /// The hasher for keys (default: foldhash, seeded at random per cache so that keys
    /// chosen by an attacker cannot be aimed at one probe sequence).
    ///
    /// ```
    /// use std::hash::RandomState;
    /// let cache: herdcache::Cache<String, u32, RandomState> = herdcache::Cache::builder()
    ///     .max_capacity(100)
    ///     .hasher(RandomState::new()) // std's SipHash
    ///     .build()?;
    /// cache.insert("a".to_owned(), 1);
    /// assert_eq!(cache.get("a"), Some(1));
    /// # Ok::<(), herdcache::BuildError>(())
    /// ```
    pub fn hasher<S2: BuildHasher>(self, hasher: S2) -> CacheBuilder<K, V, S2> {
        CacheBuilder {
            max_capacity: self.max_capacity,
            initial_capacity: self.initial_capacity,
            time_to_live: self.time_to_live,
            time_to_idle: self.time_to_idle,
            negative_ttl: self.negative_ttl,
            refresh_after: self.refresh_after,
            xfetch_beta: self.xfetch_beta,
            stale_if_error: self.stale_if_error,
            max_concurrent_loads: self.max_concurrent_loads,
            load_timeout: self.load_timeout,
            max_stale: self.max_stale,
            spawner: self.spawner,
            clock: self.clock,
            #[cfg(feature = "redis")]
            shared: self.shared,
            // Typed on the old hasher: `build` asks for the tier again.
            #[cfg(feature = "redis")]
            listen: None,
            hooks: self.hooks,
            hasher,
            _marker: PhantomData,
        }
    }
}

/// [`CacheBuilder::max_stale`]'s default: one minute.
const DEFAULT_MAX_STALE_NANOS: u64 = 60_000_000_000;

fn check_duration(setting: &'static str, d: Option<Duration>) -> Result<Option<u64>, BuildError> {
    match d {
        None => Ok(None),
        Some(d) if d.is_zero() => Err(BuildError::Invalid {
            setting,
            reason: "must be greater than zero",
        }),
        Some(d) if d > MAX_DURATION => Err(BuildError::Invalid {
            setting,
            reason: "must be at most 100 years (set none to never expire)",
        }),
        Some(d) => Ok(Some(crate::clock::duration_to_nanos(d))),
    }
}

impl<K, V, S> CacheBuilder<K, V, S>
where
    K: Hash + Eq + Send + Sync + 'static,
    V: Send + Sync + 'static,
    S: BuildHasher,
{
    /// Checks the settings and builds the cache.
    ///
    /// # Errors
    /// [`BuildError`] naming the first setting that is missing or out of range.
    ///
    /// ```
    /// use herdcache::{BuildError, Cache};
    /// let err = Cache::<u32, u32>::builder().build().unwrap_err();
    /// assert_eq!(err, BuildError::Missing { setting: "max_capacity" });
    /// let cache: Cache<u32, u32> = Cache::builder().max_capacity(10).build()?;
    /// assert_eq!(cache.max_capacity(), 10);
    /// # Ok::<(), BuildError>(())
    /// ```
    pub fn build(self) -> Result<Cache<K, V, S>, BuildError> {
        let settings = self.validate()?;
        #[cfg(feature = "redis")]
        if self.shared.is_some() && self.listen.is_none() {
            return Err(BuildError::Invalid {
                setting: "shared_tier",
                reason: "must be given after the hasher",
            });
        }
        let cache = Cache::from_engine(Engine::new(
            settings,
            self.hooks,
            #[cfg(feature = "redis")]
            self.shared,
            self.hasher,
        )?);
        #[cfg(feature = "redis")]
        if let Some(listen) = self.listen {
            listen(&cache);
        }
        Ok(cache)
    }

    pub(crate) fn validate(&self) -> Result<Settings, BuildError> {
        let max_capacity = match self.max_capacity {
            None => {
                return Err(BuildError::Missing {
                    setting: "max_capacity",
                })
            }
            Some(0) => {
                return Err(BuildError::Invalid {
                    setting: "max_capacity",
                    reason: "must be greater than zero",
                })
            }
            Some(n) if n > MAX_CAPACITY_LIMIT => {
                return Err(BuildError::Invalid {
                    setting: "max_capacity",
                    reason: "must be at most 2^48",
                })
            }
            Some(n) => usize::try_from(n).map_err(|_| BuildError::Invalid {
                setting: "max_capacity",
                reason: "does not fit this platform's address space",
            })?,
        };
        let weighted = self.hooks.weigher.is_some();
        let initial_capacity = match self.initial_capacity {
            Some(n) if n > MAX_INITIAL_CAPACITY => {
                return Err(BuildError::Invalid {
                    setting: "initial_capacity",
                    reason: "must be at most 2^28 (the table grows past it as entries come)",
                })
            }
            // The table never needs room for more entries than the capacity (a weight is at
            // least 1); with a weigher the two do not even compare (entries, weight).
            Some(n) => n.min(max_capacity),
            None => max_capacity.min(64),
        };
        let time_to_live = check_duration("time_to_live", self.time_to_live)?;
        let negative_ttl = check_duration("negative_ttl", self.negative_ttl)?;
        check_duration("time_to_idle", self.time_to_idle)?;
        if self.time_to_idle > Some(crate::clock::MAX_IDLE) {
            return Err(BuildError::Invalid {
                setting: "time_to_idle",
                reason: "must be at most a year",
            });
        }
        let time_to_idle = self.time_to_idle.map(crate::clock::idle_units);
        let soft_ttl = check_duration("refresh_after", self.refresh_after)?;
        if let (Some(soft), Some(hard)) = (soft_ttl, time_to_live) {
            if soft >= hard {
                return Err(BuildError::Invalid {
                    setting: "refresh_after",
                    reason: "must be shorter than time_to_live",
                });
            }
        }
        let beta = match self.xfetch_beta {
            None => None,
            Some(b) if !(b.is_finite() && b > 0.0 && b <= 1000.0) => {
                return Err(BuildError::Invalid {
                    setting: "xfetch",
                    reason: "beta must be finite, above 0 and at most 1000",
                })
            }
            Some(_) if time_to_live.is_none() => {
                return Err(BuildError::Invalid {
                    setting: "xfetch",
                    reason: "needs time_to_live: XFetch refreshes ahead of an expiry",
                })
            }
            Some(b) => Some(b),
        };
        if self.max_concurrent_loads == Some(0) {
            return Err(BuildError::Invalid {
                setting: "max_concurrent_loads",
                reason: "must be at least 1",
            });
        }
        let load_timeout =
            check_duration("load_timeout", self.load_timeout)?.map(Duration::from_nanos);
        let max_stale = match self.max_stale {
            Some(d) if d > MAX_DURATION => {
                return Err(BuildError::Invalid {
                    setting: "max_stale",
                    reason: "must be at most 100 years",
                })
            }
            Some(d) => crate::clock::duration_to_nanos(d),
            None => DEFAULT_MAX_STALE_NANOS,
        };
        let clock = match &self.clock {
            Some(c) => TimeSource::Custom(Arc::clone(c)),
            None => TimeSource::System(SystemClock::new()),
        };
        Ok(Settings {
            max_capacity,
            initial_capacity,
            time_to_live,
            time_to_idle,
            time_to_idle_set: self.time_to_idle,
            weighted,
            negative_ttl,
            refresh: crate::refresh::RefreshSettings {
                soft_ttl,
                beta,
                stale_if_error: self.stale_if_error,
            },
            max_concurrent_loads: self.max_concurrent_loads,
            load_timeout,
            max_stale,
            spawner: self.spawner.clone(),
            clock,
        })
    }
}

impl<K, V> Cache<K, V, DefaultHashBuilder>
where
    K: Hash + Eq + Send + Sync + 'static,
    V: Send + Sync + 'static,
{
    /// A builder; `max_capacity` is the one required setting.
    ///
    /// ```
    /// let cache: herdcache::Cache<String, u64> =
    ///     herdcache::Cache::builder().max_capacity(1_000).build()?;
    /// # Ok::<(), herdcache::BuildError>(())
    /// ```
    pub fn builder() -> CacheBuilder<K, V, DefaultHashBuilder> {
        CacheBuilder::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEC: Duration = Duration::from_secs(1);

    fn builder() -> CacheBuilder<u64, u64> {
        CacheBuilder::new()
    }

    #[test]
    fn every_bad_setting_is_an_error_naming_it() {
        let cases: Vec<(CacheBuilder<u64, u64>, &str)> = vec![
            (builder(), "max_capacity"),
            (builder().max_capacity(0), "max_capacity"),
            (
                builder().max_capacity(MAX_CAPACITY_LIMIT + 1),
                "max_capacity",
            ),
            (
                builder()
                    .max_capacity(10)
                    .initial_capacity(MAX_INITIAL_CAPACITY + 1),
                "initial_capacity",
            ),
            (
                builder().max_capacity(10).time_to_live(Duration::ZERO),
                "time_to_live",
            ),
            (
                builder().max_capacity(10).time_to_live(Duration::MAX),
                "time_to_live",
            ),
            (
                builder().max_capacity(10).negative_ttl(Duration::ZERO),
                "negative_ttl",
            ),
            (
                builder().max_capacity(10).time_to_idle(Duration::ZERO),
                "time_to_idle",
            ),
            (
                builder()
                    .max_capacity(10)
                    .time_to_idle(400 * 24 * 3600 * SEC),
                "time_to_idle",
            ),
            (builder().max_capacity(10).xfetch(1.0), "xfetch"),
            (
                builder().max_capacity(10).time_to_live(SEC).xfetch(0.0),
                "xfetch",
            ),
            (
                builder().max_capacity(10).time_to_live(SEC).xfetch(-1.0),
                "xfetch",
            ),
            (
                builder()
                    .max_capacity(10)
                    .time_to_live(SEC)
                    .xfetch(f64::NAN),
                "xfetch",
            ),
            (
                builder()
                    .max_capacity(10)
                    .time_to_live(SEC)
                    .xfetch(f64::INFINITY),
                "xfetch",
            ),
            (
                builder()
                    .max_capacity(10)
                    .time_to_live(SEC)
                    .refresh_after(SEC),
                "refresh_after",
            ),
            (
                builder().max_capacity(10).refresh_after(Duration::ZERO),
                "refresh_after",
            ),
            (
                builder().max_capacity(10).load_timeout(Duration::ZERO),
                "load_timeout",
            ),
            (
                builder().max_capacity(10).load_timeout(Duration::MAX),
                "load_timeout",
            ),
            (
                builder().max_capacity(10).max_stale(Duration::MAX),
                "max_stale",
            ),
            (
                builder()
                    .max_capacity(MAX_CAPACITY_LIMIT)
                    .initial_capacity(1 << 48),
                "initial_capacity",
            ),
            (
                builder()
                    .max_capacity(MAX_CAPACITY_LIMIT)
                    .initial_capacity(MAX_INITIAL_CAPACITY + 1),
                "initial_capacity",
            ),
        ];
        for (b, setting) in cases {
            let err = b.build().expect_err(setting);
            assert_eq!(err.setting(), setting);
            assert!(err.to_string().contains(setting), "{err}");
        }
    }

    #[test]
    fn limits_themselves_are_accepted() {
        assert!(builder().max_capacity(MAX_CAPACITY_LIMIT).build().is_ok());
        assert!(builder()
            .max_capacity(1)
            .time_to_live(MAX_DURATION)
            .build()
            .is_ok());
    }
}
