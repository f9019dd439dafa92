//! The miss path: single flight over the table.
//!
//! A caller that misses tries to install a `Loading` entry (holding a fresh [`Flight`]) with
//! one CAS on the key's slot; the winner leads the load, everyone who then finds the
//! `Loading` entry waits on its flight. The leader publishes its value only if the slot
//! still holds its `Loading` entry (the one with its flight), so an `insert`, `invalidate` or
//! `forget` during the load wins; then it completes the flight, which wakes every waiter. A
//! drop guard completes the flight with `Panicked` and removes the `Loading` entry if the
//! loader unwinds, so nothing is left waiting (DESIGN.md §4 invariants 2-4, §5).

use std::any::Any;
use std::borrow::Borrow;
use std::convert::Infallible;
use std::fmt;
use std::hash::{BuildHasher, Hash};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::cache::Cache;
use crate::clock::OnceNow;
use crate::engine::{EntryNode, LoadEnd};
use crate::entry::{expiry_after, Entry, Kind, NEVER};
use crate::flight::{Flight, FlightResult, Keep, Start};
use crate::local::Pinned;
use crate::pacing::Permit;
use crate::refresh::{LoadRecord, RefreshState};
use crate::removal::RemovalCause;
use crate::stats::Counter;
use crate::sync::{AtomicBool, Ordering};
use crate::table::Node;
use crate::trace::trace_event;

/// Why [`Cache::get_or_load`] returned no value.
///
/// ```
/// use herdcache::LoadError;
/// let cache: herdcache::Cache<u32, u32> = herdcache::Cache::builder().max_capacity(10).build()?;
/// match cache.get_or_load(&1, |_| Err("not found")) {
///     Err(LoadError::Failed(e)) => assert_eq!(*e, "not found"), // the loader's own error
///     other => panic!("unexpected: {other:?}"),
/// }
/// // A call that needs a spawner, on a cache built without one.
/// let r = cache.get_or_load_background(&1, |_| Ok::<_, ()>(1));
/// assert_eq!(r, Err(LoadError::NoSpawner));
/// # Ok::<(), herdcache::BuildError>(())
/// ```
#[derive(Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LoadError<E> {
    /// The loader returned this error (the same `Arc` for every caller that waited on the
    /// load, or a cached one under [`negative_ttl`](crate::CacheBuilder::negative_ttl)).
    Failed(Arc<E>),
    /// The loader panicked. The panic continued in the caller that ran the loader; the others
    /// get this error, and the next caller starts a fresh load.
    Panicked,
    /// This caller's own deadline passed before the load finished, and no expired value
    /// within [`max_stale`](crate::CacheBuilder::max_stale) was kept to serve instead. The
    /// load carries on for the others.
    Timeout,
    /// The load itself ran past the cache's
    /// [`load_timeout`](crate::CacheBuilder::load_timeout), and no expired value within
    /// [`max_stale`](crate::CacheBuilder::max_stale) was kept to serve instead. The load was
    /// detached: its permit is back, its late result will not be cached, and the next call
    /// starts a fresh load. Also what a caller gets that waited a whole `load_timeout` for
    /// a load permit ([`max_concurrent_loads`](crate::CacheBuilder::max_concurrent_loads))
    /// without getting one: its load never started.
    LoadTimedOut,
    /// The loader called back into the cache for the key it is loading; waiting on itself
    /// would never end.
    Recursive,
    /// The load this call handed to the cache's
    /// [`spawner`](crate::CacheBuilder::spawner) was dropped before it finished
    /// (the runtime shut down, or the spawner dropped the task). Nothing was cached; the next
    /// call loads afresh.
    Cancelled,
    /// The call hands its loads to a spawner and the cache was built without one
    /// ([`get_or_load_background`](crate::Cache::get_or_load_background) and
    /// [`get_or_load_spawned`](crate::Cache::get_or_load_spawned) need a
    /// [`spawner`](crate::CacheBuilder::spawner)). Returned at once, before any lookup, so that the mistake shows
    /// on the first call rather than as callers that wait or loads that vanish.
    NoSpawner,
}

impl<E> Clone for LoadError<E> {
    fn clone(&self) -> Self {
        match self {
            LoadError::Failed(e) => LoadError::Failed(Arc::clone(e)),
            LoadError::Panicked => LoadError::Panicked,
            LoadError::Timeout => LoadError::Timeout,
            LoadError::LoadTimedOut => LoadError::LoadTimedOut,
            LoadError::Recursive => LoadError::Recursive,
            LoadError::Cancelled => LoadError::Cancelled,
            LoadError::NoSpawner => LoadError::NoSpawner,
        }
    }
}

/// What went wrong, without the loader's own error: that is the `source()`, so that a report
/// printing the chain (anyhow's `{:#}`, `Error::source` walks) shows it once.
impl<E> fmt::Display for LoadError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LoadError::Failed(_) => f.write_str("loader failed"),
            LoadError::Panicked => f.write_str("loader panicked"),
            LoadError::Timeout => f.write_str("timed out waiting for the load"),
            LoadError::LoadTimedOut => f.write_str("the load ran past its load_timeout"),
            LoadError::Recursive => f.write_str("loader re-entered the cache for its own key"),
            LoadError::Cancelled => f.write_str("the spawned load was dropped before it finished"),
            LoadError::NoSpawner => f.write_str(
                "this call runs loads on a spawner and the cache has none (see CacheBuilder::spawner)",
            ),
        }
    }
}

/// A `LoadError` is a `std::error::Error` whatever the loader's error type (`String`,
/// `anyhow::Error`, an `io::Error`, your own), so `?` works into `anyhow::Error`,
/// `Box<dyn Error + Send + Sync>` and the like. Its `source()` is the loader's error, shown
/// as that error shows itself: a report that prints the chain (anyhow's `{:#}`, a walk of
/// `source()`) shows it once, after "loader failed". Where the loader's error carries a chain
/// of its own, the chain goes on through it: an `anyhow::Error` (with the `anyhow` feature),
/// a `Box<dyn Error (+ Send + Sync)>`, an `Arc<dyn Error + Send + Sync>`, an `io::Error`.
/// For the loader's error as its own type, match [`LoadError::Failed`] (or
/// [`LoadError::failed`]).
///
/// ```
/// # #[cfg(feature = "anyhow")] {
/// use anyhow::Context;
/// #[derive(Debug)]
/// struct DbDown;
/// impl std::fmt::Display for DbDown {
///     fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
///         f.write_str("connection refused")
///     }
/// }
/// impl std::error::Error for DbDown {}
///
/// fn lookup(cache: &herdcache::Cache<u32, String>) -> anyhow::Result<String> {
///     Ok(cache.get_or_load(&1, |id| Err(DbDown).context(format!("loading user {id}")))?)
/// }
/// let cache = herdcache::Cache::builder().max_capacity(10).build().unwrap();
/// let e = lookup(&cache).unwrap_err();
/// assert_eq!(e.to_string(), "loader failed");
/// assert_eq!(format!("{e:#}"), "loader failed: loading user 1: connection refused");
/// assert!(e.chain().any(|c| c.downcast_ref::<DbDown>().is_some()));
/// # }
/// ```
impl<E: fmt::Debug + fmt::Display + Send + Sync + 'static> std::error::Error for LoadError<E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            LoadError::Failed(e) => Some(LoaderError::of(&**e)),
            _ => None,
        }
    }
}

