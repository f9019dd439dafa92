//! The miss path: single flight over the table.
//!
//! A caller that misses tries to install a `Loading` entry (holding a fresh [`Flight`] and a
//! fresh version) with one CAS on the key's slot; the winner leads the load, everyone who then
//! finds the `Loading` entry waits on its flight. The leader publishes its value only if the
//! slot still holds its `Loading` entry (same version), so an `insert`, `invalidate` or
//! `forget` during the load wins; then it completes the flight, which wakes every waiter. A
//! drop guard completes the flight with `Panicked` and removes the `Loading` entry if the
//! loader unwinds, so nothing is left waiting (DESIGN.md §4 invariants 2-4, §5).

use std::any::Any;
use std::borrow::Borrow;
use std::fmt;
use std::hash::{BuildHasher, Hash};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_epoch::Owned;

use crate::cache::Cache;
use crate::entry::{Entry, Kind};
use crate::flight::{Flight, FlightResult};
use crate::pacing::Permit;
use crate::policy::EvictionPolicy;
use crate::stats::Counter;
use crate::table::{Decision, Node, Outcome};

/// Why [`Cache::get_or_load`] returned no value.
#[derive(Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LoadError<E> {
    /// The loader returned this error (the same `Arc` for every caller that waited on the
    /// load, or a cached one under [`negative_ttl`](crate::CacheBuilder::negative_ttl)).
    Failed(Arc<E>),
    /// The loader panicked. The panic continued in the caller that ran the loader; the others
    /// get this error, and the next caller starts a fresh load.
    Panicked,
    /// The deadline passed before the load finished, and no expired value was kept to serve
    /// instead. The load carries on for the others.
    Timeout,
    /// The loader called back into the cache for the key it is loading; waiting on itself
    /// would never end.
    Recursive,
}

impl<E> Clone for LoadError<E> {
    fn clone(&self) -> Self {
        match self {
            LoadError::Failed(e) => LoadError::Failed(Arc::clone(e)),
            LoadError::Panicked => LoadError::Panicked,
            LoadError::Timeout => LoadError::Timeout,
            LoadError::Recursive => LoadError::Recursive,
        }
    }
}

impl<E: fmt::Display> fmt::Display for LoadError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LoadError::Failed(e) => write!(f, "loader failed: {e}"),
            LoadError::Panicked => f.write_str("loader panicked"),
            LoadError::Timeout => f.write_str("timed out waiting for the load"),
            LoadError::Recursive => f.write_str("loader re-entered the cache for its own key"),
        }
    }
}

impl<E: std::error::Error + 'static> std::error::Error for LoadError<E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            LoadError::Failed(e) => Some(&**e),
            _ => None,
        }
    }
}

/// What a caller that is not the leader makes of a finished flight.
enum Joined<V, E> {
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
    /// wakes, so later readers hit it. Errors are not cached unless
    /// [`negative_ttl`](crate::CacheBuilder::negative_ttl) is set.
    ///
    /// A loader that panics wakes every waiter with [`LoadError::Panicked`] and its panic
    /// continues in this caller. A loader that calls back into this cache for the same key gets
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
    pub fn get_or_load<E, F>(&self, key: &K, loader: F) -> Result<V, LoadError<E>>
    where
        F: FnOnce(&K) -> Result<V, E>,
        E: Send + Sync + 'static,
    {
        self.load_with_deadline(key, None, loader)
    }

    /// Like [`get_or_load`](Self::get_or_load), but a caller that has to wait for another
    /// caller's load waits at most `timeout`.
    ///
    /// When the deadline passes first, it returns the expired value the load is replacing if
    /// one was kept, else [`LoadError::Timeout`]; the load carries on and its result is cached
    /// and delivered to the callers still waiting. A caller that leads the load runs the loader
    /// to completion (the deadline bounds waiting, not loading).
    pub fn get_or_load_timeout<E, F>(
        &self,
        key: &K,
        timeout: Duration,
        loader: F,
    ) -> Result<V, LoadError<E>>
    where
        F: FnOnce(&K) -> Result<V, E>,
        E: Send + Sync + 'static,
    {
        // A timeout too long to represent is no deadline at all.
        let deadline = Instant::now().checked_add(timeout);
        self.load_with_deadline(key, deadline, loader)
    }

