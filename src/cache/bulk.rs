//! Bulk loads: many keys, one call to the source for those that miss.
//!
//! Each key is still one flight. A key found is a hit; a key another caller is loading is
//! joined (waited for), not loaded again; every other key gets a `Loading` entry of its own,
//! led by this call, and the call hands all of them to the batch loader at once. The batch's
//! result then ends each flight as a single load would: a value is published and reaches the
//! key's waiters (whoever they are: single-key callers that joined the batch's flight
//! included), an error reaches every waiter of every key of the batch, a panic gives them
//! `Panicked`, and a key the batch did not return is left to its waiters, which look again.
//! The miss path's waits are the driver's (`engine/lifecycle.rs`), so threads and futures
//! share it.

use std::borrow::Borrow;
use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::hash::{BuildHasher, Hash};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use super::Cache;
use crate::engine::lifecycle::{BatchLook, Joined, Lead, PermitWait, ThreadWaits, Waits};
use crate::error::LoadError;
use crate::flight::{Flight, FlightResult};
use crate::pacing::Permit;
use crate::stats::Counter;

impl<K, V, S> Cache<K, V, S>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
    S: BuildHasher,
{
    /// The values for `keys`; those that miss are loaded together, by one call of `loader`
    /// with all of them, each still one flight: a key another caller is loading is waited
    /// for, not loaded again, and a caller of [`get_or_load`](Self::get_or_load) that misses
    /// one of the batch's keys meanwhile waits for the batch (Caffeine's `getAll`).
    ///
    /// `loader` gets the keys to load and returns the values it found, as `(key, value)`
    /// pairs (a `Vec`, a `HashMap`...): each is cached as a load's value is, and a key it does
    /// not return is not in the result (nor cached; the callers waiting on that key look
    /// again). The result maps each requested key that has a value to it. An error of the
    /// loader reaches every caller waiting on the batch's keys, and this call returns it; a
    /// panic gives them [`LoadError::Panicked`] and goes on in this caller. `loader` runs
    /// again only for keys whose other loader ended without a value for them (it panicked,
    /// failed with another error type, or was cancelled).
    ///
    /// The batch is one load for [`max_concurrent_loads`](crate::CacheBuilder::max_concurrent_loads)
    /// (one permit), and each key's flight has the cache's
    /// [`load_timeout`](crate::CacheBuilder::load_timeout): past it, the callers waiting on a
    /// key are answered and the key is free for a new load, while the batch's late values
    /// are refused (the loader itself runs to its end, as a thread's loader does).
    ///
    /// ```
    /// use std::collections::HashMap;
    /// let cache: herdcache::Cache<u32, String> = herdcache::Cache::builder().max_capacity(100).build()?;
    /// cache.insert(1, "one".to_owned());
    /// // Keys 2, 3 and 4 miss: one query for them; 4 is not in the source.
    /// let got = cache.get_or_load_all([&1, &2, &3, &4], |ids| {
    ///     assert_eq!(ids, [2, 3, 4]);
    ///     let found = ids.iter().filter(|&&id| id != 4).map(|&id| (id, format!("#{id}")));
    ///     Ok::<_, std::io::Error>(found.collect::<Vec<_>>())
    /// })?;
    /// assert_eq!(got.len(), 3);
    /// assert_eq!(got[&2], "#2");
    /// assert!(!got.contains_key(&4));
    /// assert_eq!(cache.get(&3).as_deref(), Some("#3")); // cached
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn get_or_load_all<'q, Q, I, E, F, R>(
        &self,
        keys: I,
        mut loader: F,
    ) -> Result<HashMap<K, V>, LoadError<E>>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized + 'q,
        I: IntoIterator<Item = &'q Q>,
        F: FnMut(&[K]) -> Result<R, E>,
        R: IntoIterator<Item = (K, V)>,
        E: Send + Sync + 'static,
    {
        // A thread's waits block in place: the driver is ready when first polled.
        crate::spawn::block_on(self.load_all(
            keys,
            |keys| std::future::ready(loader(keys)),
            &mut ThreadWaits {
                deadline: None,
                permit_by: None,
            },
        ))
    }

    /// [`get_or_load_all`](Self::get_or_load_all) for futures: the batch loader is a future,
    /// awaited inline by this call (to its end, as a thread's loader runs to its end: past
    /// the keys' `load_timeout` their waiters are answered and the late values refused).
    /// Dropping this future while the batch loads cancels the batch: the callers waiting on
    /// its keys look again.
    ///
    /// ```
    /// # fn block_on<F: std::future::Future>(f: F) -> F::Output {
    /// #     use std::task::{Context, Poll, Waker};
    /// #     let mut f = std::pin::pin!(f);
    /// #     let mut cx = Context::from_waker(Waker::noop());
    /// #     loop { if let Poll::Ready(v) = f.as_mut().poll(&mut cx) { return v; } }
    /// # }
    /// let cache: herdcache::Cache<u32, u32> = herdcache::Cache::builder().max_capacity(100).build()?;
    /// let got = block_on(cache.get_or_load_all_async([&1, &2], |ids| {
    ///     let found: Vec<(u32, u32)> = ids.iter().map(|&id| (id, id * 10)).collect();
    ///     async move { Ok::<_, std::io::Error>(found) }
    /// }))?;
    /// assert_eq!((got[&1], got[&2]), (10, 20));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub async fn get_or_load_all_async<'q, Q, I, E, F, Fut, R>(
        &self,
        keys: I,
        loader: F,
    ) -> Result<HashMap<K, V>, LoadError<E>>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized + 'q,
        I: IntoIterator<Item = &'q Q>,
        F: FnMut(&[K]) -> Fut,
        Fut: Future<Output = Result<R, E>>,
        R: IntoIterator<Item = (K, V)>,
        E: Send + Sync + 'static,
    {
        let no_deadline = std::pin::pin!(None::<std::future::Pending<()>>);
        let mut waits = super::future::FutureWaits::new(no_deadline);
        self.load_all(keys, loader, &mut waits).await
    }

    /// The bulk miss path, waiting as `waits` does.
    async fn load_all<'q, Q, I, E, F, Fut, R, W>(
        &self,
        keys: I,
        mut loader: F,
        waits: &mut W,
    ) -> Result<HashMap<K, V>, LoadError<E>>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized + 'q,
        I: IntoIterator<Item = &'q Q>,
        F: FnMut(&[K]) -> Fut,
        Fut: Future<Output = Result<R, E>>,
        R: IntoIterator<Item = (K, V)>,
        E: Send + Sync + 'static,
        W: Waits<V>,
    {
        let mut out = HashMap::new();
        // Each key once: a key led twice would wait on itself.
        let mut seen = HashSet::new();
        let mut pending: Vec<(&'q Q, u64)> = keys
            .into_iter()
            .filter(|q| seen.insert(*q))
            .map(|q| (q, self.inner.hash(q)))
            .collect();
        drop(seen);
        while !pending.is_empty() {
            let mut joined = Vec::new();
            let mut misses = Vec::new();
            for (q, hash) in pending.drain(..) {
                match self.inner.look_for_batch::<Q, E>(q, hash, None) {
                    BatchLook::Hit(v) => {
                        out.insert(q.to_owned(), v);
                    }
                    BatchLook::Failed(e) => return Err(LoadError::Failed(e)),
                    BatchLook::Wait(flight) => joined.push((q, hash, flight)),
                    BatchLook::Miss => misses.push((q, hash)),
                    BatchLook::Lead(_) => unreachable!("a look without a flight leads nothing"),
                }
            }
            let mut leads = Vec::new();
            if !misses.is_empty() {
                // The batch is one load: one permit, held by its first flight.
                let mut permit = match self.inner.limiter() {
                    None => None,
                    Some(limiter) => match limiter.try_acquire() {
                        Some(p) => Some(p),
                        None => {
                            self.inner.pin().count(Counter::Throttled);
                            match waits.permit(limiter).await {
                                PermitWait::Got(p) => Some(p),
                                PermitWait::CallerDeadline => return Err(LoadError::Timeout),
                                PermitWait::LoadDeadline => return Err(LoadError::LoadTimedOut),
                            }
                        }
                    },
                };
                let deadline = permit.as_ref().and_then(Permit::deadline).or_else(|| {
                    self.inner
                        .settings()
                        .load_timeout
                        .and_then(|t| Instant::now().checked_add(t))
                });
                for (q, hash) in misses {
                    match self
                        .inner
                        .look_for_batch::<Q, E>(q, hash, Some((&mut permit, deadline)))
                    {
                        BatchLook::Hit(v) => {
                            out.insert(q.to_owned(), v);
                        }
                        BatchLook::Failed(e) => return Err(LoadError::Failed(e)),
                        BatchLook::Wait(flight) => joined.push((q, hash, flight)),
                        BatchLook::Lead(lead) => leads.push(lead),
                        BatchLook::Miss => unreachable!("a look with a flight leads a miss"),
                    }
                }
            }
            if !leads.is_empty() {
                self.load_batch(leads, &mut loader, &mut out).await?;
            }
            for (q, hash, flight) in joined {
                if flight.led_by_current_thread() {
                    return Err(LoadError::Recursive);
                }
                self.inner.pin().count(Counter::CoalescedWaits);
                match self.inner.await_flight(q, hash, &flight, waits).await {
                    Joined::Done(Ok(v)) => {
                        out.insert(q.to_owned(), v);
                    }
                    Joined::Done(Err(e)) => return Err(e),
                    Joined::Retry => pending.push((q, hash)),
                }
            }
        }
        Ok(out)
    }

    /// Runs the batch `loader` for the keys of `leads` and ends each key's flight with its
    /// result; the values go to `out`.
    async fn load_batch<E, F, Fut, R>(
        &self,
        mut leads: Vec<Lead<K, V, S>>,
        loader: &mut F,
        out: &mut HashMap<K, V>,
    ) -> Result<(), LoadError<E>>
    where
        F: FnMut(&[K]) -> Fut,
        Fut: Future<Output = Result<R, E>>,
        R: IntoIterator<Item = (K, V)>,
        E: Send + Sync + 'static,
    {
        let keys: Vec<K> = leads.iter().map(|l| l.key.clone()).collect();
        let started = self.inner.now();
        let flights: Vec<Arc<Flight<V>>> = leads.iter().map(|l| Arc::clone(&l.flight)).collect();
        let result = Leading {
            load: std::pin::pin!(loader(&keys)),
            flights: &flights,
        }
        .await;
        match result {
            Ok(found) => {
                let mut found: HashMap<K, V> = found.into_iter().collect();
                for lead in leads.drain(..) {
                    match found.remove(&lead.key) {
                        Some(v) => {
                            let key = lead.key.clone();
                            if let Ok(v) = lead.conclude_batch::<E>(started, Ok(v)) {
                                out.insert(key, v);
                            }
                        }
                        None => lead.abandon(),
                    }
                }
                Ok(())
            }
            Err(e) => {
                let e = Arc::new(e);
                for lead in leads.drain(..) {
                    let _ = lead.conclude_batch(started, Err(Arc::clone(&e)));
                }
                Err(LoadError::Failed(e))
            }
        }
    }
}

/// A batch loader's future, run as the leader of every flight of the batch: each poll marks
/// the polling thread as their leader while it runs, so that the loader asking for one of
/// its own keys gets `Recursive` instead of waiting for itself.
struct Leading<'a, F, V> {
    load: Pin<&'a mut F>,
    flights: &'a [Arc<Flight<V>>],
}

impl<F: Future, V> Future for Leading<'_, F, V> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        struct AfterPoll<'b, V>(&'b [Arc<Flight<V>>]);
        impl<V> Drop for AfterPoll<'_, V> {
            fn drop(&mut self) {
                self.0.iter().for_each(|f| f.clear_leader());
            }
        }
        let this = self.get_mut();
        this.flights.iter().for_each(|f| f.set_leader_here());
        let _after = AfterPoll(this.flights);
        this.load.as_mut().poll(cx)
    }
}

impl<K, V, S> Lead<K, V, S>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
    S: BuildHasher,
{
    /// Ends this load without a value and without an error: its `Loading` entry is removed
    /// and its waiters look again (a key a batch did not return).
    fn abandon(mut self) {
        self.remove_loading_as(crate::RemovalCause::Replaced);
        self.finish(FlightResult::Abandoned);
    }
}