impl<E> LoadError<E> {
    /// The loader's own error, if the load failed with one.
    ///
    /// ```
    /// let cache: herdcache::Cache<u32, u32> = herdcache::Cache::builder().max_capacity(10).build()?;
    /// let e = cache.get_or_load(&1, |_| Err("not found")).unwrap_err();
    /// assert_eq!(e.failed(), Some(&"not found"));
    /// # Ok::<(), herdcache::BuildError>(())
    /// ```
    pub fn failed(&self) -> Option<&E> {
        match self {
            LoadError::Failed(e) => Some(e),
            _ => None,
        }
    }
}

/// The loader's error as the source of a [`LoadError`]: shown as it shows itself, its own
/// chain reached where its type can carry one.
#[repr(transparent)]
struct LoaderError<E>(E);

impl<E> LoaderError<E> {
    fn of(e: &E) -> &Self {
        // SAFETY: `LoaderError<E>` is a transparent wrapper of `E`.
        unsafe { &*(e as *const E as *const Self) }
    }
}

impl<E: fmt::Display> fmt::Display for LoaderError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl<E: fmt::Debug> fmt::Debug for LoaderError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

impl<E: fmt::Debug + fmt::Display + Send + Sync + 'static> std::error::Error for LoaderError<E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        use std::error::Error;
        // The types that carry a chain behind their message: the next link is theirs.
        let e: &dyn Any = &self.0;
        #[cfg(feature = "anyhow")]
        if let Some(e) = e.downcast_ref::<anyhow::Error>() {
            return (**e).source();
        }
        if let Some(e) = e.downcast_ref::<Box<dyn Error + Send + Sync>>() {
            return e.source();
        }
        if let Some(e) = e.downcast_ref::<Arc<dyn Error + Send + Sync>>() {
            return e.source();
        }
        if let Some(e) = e.downcast_ref::<std::io::Error>() {
            return e.source();
        }
        None
    }
}

/// What an `optionally_get_with` loader found: nothing. A private type, so that no other
/// caller's loader error is taken for it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Absent;

impl<E> LoadError<E> {
    /// This error, which is not `Failed`, as a `LoadError<Infallible>`.
    pub(crate) fn map_failed_never(self) -> LoadError<Infallible> {
        match self {
            LoadError::Failed(_) => unreachable!("a failed load is handled before"),
            LoadError::Panicked => LoadError::Panicked,
            LoadError::Timeout => LoadError::Timeout,
            LoadError::LoadTimedOut => LoadError::LoadTimedOut,
            LoadError::Recursive => LoadError::Recursive,
            LoadError::Cancelled => LoadError::Cancelled,
            LoadError::NoSpawner => LoadError::NoSpawner,
        }
    }
}

/// What a caller that is not the leader makes of a finished flight.
pub(crate) enum Joined<V, E> {
    Done(Result<V, LoadError<E>>),
    /// The load failed with another caller's error type: load again ourselves.
    Retry,
}

fn downcast<E: Send + Sync + 'static>(error: &Arc<dyn Any + Send + Sync>) -> Option<Arc<E>> {
    Arc::clone(error).downcast::<E>().ok()
}