    /// Detaches the load of `key` in progress, if any: callers from now on start a new load,
    /// and the detached load's result goes to its own waiters but is not cached. Returns
    /// whether a load was detached.
    pub fn forget<Q>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let pinned = self.inner.domain.pin();
        let hash = self.inner.hasher.hash_one(key);
        let decide = |cur: Option<&Node<K, Entry<V>>>| match cur {
            Some(n) if matches!(n.value.kind, Kind::Loading(_)) => Decision::Remove,
            _ => Decision::Keep,
        };
        let outcome =
            self.inner
                .table
                .update(hash, |k| k.borrow() == key, None, decide, &pinned.guard);
        matches!(outcome, Outcome::Removed(_))
    }

    fn load_with_deadline<E, F>(
        &self,
        key: &K,
        deadline: Option<Instant>,
        loader: F,
    ) -> Result<V, LoadError<E>>
    where
        F: FnOnce(&K) -> Result<V, E>,
        E: Send + Sync + 'static,
    {
        let hash = self.inner.hasher.hash_one(key);
        // A load permit obtained by waiting, kept across a retry.
        let mut held = None;
        loop {
            let pinned = self.inner.domain.pin();
            let current = self.inner.table.get(hash, |k| k == key, &pinned.guard);
            // What a load started now replaces: the previous value with its hard expiry, and
            // the previous entry's load-time estimate and refresh failures.
            let mut replaced: Option<(V, u64)> = None;
            let mut history = (0, 0);
            let mut refresh = false;
            let mut current_value = None;
            if let Some(node) = current {
                let entry = &node.value;
                let now = OnceNow::new(self);
                match &entry.kind {
                    Kind::Ready(r) => {
                        history = (r.refresh.delta, r.refresh.failures);
                        if let Some(v) = entry.live_value(|| now.get()) {
                            self.inner.policy.on_hit(&entry.policy);
                            pinned.count(Counter::Hits);
                            let due = self.inner.refresh.active()
                                && self.inner.refresh.due(
                                    &r.refresh,
                                    now.get(),
                                    r.expires_at,
                                    crate::rng::unit_open_closed,
                                );
                            if !due || !r.refresh.try_claim() {
                                return Ok(v.clone());
                            }
                            refresh = true;
                            current_value = Some((v.clone(), &r.refresh));
                        }
                        replaced = Some((r.value.clone(), r.expires_at));
                    }
                    Kind::Loading(flight) => {
                        if let Some(v) = flight.serving(|| now.get()) {
                            // A refresh is in progress: the current value is still valid.
                            self.inner.policy.on_hit(&entry.policy);
                            pinned.count(Counter::Hits);
                            return Ok(v.clone());
                        }
                        let flight = Arc::clone(flight);
                        pinned.count(Counter::Misses);
                        drop(pinned);
                        match self.join(&flight, deadline) {
                            Joined::Done(r) => return r,
                            Joined::Retry => continue,
                        }
                    }
                    Kind::Failed { error, .. } => {
                        if !entry.is_expired(|| now.get()) {
                            if let Some(e) = downcast::<E>(error) {
                                pinned.count(Counter::Misses);
                                return Err(LoadError::Failed(e));
                            }
                        }
                    }
                }
            }
            if !refresh {
                pinned.count(Counter::Misses);
            }

            // Admission control: take a load permit before leading.
            let permit = match &self.inner.limiter {
                None => None,
                Some(limiter) => match held.take().or_else(|| limiter.try_acquire()) {
                    Some(p) => Some(p),
                    None => {
                        pinned.count(Counter::Throttled);
                        if let Some((v, state)) = current_value {
                            state.unclaim(); // skip this refresh; a later read retries it
                            return Ok(v);
                        }
                        if let Some((stale, _)) = replaced {
                            return Ok(stale);
                        }
                        drop(pinned);
                        match limiter.acquire(deadline) {
                            Some(p) => {
                                // The key may have changed while we waited: look again.
                                held = Some(p);
                                continue;
                            }
                            None => {
                                self.inner.domain.pin().count(Counter::Timeouts);
                                return Err(LoadError::Timeout);
                            }
                        }
                    }
                },
            };

            // Try to lead: replace exactly what we saw (nothing, a value, or a cached error)
            // with our `Loading` entry. The version comparison, not the address, says
            // "unchanged".
            let seen = current.map(|n| n.value.version);
            let version = self.next_version();
            let flight = Arc::new(Flight::new(replaced));
            let loading = Entry::loading(version, Arc::clone(&flight));
            let node = Owned::new(Node::new(hash, key.clone(), loading));
            let decide = |cur: Option<&Node<K, Entry<V>>>| {
                if cur.map(|n| n.value.version) == seen {
                    Decision::Put
                } else {
                    Decision::Keep
                }
            };
            let outcome =
                self.inner
                    .table
                    .update(hash, |k| k == key, Some(node), decide, &pinned.guard);
            match outcome {
                Outcome::Inserted(_) => {}
                Outcome::Replaced(old, _) => {
                    if !refresh && old.value.is_expired(|| self.now()) {
                        pinned.count(Counter::Expirations);
                    }
                }
                // Someone changed the key first: look again.
                _ => continue,
            }
            pinned.count(Counter::Loads);
            if refresh {
                pinned.count(Counter::Refreshes);
            }
            // Never hold a pin across user code that may take long: it would hold back
            // reclamation for every thread.
            drop(pinned);
            let lead = Lead {
                cache: self,
                key,
                hash,
                version,
                flight,
                finished: false,
                _permit: permit,
            };
            return self.lead(lead, history, loader);
        }
    }

    /// Waits on a flight led by another caller.
    fn join<E: Send + Sync + 'static>(
        &self,
        flight: &Flight<V>,
        deadline: Option<Instant>,
    ) -> Joined<V, E> {
        let count = |c| self.inner.domain.pin().count(c);
        if flight.led_by_current_thread() {
            return Joined::Done(Err(LoadError::Recursive));
        }
        count(Counter::CoalescedWaits);
        match flight.wait(deadline) {
            Some(FlightResult::Value(v)) => Joined::Done(Ok(v.clone())),
            Some(FlightResult::Failed(e)) => match downcast::<E>(e) {
                Some(e) => Joined::Done(Err(LoadError::Failed(e))),
                None => Joined::Retry,
            },
            Some(FlightResult::Panicked) => Joined::Done(Err(LoadError::Panicked)),
            None => {
                count(Counter::Timeouts);
                Joined::Done(flight.stale().cloned().ok_or(LoadError::Timeout))
            }
        }
    }

    /// Runs the loader as the flight's leader and finishes the flight on every path out.
    /// `history` is the replaced entry's load-time estimate and failed-refresh count.
    fn lead<E, F>(
        &self,
        mut lead: Lead<'_, K, V, S>,
        history: (u64, u32),
        loader: F,
    ) -> Result<V, LoadError<E>>
    where
        F: FnOnce(&K) -> Result<V, E>,
        E: Send + Sync + 'static,
    {
        let key = lead.key;
        // Measured with the cache's clock, so a manual clock drives XFetch's delta in tests.
        let started = self.now();
        let result = loader(key);
        let finished = self.now();
        let (previous_delta, failures) = history;
        match result {
            Ok(value) => {
                let delta = crate::refresh::next_delta(previous_delta, finished - started);
                let expires_at = self.default_expiry();
                lead.replace_loading(|| self.ready_entry(value.clone(), expires_at, delta, 0));
                lead.finish(FlightResult::Value(value.clone()));
                Ok(value)
            }
            Err(error) => {
                let error = Arc::new(error);
                let erased: Arc<dyn Any + Send + Sync> = error.clone();
                let pinned = self.inner.domain.pin();
                pinned.count(Counter::LoadErrors);
                // Stale-if-error: a failed refresh of a still-valid value puts that value
                // back, with a backoff before the next attempt.
                let keep = lead
                    .flight
                    .serving(|| finished)
                    .filter(|_| self.inner.refresh.stale_if_error)
                    .cloned();
                if let Some(old) = keep {
                    let until = lead.flight.stale_valid_until();
                    let entry =
                        || self.ready_entry(old.clone(), until, previous_delta, failures + 1);
                    lead.replace_loading(entry);
                    pinned.count(Counter::RefreshFailures);
                    drop(pinned);
                    lead.finish(FlightResult::Value(old.clone()));
                    return Ok(old);
                }
                match self.inner.negative_ttl {
                    Some(ttl) => {
                        let expires_at = finished.saturating_add(ttl);
                        let entry =
                            || Entry::failed(self.next_version(), Arc::clone(&erased), expires_at);
                        lead.replace_loading(entry);
                    }
                    None => lead.remove_loading(),
                }
                drop(pinned);
                lead.finish(FlightResult::Failed(erased));
                Err(LoadError::Failed(error))
            }
        }
    }
}

