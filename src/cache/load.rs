//! The loading calls of the thread API (`get_or_load` and its variants, `get_with`,
//! `optionally_get_with`, `forget`) and the error they return, [`LoadError`].
//!
//! Each call is a short delegation to the load's lifecycle in the engine
//! (`engine/lifecycle.rs`): `Engine::begin` looks at the key until the caller has an answer
//! or leads the load, and the lead it gets runs the loader and concludes with the result
//! (`Lead::run`). What differs between the calls is only what is done with the lead.

use std::borrow::Borrow;
use std::convert::Infallible;
use std::hash::{BuildHasher, Hash};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::Cache;
use crate::engine::lifecycle::Begin;
use crate::error::LoadError;

/// What an `optionally_get_with` loader found: nothing. A private type, so that no other
/// caller's loader error is taken for it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Absent;

impl<E> LoadError<E> {
    /// This error, which is not `Failed`, as a `LoadError<Infallible>`.
    pub(crate) fn map_failed_never(self) -> LoadError<Infallible> {
        self.recast().expect("a failed load is handled before")
    }
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
        match self.inner.begin(key, None) {
            Begin::Done(r) => r,
            Begin::Lead(lead) => lead.run(loader, false),
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
        match self.inner.begin(key, deadline) {
            Begin::Done(r) => r,
            Begin::Lead(lead) => lead.run(loader, false),
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
        let lead = match self.inner.begin(key, None) {
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
                    let _ = lead.run(loader, true);
                }));
                Ok(current)
            }
            _ => lead.run(loader, false),
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
        match self.load_with(key, |k| Ok::<V, Infallible>(init(k)), "get_with") {
            Ok(v) => v,
            Err(never) => match *never {},
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
        self.load_with(key, |k| init(k).ok_or(Absent), "optionally_get_with")
            .ok()
    }

    /// What `get_with` and `optionally_get_with` share: the value for `key`, or `init`'s own
    /// error. `init` runs at most once, in a call that leads, which returns or unwinds (a
    /// call that looks again still holds it); a load that ended without a value for another
    /// reason is looked at again. `call` names the caller in the message of a broken promise.
    fn load_with<Q, E, F>(&self, key: &Q, init: F, call: &str) -> Result<V, Arc<E>>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
        F: FnOnce(&K) -> Result<V, E>,
        E: Send + Sync + 'static,
    {
        let mut init = Some(init);
        loop {
            let loaded = self.get_or_load(key, |k| match init.take() {
                Some(f) => f(k),
                None => unreachable!("{call}'s init ran in a call that then looked again"),
            });
            match loaded {
                Ok(v) => return Ok(v),
                Err(LoadError::Failed(e)) => return Err(e),
                Err(e) => Self::retry_infallible(e.map_failed_never()),
            }
        }
    }

    /// What `load_with` and `load_with_async` make of a load that ended without a value: a
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
        self.inner.forget(key)
    }
}