impl<K, V, S> Cache<K, V, S>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
    S: BuildHasher,
{
    /// The value for `key`; on a miss, loads it with `loader` exactly once however many
    /// callers miss together.
    ///
    /// The caller that finds the key missing first runs `loader` (inline, on its own thread);
    /// every other caller for that key parks until the load finishes and receives the same
    /// value or the same error. The value is cached (with the cache's TTL) before any waiter
    /// wakes, so later readers hit it, and the admission that caching triggers never evicts
    /// it: the next call for the key does not load again. Errors are not cached unless
    /// [`negative_ttl`](crate::CacheBuilder::negative_ttl) is set.
    ///
    /// `key` may be any borrowed form of the key, as for [`get`](Self::get) (`&str` for
    /// `String` keys): a hit allocates nothing, and the key is made owned (`ToOwned`) only
    /// when this call starts a load; the loader gets the owned key. The same holds for every
    /// loading call.
    ///
    /// A loader that panics wakes every waiter with [`LoadError::Panicked`] and its panic
    /// continues in this caller. With a [`load_timeout`](crate::CacheBuilder::load_timeout),
    /// waiters stop waiting for a loader that hangs: see there. A loader that calls back into this cache for the same key gets
    /// [`LoadError::Recursive`] there instead of deadlocking.
    ///
    /// ```
    /// let cache = herdcache::Cache::builder().max_capacity(100).build()?;
    /// let v = cache.get_or_load(&7u32, |k| Ok::<_, std::io::Error>(k * 2));
    /// assert_eq!(v.unwrap(), 14);
    /// // Cached now: the loader is not called again.
    /// let v = cache.get_or_load(&7u32, |_| -> Result<u32, std::io::Error> { unreachable!() });
    /// assert_eq!(v.unwrap(), 14);
    /// # Ok::<(), herdcache::BuildError>(())
    /// ```
    pub fn get_or_load<Q, E, F>(&self, key: &Q, loader: F) -> Result<V, LoadError<E>>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
        F: FnOnce(&K) -> Result<V, E>,
        E: Send + Sync + 'static,
    {
        match self.begin(key, None) {
            Begin::Done(r) => r,
            Begin::Lead(lead) => Self::run_lead(lead, loader, false),
        }
    }

    /// Like [`get_or_load`](Self::get_or_load), but a caller that has to wait for another
    /// caller's load waits at most `timeout`.
    ///
    /// When the deadline passes first, it returns the expired value the load is replacing if
    /// one was kept, else [`LoadError::Timeout`]; the load carries on and its result is cached
    /// and delivered to the callers still waiting. A caller that leads the load runs the loader
    /// to completion (the deadline bounds waiting, not loading).
    ///
    /// ```
    /// use std::{sync::Barrier, time::Duration};
    /// let cache: herdcache::Cache<u32, u32> = herdcache::Cache::builder().max_capacity(10).build()?;
    /// let (started, release) = (Barrier::new(2), Barrier::new(2));
    /// std::thread::scope(|s| {
    ///     s.spawn(|| cache.get_or_load(&1, |_| {
    ///         started.wait();
    ///         release.wait(); // a slow source
    ///         Ok::<_, ()>(10)
    ///     }));
    ///     started.wait();
    ///     let r = cache.get_or_load_timeout(&1, Duration::from_millis(10), |_| Ok::<_, ()>(20));
    ///     assert_eq!(r, Err(herdcache::LoadError::Timeout));
    ///     release.wait();
    /// });
    /// assert_eq!(cache.get(&1), Some(10)); // the load went on and was cached
    /// # Ok::<(), herdcache::BuildError>(())
    /// ```
    pub fn get_or_load_timeout<Q, E, F>(
        &self,
        key: &Q,
        timeout: Duration,
        loader: F,
    ) -> Result<V, LoadError<E>>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
        F: FnOnce(&K) -> Result<V, E>,
        E: Send + Sync + 'static,
    {
        // A timeout too long to represent is no deadline at all.
        let deadline = Instant::now().checked_add(timeout);
        match self.begin(key, deadline) {
            Begin::Done(r) => r,
            Begin::Lead(lead) => Self::run_lead(lead, loader, false),
        }
    }

    /// Like [`get_or_load`](Self::get_or_load), but an early refresh this call wins runs on the
    /// cache's [`spawner`](crate::CacheBuilder::spawner) (as a
    /// [`RefreshJob`](crate::RefreshJob), on a thread that may block) and this call returns the current value at once, so no reader waits
    /// for a refresh. Loads of missing or expired keys still run inline (the caller has
    /// nothing to return meanwhile). A cache built without a spawner returns
    /// [`LoadError::NoSpawner`] at once: the call would otherwise make its caller wait for
    /// the refresh it exists to avoid.
    ///
    /// The loader may outlive the call, hence `Send + 'static`.
    ///
    /// ```
    /// use std::sync::{Arc, Mutex};
    /// use std::time::Duration;
    /// use herdcache::{LoadTask, RefreshJob, Spawner};
    ///
    /// /// Queues refresh jobs for a pool of threads (here, the example runs them).
    /// #[derive(Clone, Default)]
    /// struct Pool(Arc<Mutex<Vec<RefreshJob>>>);
    /// impl Spawner for Pool {
    ///     fn spawn(&self, task: LoadTask) { drop(task) } // no futures in this service
    ///     fn spawn_blocking(&self, job: RefreshJob) { self.0.lock().unwrap().push(job) }
    /// }
    ///
    /// let pool = Pool::default();
    /// let clock = herdcache::ManualClock::new();
    /// let cache: herdcache::Cache<u32, u32> = herdcache::Cache::builder()
    ///     .max_capacity(100)
    ///     .refresh_after(Duration::from_secs(10))
    ///     .clock(clock.clone())
    ///     .spawner(pool.clone())
    ///     .build()?;
    /// cache.insert(1, 1);
    /// clock.advance(Duration::from_secs(11));
    /// // Due for a refresh: handed to the spawner, and this call returns the current value.
    /// assert_eq!(cache.get_or_load_background(&1, |_| Ok::<_, ()>(2)), Ok(1));
    /// pool.0.lock().unwrap().pop().unwrap().run(); // the pool's thread runs it
    /// assert_eq!(cache.get(&1), Some(2));
    /// # Ok::<(), herdcache::BuildError>(())
    /// ```
    pub fn get_or_load_background<Q, E, F>(&self, key: &Q, loader: F) -> Result<V, LoadError<E>>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
        F: FnOnce(&K) -> Result<V, E> + Send + 'static,
        E: Send + Sync + 'static,
        S: Send + Sync + 'static,
    {
        if self.inner.settings().spawner.is_none() {
            return Err(LoadError::NoSpawner);
        }
        let lead = match self.begin(key, None) {
            Begin::Done(r) => return r,
            Begin::Lead(lead) => lead,
        };
        let current = lead.flight.serving(|| self.inner.now()).cloned();
        match (&self.inner.settings().spawner, current) {
            (Some(spawn), Some(current)) => {
                // No thread runs the loader until the job starts: a read of this key on our
                // thread meanwhile must wait for it, not be taken for re-entry.
                lead.flight.clear_leader();
                spawn.spawn_blocking(crate::RefreshJob::new(move || {
                    let _ = Self::run_lead(lead, loader, true);
                }));
                Ok(current)
            }
            _ => Self::run_lead(lead, loader, false),
        }
    }

    /// The value for `key`; on a miss, computes it with `init`, once however many callers
    /// miss together: [`get_or_load`](Self::get_or_load) for a loader that cannot fail, with
    /// no `Result` at either end.
    ///
    /// Whatever ends a load without a value for this caller makes it look again (and lead
    /// the next load if nobody else does): another caller's `init` panicking (the panic
    /// continues in that caller), or a load detached past the cache's
    /// [`load_timeout`](crate::CacheBuilder::load_timeout).
    ///
    /// # Panics
    ///
    /// If `init` panics (the load's waiters look again), or if `init` calls back into the
    /// cache for the key it is computing, which would otherwise wait for itself for ever.
    ///
    /// ```
    /// let cache = herdcache::Cache::builder().max_capacity(100).build()?;
    /// let len = cache.get_with("four", |k: &String| k.len());
    /// assert_eq!(len, 4);
    /// # Ok::<(), herdcache::BuildError>(())
    /// ```
    pub fn get_with<Q, F>(&self, key: &Q, init: F) -> V
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
        F: FnOnce(&K) -> V,
    {
        // Taken only by a call that leads, which returns its value or unwinds: a call that
        // looks again still holds it.
        let mut init = Some(init);
        loop {
            let loaded = self.get_or_load(key, |k| match init.take() {
                Some(f) => Ok::<V, Infallible>(f(k)),
                None => unreachable!("get_with's init ran in a call that then looked again"),
            });
            match loaded {
                Ok(v) => return v,
                Err(e) => Self::retry_infallible(e),
            }
        }
    }

    /// The value for `key`; on a miss, computes it with `init`, which may find nothing:
    /// then nothing is cached (unless [`negative_ttl`](crate::CacheBuilder::negative_ttl) is
    /// set, which caches the absence for that long) and the call returns `None`. Once however
    /// many callers miss together, as [`get_with`](Self::get_with), whose rules it follows
    /// (moka's `optionally_get_with`).
    ///
    /// # Panics
    ///
    /// As [`get_with`](Self::get_with).
    ///
    /// ```
    /// let users = std::collections::HashMap::from([(1, "Ada")]);
    /// let cache: herdcache::Cache<u32, &str> = herdcache::Cache::builder().max_capacity(100).build()?;
    /// assert_eq!(cache.optionally_get_with(&1, |id| users.get(id).copied()), Some("Ada"));
    /// assert_eq!(cache.optionally_get_with(&2, |id| users.get(id).copied()), None);
    /// assert_eq!(cache.get(&2), None); // the absence was not cached
    /// # Ok::<(), herdcache::BuildError>(())
    /// ```
    pub fn optionally_get_with<Q, F>(&self, key: &Q, init: F) -> Option<V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
        F: FnOnce(&K) -> Option<V>,
    {
        // As in `get_with`: taken only by a call that leads, which returns or unwinds.
        let mut init = Some(init);
        loop {
            let loaded = self.get_or_load(key, |k| match init.take() {
                Some(f) => f(k).ok_or(Absent),
                None => {
                    unreachable!("optionally_get_with's init ran in a call that then looked again")
                }
            });
            match loaded {
                Ok(v) => return Some(v),
                Err(LoadError::Failed(_)) => return None,
                Err(e) => Self::retry_infallible(e.map_failed_never()),
            }
        }
    }

    /// What `get_with` and `get_with_async` make of a load that ended without a value: a
    /// re-entry is a bug in the caller's `init`; anything else is worth another look.
    pub(crate) fn retry_infallible(e: LoadError<Infallible>) {
        match e {
            LoadError::Failed(never) => match *never {},
            LoadError::Recursive => {
                panic!("get_with: init called back into the cache for the key it computes")
            }
            LoadError::Panicked
            | LoadError::Timeout
            | LoadError::LoadTimedOut
            | LoadError::Cancelled
            | LoadError::NoSpawner => {}
        }
    }

    /// Detaches the load of `key` in progress, if any, and returns whether it did. The load's
    /// waiters are woken and look at the key again (so one of them leads a new load), its
    /// load permit is returned, and its result, if it ever comes, goes to its leader only and
    /// is not cached.
    ///
    /// ```
    /// use std::sync::Barrier;
    /// let cache: herdcache::Cache<u32, u32> = herdcache::Cache::builder().max_capacity(10).build()?;
    /// assert!(!cache.forget(&1)); // no load in progress
    /// let (started, release) = (Barrier::new(2), Barrier::new(2));
    /// std::thread::scope(|s| {
    ///     let leader = s.spawn(|| cache.get_or_load(&1, |_| {
    ///         started.wait();
    ///         release.wait(); // the source changes meanwhile
    ///         Ok::<_, ()>(10)
    ///     }));
    ///     started.wait();
    ///     assert!(cache.forget(&1));
    ///     release.wait();
    ///     assert_eq!(leader.join().unwrap(), Ok(10)); // its leader still gets the value
    /// });
    /// assert_eq!(cache.get(&1), None); // but it was not cached
    /// # Ok::<(), herdcache::BuildError>(())
    /// ```
    pub fn forget<Q>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let pinned = self.inner.pin();
        let hash = self.inner.hash(key);
        let current = self.inner.find(hash, key, pinned.guard());
        let Some(Kind::Loading(flight)) = current.map(|n| n.value.kind()) else {
            return false;
        };
        // Claimed first, as a time-out is: if the leader has claimed, its result is being
        // published and there is nothing left to detach.
        if !flight.claim() {
            return false;
        }
        let flight = Arc::clone(flight);
        self.inner.end_load(
            hash,
            &flight,
            LoadEnd::Remove(RemovalCause::Invalidated),
            &self.inner.once_now(),
            &pinned,
        );
        // Its waiters look again (one leads a new load) and its permit is back; the detached
        // loader's late result is refused (it lost the claim).
        // SAFETY: claimed above, published once.
        unsafe { flight.publish(FlightResult::Abandoned) };
        true
    }

    /// Detaches a load past its deadline (`load_timeout`) if the slot still holds it: a
    /// refresh's still-valid value goes back in place (the next refresh backs off), anything
    /// else is removed; then the flight completes as `TimedOut`, which wakes its waiters and
    /// returns its permit. The loader, if it ever returns, finds its entry gone.
    /// Returns whether it did (false: the flight was completed, or is being, by someone
    /// else).
    pub(crate) fn time_out<Q>(&self, key: &Q, hash: u64, flight: &Arc<Flight<V>>) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        // Claimed first: if the leader has claimed, its result is about to be published and
        // wins; if we claim, the leader will publish nothing, even if it finishes now.
        if !flight.claim() {
            return false;
        }
        // Between our claim and our publication nothing may unwind past us (a custom clock,
        // the listener of what the put-back evicts): the waiters would wait for ever.
        let settled = catch_unwind(AssertUnwindSafe(|| self.detach(key, hash, flight)));
        self.inner.pin().count(Counter::LoadTimeouts);
        trace_event!(WARN, "a load ran past its load_timeout and was detached");
        // SAFETY: claimed above, published once.
        unsafe { flight.publish(FlightResult::TimedOut) };
        if let Err(panic) = settled {
            std::panic::resume_unwind(panic);
        }
        true
    }

    /// `time_out`'s table work: puts a refresh's still-valid value back, or removes the
    /// flight's `Loading` entry, if the slot still holds it.
    fn detach<Q>(&self, key: &Q, hash: u64, flight: &Arc<Flight<V>>)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let now = self.inner.now();
        // The put-back's own reading, taken when first needed: after the user code below.
        let at = self.inner.once_now();
        // The value to put back runs user code (`Clone`, the weigher): if it panics, the
        // load is removed instead, so the flight still completes.
        let restore = catch_unwind(AssertUnwindSafe(|| {
            flight.serving(|| now).map(|v| {
                let key = key.to_owned();
                let weight = self.inner.weight_of(&key, v);
                let pkey = self.inner.pkey(hash, &key);
                let entry = self.put_back_entry(pkey, flight, v.clone(), &at);
                (Node::owned(hash, key, entry), weight, pkey)
            })
        }))
        .unwrap_or(None);
        let end = match restore {
            Some(put_back) => LoadEnd::PutBack(put_back),
            // A refresh's value whose put-back panicked leaves with its load.
            None => LoadEnd::Remove(RemovalCause::Replaced),
        };
        let pinned = self.inner.pin();
        self.inner.end_load(hash, flight, end, &at, &pinned);
    }

    /// The entry that puts back a refresh's still-valid `value` when its load failed or was
    /// detached: valid as long as before (its expiry, or its idle deadline if that came
    /// first), one more failure behind it (so the next refresh backs off); written at `now`.
    /// (In a cache with a `time_to_idle` and no TTL, that finite expiry gives the put-back
    /// value the layout with both, see `Entry::ready`.)
    fn put_back_entry(
        &self,
        pkey: u64,
        flight: &Flight<V>,
        value: V,
        now: &OnceNow<'_>,
    ) -> Entry<V> {
        let (delta, failures) = flight.history();
        let until = flight.stale_valid_until();
        self.inner.ready_entry(
            pkey,
            value,
            until,
            LoadRecord {
                delta,
                took: 0,
                failures: failures + 1,
            },
            now,
        )
    }

    /// The value a caller gets in place of a load that did not finish for it: the expired
    /// (or, during a refresh, still valid) value the load replaces, if it expired at most
    /// `max_stale` ago.
    pub(crate) fn fallback(&self, flight: &Flight<V>) -> Option<V> {
        let v = flight.stale()?;
        if !self.within_stale_bound(flight.stale_valid_until()) {
            return None;
        }
        let v = v.clone();
        self.inner.pin().count(Counter::StaleServed);
        Some(v)
    }

    /// Whether a value that expires (or expired) at `expires_at` may still be served as a
    /// fallback now.
    pub(crate) fn within_stale_bound(&self, expires_at: u64) -> bool {
        self.inner.now() <= expires_at.saturating_add(self.inner.settings().max_stale)
    }

    /// One look at the key, which never blocks: what the caller does next. `held` is a permit
    /// the caller obtained by waiting (taken if this step leads).
    #[inline]
    pub(crate) fn step<Q, E>(
        &self,
        key: &Q,
        hash: u64,
        held: &mut Option<Permit>,
    ) -> Step<K, V, S, E>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
        E: Send + Sync + 'static,
    {
        loop {
            let pinned = self.inner.pin();
            let current = self.inner.find(hash, key, pinned.guard());
            // What a load started now replaces: the previous value with its hard expiry, and
            // the previous entry's load-time estimate and refresh failures.
            let mut replaced: Option<(V, u64)> = None;
            let mut history = (0, 0);
            // The entry's refresh claim, if this caller won one: it then leads a refresh, not
            // a load after a miss.
            let mut claimed: Option<&RefreshState> = None;
            if let Some(node) = current {
                let entry = &node.value;
                let now = self.inner.once_now();
                // A live value, or the value a refresh in progress still serves.
                if let Some(v) = self.inner.hit(entry, || now.get(), &pinned) {
                    let Kind::Ready(r) = entry.kind() else {
                        // A refresh in progress, serving the value it replaces. Past its
                        // deadline it is detached here, as any load is (its value goes back,
                        // and the next refresh backs off), or it would hold the key until
                        // the hard expiry.
                        if let Kind::Loading(flight) = entry.kind() {
                            if flight.overdue(Instant::now()) && !flight.led_by_current_thread() {
                                let (flight, v) = (Arc::clone(flight), v.clone());
                                drop(pinned);
                                if self.time_out(key, hash, &flight) {
                                    continue;
                                }
                                // Its leader is publishing: the value is still valid.
                                return Step::Begin(Begin::Done(Ok(v)));
                            }
                        }
                        return Step::Begin(Begin::Done(Ok(v.clone())));
                    };
                    let Some(plan) = r.refresh else {
                        return Step::Begin(Begin::Done(Ok(v.clone())));
                    };
                    let due = self.inner.settings().refresh.due(
                        plan,
                        now.get(),
                        r.expires_at,
                        crate::rng::unit_open_closed,
                    );
                    if !due || !plan.try_claim() {
                        return Step::Begin(Begin::Done(Ok(v.clone())));
                    }
                    claimed = Some(plan);
                }
                match entry.kind() {
                    Kind::Ready(r) => {
                        history = r.history();
                        // Valid until its TTL or its idle deadline, whichever is first: an
                        // idle-expired value is as stale as an expired one.
                        replaced = Some((r.value.clone(), r.valid_until(now.get())));
                    }
                    Kind::Loading(flight) => {
                        if flight.overdue(Instant::now()) && !flight.led_by_current_thread() {
                            // A hung load: detach it, then look again (and lead a new one).
                            // If its leader is publishing right now, wait for that instead.
                            let flight = Arc::clone(flight);
                            drop(pinned);
                            if self.time_out(key, hash, &flight) {
                                continue;
                            }
                            return Step::Wait(flight);
                        }
                        pinned.count(Counter::Misses);
                        return Step::Wait(Arc::clone(flight));
                    }
                    Kind::Failed { error, .. } => {
                        if !entry.is_expired(|| now.get()) {
                            if let Some(e) = downcast::<E>(error) {
                                pinned.count(Counter::Misses);
                                return Step::Begin(Begin::Done(Err(LoadError::Failed(e))));
                            }
                        }
                    }
                }
            }
            let refresh = claimed.is_some();
            if !refresh {
                pinned.count(Counter::Misses);
            }

            // Admission control: take a load permit before leading.
            let permit = match self.inner.limiter() {
                None => None,
                Some(limiter) => match held.take().or_else(|| limiter.try_acquire()) {
                    Some(p) => Some(p),
                    None => {
                        pinned.count(Counter::Throttled);
                        if let Some(state) = claimed {
                            state.unclaim(); // skip this refresh; a later read retries it
                        }
                        // The value a refresh would replace (still valid), or an expired one
                        // within the staleness bound.
                        if let Some((stale, expires_at)) = replaced {
                            if self.within_stale_bound(expires_at) {
                                pinned.count(Counter::StaleServed);
                                return Step::Begin(Begin::Done(Ok(stale)));
                            }
                        }
                        return Step::Throttled(Arc::clone(limiter));
                    }
                },
            };

            // Try to lead: replace exactly what we saw (nothing, a value, or a cached error)
            // with our `Loading` entry.
            let seen = current;
            let flight = Arc::new(Flight::new(Start {
                stale: replaced,
                history,
                refresh,
                // The permit's lease and the load's deadline end together.
                deadline: permit.as_ref().and_then(Permit::deadline).or_else(|| {
                    self.inner
                        .settings()
                        .load_timeout
                        .and_then(|t| Instant::now().checked_add(t))
                }),
                permit,
            }));
            let lead = match self.install_lead(key, hash, seen, flight, refresh, &pinned) {
                Ok(lead) => lead,
                Err(flight) => {
                    // Someone changed the key first: look again, keeping our permit (and our
                    // place in the limiter's queue).
                    *held = flight.take_permit();
                    continue;
                }
            };
            pinned.count(Counter::Loads);
            if refresh {
                pinned.count(Counter::Refreshes);
            }
            // Never hold a pin across user code that may take long: it would hold back
            // reclamation for every thread.
            drop(pinned);
            return Step::Begin(Begin::Lead(lead));
        }
    }

    /// Installs a `Loading` entry holding `flight` for `key` (hash `hash`) in place of `seen`
    /// (the node the caller found under `pinned`, `None`: there was none), and returns the
    /// `Lead` that must end it; `refresh`: `seen` holds a live value the flight serves. The
    /// flight is given back if the key changed first.
    pub(crate) fn install_lead<Q>(
        &self,
        key: &Q,
        hash: u64,
        seen: Option<&EntryNode<K, V>>,
        flight: Arc<Flight<V>>,
        refresh: bool,
        pinned: &Pinned<'_>,
    ) -> Result<Lead<K, V, S>, Arc<Flight<V>>>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let pkey = self.inner.pkey(hash, key);
        let loading = Entry::loading(self.inner.shard_of(pkey), Arc::clone(&flight));
        // Both clones of the key (user code) before the install: once our `Loading` entry
        // is in the table, only the `Lead` (whose drop settles it) may run user code.
        let node = Node::owned(hash, key.to_owned(), loading);
        let lead_key = key.to_owned();
        if !self
            .inner
            .install_load((hash, pkey), key, node, seen, refresh, pinned)
        {
            return Err(flight);
        }
        Ok(Lead {
            cache: self.clone(),
            key: lead_key,
            hash,
            pkey,
            flight,
            claimed: false,
            finished: false,
            panicked: AtomicBool::new(false),
            load: true,
        })
    }

    /// What a waiter makes of a flight it waited on: `outcome` is its result, or `None` if
    /// the waiter's deadline passed first.
    pub(crate) fn joined<E: Send + Sync + 'static>(
        &self,
        flight: &Flight<V>,
        outcome: Option<&FlightResult<V>>,
    ) -> Joined<V, E> {
        match outcome {
            Some(FlightResult::Value(v)) => Joined::Done(Ok(v.clone())),
            Some(FlightResult::Failed(e)) => match downcast::<E>(e) {
                Some(e) => Joined::Done(Err(LoadError::Failed(e))),
                None => Joined::Retry,
            },
            Some(FlightResult::Panicked) => Joined::Done(Err(LoadError::Panicked)),
            // The leader was cancelled: look again, and lead the load if nobody else does.
            Some(FlightResult::Abandoned) => Joined::Retry,
            Some(FlightResult::TimedOut) => {
                Joined::Done(self.fallback(flight).ok_or(LoadError::LoadTimedOut))
            }
            None => {
                self.inner.pin().count(Counter::Timeouts);
                trace_event!(
                    DEBUG,
                    "a caller's deadline passed while it waited for a load"
                );
                Joined::Done(self.fallback(flight).ok_or(LoadError::Timeout))
            }
        }
    }

    /// Runs the loader as the flight's leader and finishes the flight on every path out.
    /// `queued`: the load waited for a spawner (a refresh job) and may be past its deadline
    /// before it starts; a caller's own inline load starts at once and always runs.
    fn run_lead<E, F>(lead: Lead<K, V, S>, loader: F, queued: bool) -> Result<V, LoadError<E>>
    where
        F: FnOnce(&K) -> Result<V, E>,
        E: Send + Sync + 'static,
    {
        lead.flight.set_leader_here();
        if queued && lead.stale_before_start() {
            return lead.time_out();
        }
        // Measured with the cache's clock, so a manual clock drives XFetch's delta in tests.
        let started = lead.cache.inner.now();
        #[cfg(feature = "redis")]
        if let Some(tier) = lead.cache.inner.shared() {
            let count = lead.cache.inner.counting();
            let fetched =
                tier.load_sync(&lead.key, lead.shared_plan(), &count, || loader(&lead.key));
            drop(count);
            return Self::conclude_shared(lead, started, fetched);
        }
        let result = loader(&lead.key);
        Self::conclude(lead, started, result)
    }

    /// Publishes a finished load's result (started at `started`) and completes the flight.
    pub(crate) fn conclude<E>(
        lead: Lead<K, V, S>,
        started: u64,
        result: Result<V, E>,
    ) -> Result<V, LoadError<E>>
    where
        E: Send + Sync + 'static,
    {
        Self::conclude_at(lead, started, result, Keep::For(None))
    }

    /// Like `conclude`, for a load that went through the shared tier: then checks that no
    /// other instance's write of the key was heard while it ran.
    #[cfg(feature = "redis")]
    pub(crate) fn conclude_shared<E>(
        lead: Lead<K, V, S>,
        started: u64,
        fetched: crate::fleet::Fetched<V, E>,
    ) -> Result<V, LoadError<E>>
    where
        E: Send + Sync + 'static,
    {
        let (cache, pkey) = (lead.cache.clone(), lead.pkey);
        let r = Self::conclude_at(lead, started, fetched.result, fetched.keep);
        cache.inner.recheck(pkey, fetched.seen);
        r
    }

    /// Like `conclude`, for a value the cache keeps as `keep` says (one taken from the shared
    /// tier expires here when it expires there; one that raced a write elsewhere is not kept).
    pub(crate) fn conclude_at<E>(
        mut lead: Lead<K, V, S>,
        started: u64,
        result: Result<V, E>,
        keep: Keep,
    ) -> Result<V, LoadError<E>>
    where
        E: Send + Sync + 'static,
    {
        let out = Self::settle(&mut lead, started, result.map_err(Arc::new), keep);
        // The lead goes first, while `out` is still a local: its key's and its flight's
        // values' drops are user code, and a panic there would leak a return value already
        // built (rust-lang/rust#47949), where it drops a local.
        drop(lead);
        out
    }

    /// Like `conclude`, for a load whose error is shared with other loads (one batch's).
    pub(crate) fn conclude_with<E>(
        mut lead: Lead<K, V, S>,
        started: u64,
        result: Result<V, Arc<E>>,
    ) -> Result<V, LoadError<E>>
    where
        E: Send + Sync + 'static,
    {
        let out = Self::settle(&mut lead, started, result, Keep::For(None));
        // As in `conclude_at`.
        drop(lead);
        out
    }

    /// `conclude_at`'s work: the table and the flight settled with `result`.
    fn settle<E>(
        lead: &mut Lead<K, V, S>,
        started: u64,
        result: Result<V, Arc<E>>,
        keep: Keep,
    ) -> Result<V, LoadError<E>>
    where
        E: Send + Sync + 'static,
    {
        let cache = lead.cache.clone();
        let finished = cache.inner.now();
        // The publication's reading (see `Engine::once_now`), taken when first needed: after
        // the user code below (the hooks, `Clone`), which may take any time.
        let now = cache.inner.once_now();
        if lead.load {
            cache.inner.pin().latency(finished.saturating_sub(started));
        }
        trace_event!(
            DEBUG,
            nanos = finished.saturating_sub(started),
            ok = result.is_ok(),
            "load finished"
        );
        let (previous_delta, _) = lead.flight.history();
        match result {
            Ok(value) => {
                let took = finished.saturating_sub(started);
                let load = LoadRecord {
                    delta: crate::refresh::next_delta(previous_delta, took),
                    took,
                    failures: 0,
                };
                // User code (the `expire_after` hook) before the table changes, as the
                // weigher below.
                let expiry = match cache.inner.ttl_of(&lead.key, &value) {
                    Some(ttl) => expiry_after(finished, ttl),
                    None => NEVER,
                };
                let expires_at = match keep {
                    Keep::For(Some(t)) => {
                        expiry.min(expiry_after(finished, crate::clock::duration_to_nanos(t)))
                    }
                    Keep::For(None) => expiry,
                    Keep::No => {
                        lead.remove_loading();
                        lead.finish(FlightResult::Value(value.clone()));
                        return Ok(value);
                    }
                };
                let weight = cache.inner.weight_of(&lead.key, &value);
                let pkey = lead.pkey;
                // Every clone (user code) before the table changes: what the waiters get and
                // what the table holds cannot then part ways on a panic.
                let for_waiters = value.clone();
                lead.replace_loading(weight, &now, false, || {
                    cache
                        .inner
                        .ready_entry(pkey, value.clone(), expires_at, load, &now)
                });
                lead.finish(FlightResult::Value(for_waiters));
                Ok(value)
            }
            Err(error) => {
                let erased: Arc<dyn Any + Send + Sync> = error.clone();
                cache.inner.pin().count(Counter::LoadErrors);
                // Stale-if-error: a failed refresh of a still-valid value puts that value
                // back, with a backoff before the next attempt.
                if cache.inner.settings().refresh.stale_if_error {
                    if let Some(old) = lead.restore_stale(finished) {
                        cache.inner.pin().count(Counter::RefreshFailures);
                        trace_event!(
                            WARN,
                            "refresh failed; the current value stays (stale-if-error)"
                        );
                        return Ok(old);
                    }
                }
                match cache.inner.settings().negative_ttl {
                    Some(ttl) => {
                        let expires_at = expiry_after(finished, ttl);
                        let pkey = lead.pkey;
                        let entry = || {
                            Entry::failed(
                                cache.inner.shard_of(pkey),
                                Arc::clone(&erased),
                                expires_at,
                            )
                        };
                        lead.replace_loading(1, &now, false, entry);
                    }
                    None => lead.remove_loading(),
                }
                lead.finish(FlightResult::Failed(erased));
                Err(LoadError::Failed(error))
            }
        }
    }
}