/// Reads the cache's clock at most once, on first use.
struct OnceNow<'a, K, V, S> {
    cache: &'a Cache<K, V, S>,
    now: std::cell::Cell<Option<u64>>,
}

impl<'a, K, V, S> OnceNow<'a, K, V, S>
where
    K: Hash + Eq + Send + Sync + 'static,
    V: Send + Sync + 'static,
    S: BuildHasher,
{
    fn new(cache: &'a Cache<K, V, S>) -> Self {
        OnceNow {
            cache,
            now: std::cell::Cell::new(None),
        }
    }

    fn get(&self) -> u64 {
        match self.now.get() {
            Some(n) => n,
            None => {
                let n = self.cache.now();
                self.now.set(Some(n));
                n
            }
        }
    }
}

/// The leader's obligations for one flight; its drop finishes the flight if the loader
/// unwound.
struct Lead<'a, K, V, S>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
    S: BuildHasher,
{
    cache: &'a Cache<K, V, S>,
    key: &'a K,
    hash: u64,
    /// The version of our `Loading` entry.
    version: u64,
    flight: Arc<Flight<V>>,
    finished: bool,
    /// Released after the flight is finished (fields drop after `Drop::drop`).
    _permit: Option<Permit<'a>>,
}

impl<K, V, S> Lead<'_, K, V, S>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
    S: BuildHasher,
{
    /// Replaces our `Loading` entry with `make()` if the slot still holds it; returns whether
    /// it did (it did not if an insert, invalidation or forget came first).
    fn replace_loading(&self, make: impl FnOnce() -> Entry<V>) -> bool {
        let cache = self.cache;
        let pinned = cache.inner.domain.pin();
        let node = Owned::new(Node::new(self.hash, self.key.clone(), make()));
        let ours = |cur: Option<&Node<K, Entry<V>>>| match cur {
            Some(n) if n.value.version == self.version => Decision::Put,
            _ => Decision::Keep,
        };
        let outcome = cache.inner.table.update(
            self.hash,
            |k| k == self.key,
            Some(node),
            ours,
            &pinned.guard,
        );
        let replaced = matches!(outcome, Outcome::Replaced(..));
        if replaced {
            pinned.count(Counter::Inserts);
            cache.evict_if_over_capacity(&pinned);
        }
        replaced
    }

    /// Removes our `Loading` entry if the slot still holds it.
    fn remove_loading(&self) {
        let pinned = self.cache.inner.domain.pin();
        let ours = |cur: Option<&Node<K, Entry<V>>>| match cur {
            Some(n) if n.value.version == self.version => Decision::Remove,
            _ => Decision::Keep,
        };
        self.cache
            .inner
            .table
            .update(self.hash, |k| k == self.key, None, ours, &pinned.guard);
    }

    /// Completes the flight (after the table has been updated, so that a woken waiter and
    /// every later reader see the same state).
    fn finish(&mut self, result: FlightResult<V>) {
        self.finished = true;
        // SAFETY: `Lead` exists once per flight, held by its leader, and `finished` makes this
        // the only completion.
        unsafe { self.flight.complete(result) };
    }
}

impl<K, V, S> Drop for Lead<'_, K, V, S>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
    S: BuildHasher,
{
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        // The loader (or a clone of its value) unwound. Removing the entry runs only our own
        // code and the key's `Eq`; the panic continues once this returns.
        self.remove_loading();
        self.cache.inner.domain.pin().count(Counter::LoadPanics);
        self.finish(FlightResult::Panicked);
    }
}