/// Where the miss path stands before the loader runs.
pub(crate) enum Begin<K, V, S, E>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
    S: BuildHasher,
{
    /// Answered: a hit, a cached error, or a throttled caller served a stale value.
    Done(Result<V, LoadError<E>>),
    /// This caller leads a load.
    Lead(Lead<K, V, S>),
}

/// One look at the key ([`Cache::step`]).
pub(crate) enum Step<K, V, S, E>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
    S: BuildHasher,
{
    /// The miss path ends here: answered, or this caller leads.
    Begin(Begin<K, V, S, E>),
    /// Another caller's load is in progress: wait on its flight, then look again if told to.
    Wait(Arc<Flight<V>>),
    /// No load permit is free and there is no value to serve: wait for a permit, then look
    /// again.
    Throttled(Arc<crate::pacing::Limiter>),
}

/// The leader's obligations for one flight; its drop finishes the flight if the loader
/// unwound (or, for a refresh handed to a spawner, if the job was dropped unrun). It owns
/// what it needs, so that a refresh can move it into a job.
pub(crate) struct Lead<K, V, S>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
    S: BuildHasher,
{
    pub(crate) cache: Cache<K, V, S>,
    pub(crate) key: K,
    hash: u64,
    pkey: u64,
    /// Our `Loading` entry is the one that holds this flight.
    pub(crate) flight: Arc<Flight<V>>,
    /// Whether we won the flight's completion claim (see `Flight::claim`).
    claimed: bool,
    finished: bool,
    /// Set when a loader future panicked inside a poll (its state is dropped only later, when
    /// the thread is no longer unwinding).
    pub(crate) panicked: AtomicBool,
    /// Whether this flight is a load, counted in the statistics (a `compute` is not).
    pub(crate) load: bool,
}

impl<K, V, S> Lead<K, V, S>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
    S: BuildHasher,
{
    /// The table hash of the key.
    pub(crate) fn hash(&self) -> u64 {
        self.hash
    }

    /// Whether this load should not start at all: a refresh job or spawned task that waited
    /// for its spawner past the load's deadline (a waiter may have detached it already, and
    /// returned its permit).
    pub(crate) fn stale_before_start(&self) -> bool {
        // A load detached by `forget` still runs: its result goes to this caller alone, as
        // `forget` promises. (loom makes every deadline overdue at once; there, a claimed
        // flight is the sign of a detach.)
        if cfg!(herdcache_loom) {
            self.flight.is_claimed()
        } else {
            self.flight.overdue(Instant::now())
        }
    }

    /// Claims the flight's completion for this leader, once; false if a detacher (its
    /// deadline, `forget`) claimed it first: then the load's result must not be published.
    fn claim(&mut self) -> bool {
        if !self.claimed {
            self.claimed = self.flight.claim();
        }
        self.claimed
    }

    /// Replaces our `Loading` entry with `make()` if the slot still holds it; returns whether
    /// it did (it did not if an insert, invalidation, forget or time-out came first).
    /// `now`: when the write is made.
    /// `put_back`: the entry puts a refresh's value back (see `LoadEnd::PutBack`).
    fn replace_loading(
        &mut self,
        weight: u64,
        now: &OnceNow<'_>,
        put_back: bool,
        make: impl FnOnce() -> Entry<V>,
    ) -> bool {
        if !self.claim() {
            return false; // detached: the result goes to this leader's caller only
        }
        let cache = &self.cache;
        let pinned = cache.inner.pin();
        let node = (
            Node::owned(self.hash, self.key.clone(), make()),
            weight,
            self.pkey,
        );
        let end = if put_back {
            LoadEnd::PutBack(node)
        } else {
            LoadEnd::Publish(node)
        };
        let replaced = cache
            .inner
            .end_load(self.hash, &self.flight, end, now, &pinned);
        if replaced {
            pinned.count(Counter::Inserts);
        }
        replaced
    }

    /// What the shared tier needs to know about this load: the key's policy key, the TTL to
    /// write a loaded value with, for a refresh how long the value being refreshed still
    /// lives, and the load's deadline.
    #[cfg(feature = "redis")]
    pub(crate) fn shared_plan(&self) -> crate::fleet::LoadPlan {
        let now = self.cache.inner.now();
        crate::fleet::LoadPlan {
            pkey: self.pkey,
            ttl: self
                .cache
                .inner
                .settings()
                .time_to_live
                .map(Duration::from_nanos),
            refreshing: self
                .flight
                .serving(|| now)
                .map(|_| Duration::from_nanos(self.flight.stale_valid_until().saturating_sub(now))),
            deadline: self.flight.deadline(),
        }
    }

    /// Removes our `Loading` entry if the slot still holds it. A refresh's value leaves with
    /// it: the refresh failed (without stale-if-error), or it could not be put back.
    fn remove_loading(&mut self) {
        self.remove_loading_as(RemovalCause::Replaced);
    }

    /// Removes our `Loading` entry if the slot still holds it; the value it served, if any,
    /// leaves for `cause`. Returns whether it did.
    pub(crate) fn remove_loading_as(&mut self, cause: RemovalCause) -> bool {
        if !self.claim() {
            return false; // detached: whoever did it settled the slot
        }
        let pinned = self.cache.inner.pin();
        // The policy may still track the write our load replaced: `end_load` tells it.
        let inner = &self.cache.inner;
        let end = LoadEnd::Remove(cause);
        inner.end_load(self.hash, &self.flight, end, &inner.once_now(), &pinned)
    }

    /// Puts `old`, the value the flight served, back in place of our `Loading` entry as it
    /// was (its expiry, its refresh plan's history), if the slot still holds the entry: a
    /// `compute` that kept it. Returns whether it did.
    pub(crate) fn put_back(&mut self, old: &V) -> bool {
        let cache = self.cache.clone();
        let weight = cache.inner.weight_of(&self.key, old);
        let (delta, failures) = self.flight.history();
        let (pkey, until) = (self.pkey, self.flight.stale_valid_until());
        let at = cache.inner.once_now();
        let load = LoadRecord {
            delta,
            took: 0,
            failures,
        };
        self.replace_loading(weight, &at, true, || {
            cache.inner.ready_entry(pkey, old.clone(), until, load, &at)
        })
    }

    /// If the flight still serves a valid value (a refresh), puts it back with one more
    /// failure behind it (so the next refresh waits for a backoff) and completes the flight
    /// with it; returns it. `None` (and nothing done) otherwise.
    fn restore_stale(&mut self, now: u64) -> Option<V> {
        let old = self.flight.serving(|| now).cloned()?;
        let cache = self.cache.clone();
        let weight = cache.inner.weight_of(&self.key, &old);
        let (pkey, flight) = (self.pkey, Arc::clone(&self.flight));
        let for_waiters = old.clone();
        // Taken when first needed, after the `Clone` in the closure.
        let at = cache.inner.once_now();
        self.replace_loading(weight, &at, true, || {
            cache.put_back_entry(pkey, &flight, old.clone(), &at)
        });
        self.finish(FlightResult::Value(for_waiters));
        Some(old)
    }

    /// Completes the flight (after the table has been updated, so that a woken waiter and
    /// every later reader see the same state). A flight detached meanwhile (its deadline,
    /// `forget`) was completed already; then this changes nothing.
    pub(crate) fn finish(&mut self, result: FlightResult<V>) {
        self.finished = true;
        if self.claim() {
            // SAFETY: `claimed` records our won claim, and `finished` makes this the only
            // publication.
            unsafe { self.flight.publish(result) };
        }
    }

    /// Detaches this load at its deadline (an inline or spawned loader future, dropped by
    /// the caller right after): what its caller gets instead of a value.
    pub(crate) fn time_out<E>(mut self) -> Result<V, LoadError<E>> {
        if self.claimed {
            // (Not reached today: a leader claims only when it concludes.)
            self.remove_loading();
            self.finish(FlightResult::TimedOut);
        } else {
            self.finished = true;
            self.cache.time_out(&self.key, self.hash, &self.flight);
        }
        let out = match self.flight.result() {
            Some(FlightResult::Value(v)) => Ok(v.clone()),
            _ => self
                .cache
                .fallback(&self.flight)
                .ok_or(LoadError::LoadTimedOut),
        };
        // Before `out` is returned, as in `conclude_at`.
        drop(self);
        out
    }
}

impl<K, V, S> Drop for Lead<K, V, S>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
    S: BuildHasher,
{
    fn drop(&mut self) {
        if self.load {
            self.cache.inner.pin().count(Counter::LoadsEnded);
        }
        if self.finished {
            return;
        }
        // The loader (or user code after it: a clone of its value, the weigher) unwound; or
        // the load was cancelled: a loader future dropped before it finished, or a refresh
        // job dropped unrun. A refresh keeps its still-valid value (retried after a backoff);
        // otherwise the entry is removed and waiters get `Panicked`, or, after a
        // cancellation, look at the key again (one of them leads a new load). A panic here,
        // while one may be unwinding, would abort the process: putting the value back runs
        // user code (`Clone`, the weigher), so it runs under `catch_unwind`, and the removal
        // and completion that follow run none (the slot is matched by flight, and freed
        // nodes' drops are contained by the table).
        // Relaxed: set and read on the thread that polls the leader, or handed over with it.
        let panicked = self.panicked.load(Ordering::Relaxed) || std::thread::panicking();
        let counter = if panicked {
            trace_event!(WARN, "a loader panicked");
            Counter::LoadPanics
        } else {
            trace_event!(DEBUG, "a load was cancelled before it finished");
            Counter::LoadsCancelled
        };
        self.cache.inner.pin().count(counter);
        let now = self.cache.inner.now();
        let restored = catch_unwind(AssertUnwindSafe(|| self.restore_stale(now))).unwrap_or(None);
        if restored.is_none() && !self.finished {
            self.remove_loading();
            self.finish(if panicked {
                FlightResult::Panicked
            } else {
                FlightResult::Abandoned
            });
        }
    }
}
