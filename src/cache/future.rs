//! The miss path for futures: the same driver as the threads' (`engine/lifecycle.rs`), with
//! waits that yield to the executor (a waker registered on the flight, see `flight.rs`, or
//! in the limiter's queue) instead of parking a thread. Threads and futures meet on one flight per
//! key, so sync and async callers of a key share one load.
//!
//! # Cancellation
//! Dropping a waiting future deregisters it; the load goes on for the others. A load led
//! inline (`get_or_load_async`) lives in its leader's future, so dropping that future drops
//! the load with it, and the flight completes as abandoned: nothing is cached, and every
//! waiter, thread or future, looks at the key again, so the first of them to do so leads a
//! new load. If no caller is left, nothing more happens until the next read of the key starts
//! a fresh load.
//!
//! A load handed to the task spawner (`get_or_load_spawned`, see `spawn.rs`) is owned by its
//! task, not by a caller: the caller that started it waits on its flight like everyone else,
//! so dropping any caller's future leaves the load running, and it is cached even if every
//! caller is gone. Only dropping the task itself (a runtime shutting down) cancels it, with
//! the same abandoned flight as above; the caller that handed it over gets
//! `LoadError::Cancelled`, since its loader went with the task.

use std::borrow::Borrow;
use std::convert::Infallible;
use std::future::Future;
use std::hash::{BuildHasher, Hash};
use std::pin::{pin, Pin};
use std::sync::Arc;
use std::task::{Context, Poll};

use super::load::Absent;
use super::Cache;
use crate::engine::lifecycle::{Begin, Joined, Lead, PermitWait, Waits};
use crate::error::LoadError;
use crate::flight::{Flight, FlightResult, Subscription};
use crate::pacing::{Limiter, Queued};
use crate::sync::{AtomicBool, Ordering};
use crate::timer::{OrDeadline, Sleep};

impl<K, V, S> Cache<K, V, S>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
    S: BuildHasher,
{
    /// The value for `key`; on a miss, loads it by awaiting `loader`'s future exactly once
    /// however many callers, futures or threads, miss together.
    ///
    /// The future that finds the key missing first runs the load inline; every other caller
    /// for the key waits (a future without blocking its executor thread, a thread parked)
    /// and receives the same value or the same error. The contract is that of
    /// [`get_or_load`](Self::get_or_load): the value is cached before any waiter wakes, a
    /// loader that panics gives every waiter [`LoadError::Panicked`], and early refresh
    /// (XFetch, soft TTL) runs inline in the future that wins it.
    ///
    /// Cancellation: dropping this future while it waits leaves the load running for the
    /// others. Dropping it while it leads the load (its loader future is running) cancels the
    /// load: nothing is cached, and the callers waiting on it look at the key again, so one of
    /// them leads a new load. The next caller starts a fresh load if none is waiting.
    ///
    /// This future is runtime-agnostic: it needs no executor features. A loader future that
    /// asks this cache for its own key (by any call, awaited from inside its polls) gets
    /// [`LoadError::Recursive`] there instead of waiting for itself.
    ///
    /// ```
    /// # fn block_on<F: std::future::Future>(f: F) -> F::Output {
    /// #     use std::task::{Context, Poll, Waker};
    /// #     let mut f = std::pin::pin!(f);
    /// #     let mut cx = Context::from_waker(Waker::noop());
    /// #     loop { if let Poll::Ready(v) = f.as_mut().poll(&mut cx) { return v; } }
    /// # }
    /// let cache = herdcache::Cache::builder().max_capacity(100).build()?;
    /// let v = block_on(cache.get_or_load_async(&7u32, |k| {
    ///     let k = *k;
    ///     async move { Ok::<_, std::io::Error>(k * 2) }
    /// }));
    /// assert_eq!(v.unwrap(), 14);
    /// assert_eq!(cache.get(&7), Some(14));
    /// # Ok::<(), herdcache::BuildError>(())
    /// ```
    pub async fn get_or_load_async<Q, E, F, Fut>(
        &self,
        key: &Q,
        loader: F,
    ) -> Result<V, LoadError<E>>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
        F: FnOnce(&K) -> Fut,
        Fut: Future<Output = Result<V, E>>,
        E: Send + Sync + 'static,
    {
        self.load_async(
            key,
            None::<std::future::Pending<()>>,
            loader,
            Handoff::Inline,
        )
        .await
    }

    /// The value for `key`; on a miss, computes it with `init`'s future, once however many
    /// callers, futures or threads, miss together: [`get_with`](Self::get_with) for futures,
    /// or [`get_or_load_async`](Self::get_or_load_async) for a loader that cannot fail.
    ///
    /// A [`load_timeout`](crate::CacheBuilder::load_timeout) does not cut off the init
    /// future this call leads, since this call must return a value: at the deadline the load
    /// is detached as any load is (its waiters are answered, its permit returned, the next
    /// caller loads afresh), and this call goes on awaiting `init` and returns its value,
    /// which is then not cached. (Waiters of another caller's load past its deadline look
    /// again, and may lead a load themselves.)
    ///
    /// # Panics
    ///
    /// As [`get_with`](Self::get_with): if `init`'s future panics, or if it awaits this cache
    /// for the key it is computing.
    ///
    /// ```
    /// # fn block_on<F: std::future::Future>(f: F) -> F::Output {
    /// #     use std::task::{Context, Poll, Waker};
    /// #     let mut f = std::pin::pin!(f);
    /// #     let mut cx = Context::from_waker(Waker::noop());
    /// #     loop { if let Poll::Ready(v) = f.as_mut().poll(&mut cx) { return v; } }
    /// # }
    /// let cache = herdcache::Cache::builder().max_capacity(100).build()?;
    /// let len = block_on(cache.get_with_async("four", |k: &String| {
    ///     let n = k.len();
    ///     async move { n }
    /// }));
    /// assert_eq!(len, 4);
    /// # Ok::<(), herdcache::BuildError>(())
    /// ```
    pub async fn get_with_async<Q, F, Fut>(&self, key: &Q, init: F) -> V
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
        F: FnOnce(&K) -> Fut,
        Fut: Future<Output = V>,
    {
        let init = |k: &K| {
            let fut = init(k);
            async move { Ok::<V, Infallible>(fut.await) }
        };
        match self.load_with_async(key, init, "get_with_async").await {
            Ok(v) => v,
            Err(never) => match *never {},
        }
    }

    /// The value for `key`; on a miss, computes it with `init`'s future, which may find
    /// nothing (then nothing is cached, unless `negative_ttl` caches the absence) and the
    /// call returns `None`: [`optionally_get_with`](Self::optionally_get_with) for futures,
    /// following the rules of [`get_with_async`](Self::get_with_async).
    ///
    /// # Panics
    ///
    /// As [`get_with_async`](Self::get_with_async).
    ///
    /// ```
    /// # fn block_on<F: std::future::Future>(f: F) -> F::Output {
    /// #     use std::task::{Context, Poll, Waker};
    /// #     let mut f = std::pin::pin!(f);
    /// #     let mut cx = Context::from_waker(Waker::noop());
    /// #     loop { if let Poll::Ready(v) = f.as_mut().poll(&mut cx) { return v; } }
    /// # }
    /// let cache: herdcache::Cache<u32, String> = herdcache::Cache::builder().max_capacity(100).build()?;
    /// let found = block_on(cache.optionally_get_with_async(&1, |id| {
    ///     let id = *id;
    ///     async move { (id == 1).then(|| "Ada".to_owned()) }
    /// }));
    /// assert_eq!(found.as_deref(), Some("Ada"));
    /// let missing = block_on(cache.optionally_get_with_async(&2, |_| async { None }));
    /// assert_eq!(missing, None);
    /// # Ok::<(), herdcache::BuildError>(())
    /// ```
    pub async fn optionally_get_with_async<Q, F, Fut>(&self, key: &Q, init: F) -> Option<V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
        F: FnOnce(&K) -> Fut,
        Fut: Future<Output = Option<V>>,
    {
        let init = |k: &K| {
            let fut = init(k);
            async move { fut.await.ok_or(Absent) }
        };
        self.load_with_async(key, init, "optionally_get_with_async")
            .await
            .ok()
    }

    /// What `get_with_async` and `optionally_get_with_async` share, as `load_with` for
    /// threads: `init`'s future is made at most once, in a call that leads, and runs to its
    /// end (past a `load_timeout` too); a load that ended without a value for another reason
    /// than `init`'s own error is looked at again.
    async fn load_with_async<Q, E, F, Fut>(
        &self,
        key: &Q,
        init: F,
        call: &'static str,
    ) -> Result<V, Arc<E>>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
        F: FnOnce(&K) -> Fut,
        Fut: Future<Output = Result<V, E>>,
        E: Send + Sync + 'static,
    {
        let mut init = Some(init);
        loop {
            let loader = |k: &K| {
                let fut = init.take().map(|f| f(k));
                async move {
                    match fut {
                        Some(fut) => fut.await,
                        None => unreachable!("{call}'s init ran in a call that then looked again"),
                    }
                }
            };
            let loaded = self
                .load_async(
                    key,
                    None::<std::future::Pending<()>>,
                    loader,
                    Handoff::ToTheEnd,
                )
                .await;
            match loaded {
                Ok(v) => return Ok(v),
                Err(LoadError::Failed(e)) => return Err(e),
                Err(e) => Self::retry_infallible(e.map_failed_never()),
            }
        }
    }

    /// Like [`get_or_load_async`](Self::get_or_load_async), but a caller that has to wait for
    /// another caller's load (or for a load permit) gives up when `deadline` completes: pass
    /// your runtime's timer, e.g. `tokio::time::sleep(Duration::from_millis(50))`.
    ///
    /// When the deadline comes first it returns the expired value the load is replacing if one
    /// was kept, else [`LoadError::Timeout`]; the load carries on for the others. A caller that
    /// leads the load runs it to completion (the deadline bounds waiting, not loading). The
    /// deadline future is polled only while the caller waits.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() -> Result<(), herdcache::BuildError> {
    /// use std::time::Duration;
    /// use tokio::time::sleep;
    /// let cache: herdcache::Cache<u32, u32> = herdcache::Cache::builder().max_capacity(100).build()?;
    /// let other = cache.clone();
    /// tokio::spawn(async move {
    ///     let slow = |_: &u32| async { sleep(Duration::from_secs(5)).await; Ok::<_, ()>(1) };
    ///     other.get_or_load_async(&1, slow).await // leads a slow load of key 1
    /// });
    /// tokio::task::yield_now().await;
    /// let deadline = sleep(Duration::from_millis(50));
    /// let r = cache.get_or_load_async_until(&1, deadline, |_| async { Ok::<_, ()>(2) }).await;
    /// assert_eq!(r, Err(herdcache::LoadError::Timeout)); // the load goes on for the others
    /// # Ok(())
    /// # }
    /// ```
    pub async fn get_or_load_async_until<Q, E, F, Fut, D>(
        &self,
        key: &Q,
        deadline: D,
        loader: F,
    ) -> Result<V, LoadError<E>>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
        F: FnOnce(&K) -> Fut,
        Fut: Future<Output = Result<V, E>>,
        E: Send + Sync + 'static,
        D: Future<Output = ()>,
    {
        self.load_async(key, Some(deadline), loader, Handoff::Inline)
            .await
    }

    /// The value for `key`; on a miss, loads it with `loader`'s future as a task on the
    /// cache's [`Spawner`](crate::Spawner), exactly once however many
    /// callers, futures or threads, miss together.
    ///
    /// The load is detached from the caller that starts it: that caller waits for it like
    /// every other, so dropping its future (a timeout, an aborted task) cancels nobody's load.
    /// The load runs to the end, is cached, and reaches every caller still waiting. An early
    /// refresh (XFetch, soft TTL) that this call wins also runs on the spawner, and the call
    /// returns the current value at once: no reader waits for a refresh.
    ///
    /// A loader that panics gives every caller, this one included, [`LoadError::Panicked`]
    /// (the panic is the task's). If the spawner drops the task before it finishes, this call
    /// returns [`LoadError::Cancelled`], nothing is cached and the callers waiting on the load
    /// look at the key again. A cache built without a spawner returns
    /// [`LoadError::NoSpawner`] at once, hit or miss: without one the load could not outlive
    /// this call, which is what the call promises (use
    /// [`get_or_load_async`](Self::get_or_load_async) to load inline).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let cache: herdcache::Cache<u32, String> = herdcache::Cache::builder()
    ///     .max_capacity(100)
    ///     .spawner(herdcache::TokioSpawner::current().expect("in a runtime"))
    ///     .build()?;
    /// let v = cache
    ///     .get_or_load_spawned(&7, |k| {
    ///         let k = *k;
    ///         async move { Ok::<_, std::io::Error>(format!("value {k}")) }
    ///     })
    ///     .await?;
    /// assert_eq!(v, "value 7");
    /// # Ok(())
    /// # }
    /// ```
    pub async fn get_or_load_spawned<Q, E, F, Fut>(
        &self,
        key: &Q,
        loader: F,
    ) -> Result<V, LoadError<E>>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
        F: FnOnce(&K) -> Fut + Send + 'static,
        Fut: Future<Output = Result<V, E>> + Send + 'static,
        E: Send + Sync + 'static,
        S: Send + Sync + 'static,
    {
        if self.inner.settings().spawner.is_none() {
            return Err(LoadError::NoSpawner);
        }
        self.load_async(key, None::<std::future::Pending<()>>, loader, |lead, f| {
            self.spawn_lead(lead, f)
        })
        .await
    }

    /// Like [`get_or_load_spawned`](Self::get_or_load_spawned), but the caller waits for the
    /// load (its own spawned one included) or for a load permit only until `deadline`
    /// completes. It then returns the expired value the load is replacing if one was kept,
    /// else [`LoadError::Timeout`]; the load carries on and is cached.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() -> Result<(), herdcache::BuildError> {
    /// use std::time::Duration;
    /// use tokio::time::sleep;
    /// let cache: herdcache::Cache<u32, u32> = herdcache::Cache::builder()
    ///     .max_capacity(100)
    ///     .spawner(herdcache::TokioSpawner::current().expect("in a runtime"))
    ///     .build()?;
    /// let slow = |_: &u32| async { sleep(Duration::from_secs(5)).await; Ok::<_, ()>(1) };
    /// let r = cache.get_or_load_spawned_until(&1, sleep(Duration::from_secs(1)), slow).await;
    /// assert_eq!(r, Err(herdcache::LoadError::Timeout));
    /// sleep(Duration::from_secs(5)).await;
    /// assert_eq!(cache.get(&1), Some(1)); // the spawned load finished, and was cached
    /// # Ok(())
    /// # }
    /// ```
    pub async fn get_or_load_spawned_until<Q, E, F, Fut, D>(
        &self,
        key: &Q,
        deadline: D,
        loader: F,
    ) -> Result<V, LoadError<E>>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
        F: FnOnce(&K) -> Fut + Send + 'static,
        Fut: Future<Output = Result<V, E>> + Send + 'static,
        E: Send + Sync + 'static,
        S: Send + Sync + 'static,
        D: Future<Output = ()>,
    {
        if self.inner.settings().spawner.is_none() {
            return Err(LoadError::NoSpawner);
        }
        self.load_async(key, Some(deadline), loader, |lead, f| {
            self.spawn_lead(lead, f)
        })
        .await
    }

    /// Hands a won load to the task spawner, if the cache has one.
    fn spawn_lead<E, F, Fut>(&self, lead: Lead<K, V, S>, loader: F) -> Handoff<K, V, S, F>
    where
        F: FnOnce(&K) -> Fut + Send + 'static,
        Fut: Future<Output = Result<V, E>> + Send + 'static,
        E: Send + Sync + 'static,
        S: Send + Sync + 'static,
    {
        let Some(spawner) = &self.inner.settings().spawner else {
            return Handoff::Inline(lead, loader);
        };
        // A refresh: the value it replaces is still valid, and is this caller's answer.
        let current = lead.flight.serving(|| self.inner.now()).cloned();
        let flight = Arc::clone(&lead.flight);
        // No thread runs the loader until the task starts: a read of this key on our thread
        // meanwhile must wait for it, not be taken for re-entry.
        lead.flight.clear_leader();
        spawner.spawn(crate::LoadTask::new(async move {
            let _ = Self::lead_async(lead, loader, Start::Queued).await;
        }));
        Handoff::Spawned { flight, current }
    }

    /// Runs the loader future as the flight's leader and finishes the flight on every path
    /// out (a panic or a drop mid-load included, through `Lead`'s drop).
    async fn lead_async<E, F, Fut>(
        lead: Lead<K, V, S>,
        loader: F,
        start: Start,
    ) -> Result<V, LoadError<E>>
    where
        F: FnOnce(&K) -> Fut,
        Fut: Future<Output = Result<V, E>>,
        E: Send + Sync + 'static,
    {
        // No thread runs the loader between its polls: the future may move between threads.
        // Each poll marks its thread as the leader while it runs (`CatchPanic`), so that the
        // loader asking for its own key, during a poll, is seen as the re-entry it is.
        lead.flight.clear_leader();
        if start == Start::Queued && lead.stale_before_start() {
            return lead.time_out();
        }
        let started = lead.engine.now();
        // The load's own deadline: past it, the loader future is dropped (at the end of this
        // block, before the flight is detached), or, to the end, the flight is detached and
        // the loader future goes on for this caller alone.
        let sleep = lead.flight.deadline().map(Sleep::until);
        let to_the_end = start == Start::NowToTheEnd;
        let outcome = {
            let load = pin!(loader(&lead.key));
            let load = CatchPanic {
                load,
                panicked: &lead.panicked,
                flight: &lead.flight,
            };
            #[cfg(feature = "redis")]
            let tier = match lead.engine.shared() {
                Some(tier) if !on_tokio() => {
                    // Not silently: counted, and logged once per tier.
                    lead.engine
                        .pin()
                        .count(crate::stats::Counter::SharedSkipped);
                    tier.skipped_off_tokio();
                    None
                }
                tier => tier,
            };
            #[cfg(not(feature = "redis"))]
            let tier: Option<std::convert::Infallible> = None;
            match tier {
                #[cfg(feature = "redis")]
                Some(tier) => {
                    let count = lead.engine.counting();
                    let fetched =
                        pin!(tier.load_async(&lead.key, lead.shared_plan(), &count, load));
                    lead.until_deadline(fetched, sleep, to_the_end)
                        .await
                        .map(Settled::Shared)
                }
                #[cfg(not(feature = "redis"))]
                Some(never) => match never {},
                None => lead
                    .until_deadline(load, sleep, to_the_end)
                    .await
                    .map(Settled::Local),
            }
        };
        match outcome {
            Some(Settled::Local(result)) => lead.conclude(started, result),
            #[cfg(feature = "redis")]
            Some(Settled::Shared(fetched)) => lead.conclude_from_tier(started, fetched),
            None => lead.time_out(),
        }
    }

    /// The futures' miss path; `hand_off` says whether a load this caller wins runs inline or
    /// on the task spawner.
    async fn load_async<Q, E, F, Fut, D>(
        &self,
        key: &Q,
        deadline: Option<D>,
        loader: F,
        hand_off: impl FnOnce(Lead<K, V, S>, F) -> Handoff<K, V, S, F>,
    ) -> Result<V, LoadError<E>>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
        F: FnOnce(&K) -> Fut,
        Fut: Future<Output = Result<V, E>>,
        E: Send + Sync + 'static,
        D: Future<Output = ()>,
    {
        let hash = self.inner.hash(key);
        let deadline = pin!(deadline);
        let mut waits = FutureWaits::new(deadline);
        let begin = match self.inner.first_look(key, hash) {
            Ok(begin) => begin,
            Err(wait) => self.inner.drive(key, hash, wait, &mut waits).await,
        };
        let lead = match begin {
            Begin::Done(r) => return r,
            Begin::Lead(lead) => lead,
        };
        match hand_off(lead, loader) {
            Handoff::Inline(lead, f) => Self::lead_async(lead, f, Start::Now).await,
            Handoff::ToTheEnd(lead, f) => Self::lead_async(lead, f, Start::NowToTheEnd).await,
            Handoff::Spawned {
                current: Some(v), ..
            } => Ok(v),
            Handoff::Spawned { flight, .. } => {
                match self
                    .inner
                    .await_flight(key, hash, &flight, &mut waits)
                    .await
                {
                    Joined::Done(r) => r,
                    // Our own task was dropped unfinished (the only way our load retries);
                    // its loader went with it.
                    Joined::Retry => Err(LoadError::Cancelled),
                }
            }
        }
    }
}

/// A future's waits: it yields to its executor until the caller's deadline future completes.
pub(crate) struct FutureWaits<'d, D> {
    deadline: Pin<&'d mut Option<D>>,
    /// When its waits for a permit end at the latest (set by the first such wait).
    permit_by: Option<std::time::Instant>,
}

impl<'d, D> FutureWaits<'d, D> {
    /// Waits until `deadline` completes (for ever without one).
    pub(crate) fn new(deadline: Pin<&'d mut Option<D>>) -> Self {
        FutureWaits {
            deadline,
            permit_by: None,
        }
    }
}

impl<V, D: Future<Output = ()>> Waits<V> for FutureWaits<'_, D> {
    async fn flight<'f>(&mut self, flight: &'f Flight<V>) -> Option<&'f FlightResult<V>> {
        Waiting {
            flight,
            sub: flight.subscribe(),
            deadline: self.deadline.as_mut(),
            load_deadline: flight.deadline().map(Sleep::until),
        }
        .await
    }

    async fn published<'f>(&mut self, flight: &'f Flight<V>) -> Option<&'f FlightResult<V>> {
        Some(
            Published {
                flight,
                sub: flight.subscribe(),
            }
            .await,
        )
    }

    async fn permit(&mut self, limiter: &Arc<Limiter>) -> PermitWait {
        if self.permit_by.is_none() {
            self.permit_by = crate::engine::lifecycle::permit_deadline(limiter);
        }
        Acquiring {
            limiter,
            queued: Queued::default(),
            reclaim: None,
            deadline: self.deadline.as_mut(),
            load_deadline: self.permit_by.map(Sleep::until),
        }
        .await
    }
}

/// A future leader's load as it ended: run locally, or through the shared tier.
enum Settled<V, E> {
    Local(Result<V, E>),
    #[cfg(feature = "redis")]
    Shared(crate::fleet::Fetched<V, E>),
}

/// How a future's load starts, and what its deadline does to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Start {
    /// At once; the loader future is dropped at the load's deadline.
    Now,
    /// At once; at the deadline the flight is detached and the loader future goes on for
    /// its own caller (who must have a value: `get_with_async`).
    NowToTheEnd,
    /// When a spawner runs the task, perhaps past the load's deadline (see `Lead::run`).
    Queued,
}

impl<K, V, S> Lead<K, V, S>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
    S: BuildHasher,
{
    /// Awaits `load` until the load's deadline (`sleep`): `None` if it passed first, unless
    /// `to_the_end`, which then detaches the flight (as its waiters would) and awaits `load`
    /// to its end.
    async fn until_deadline<T>(
        &self,
        load: impl Future<Output = T> + Unpin,
        sleep: Option<Sleep>,
        to_the_end: bool,
    ) -> Option<T> {
        let mut timed = OrDeadline { inner: load, sleep };
        match (&mut timed).await {
            Some(v) => Some(v),
            None if to_the_end => {
                self.engine.time_out(&self.key, self.hash(), &self.flight);
                Some(timed.inner.await)
            }
            None => None,
        }
    }
}

/// What the future that wins a load does with it.
enum Handoff<K, V, S, F>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
    S: BuildHasher,
{
    /// Run the loader inline.
    Inline(Lead<K, V, S>, F),
    /// Run the loader inline, past the load's deadline too (see `Start::NowToTheEnd`).
    ToTheEnd(Lead<K, V, S>, F),
    /// The load runs on the task spawner: wait on its flight, unless it is a refresh, whose
    /// caller returns the value still `current`.
    Spawned {
        flight: Arc<Flight<V>>,
        current: Option<V>,
    },
}

/// Whether this future runs on a tokio runtime, which the shared tier's async client needs;
/// elsewhere a load skips the tier (counted in `shared_skipped`, logged once).
#[cfg(feature = "redis")]
fn on_tokio() -> bool {
    tokio::runtime::Handle::try_current().is_ok()
}

/// Polls `deadline` if there is one: whether it has passed.
fn deadline_passed<D: Future<Output = ()>>(
    deadline: &mut Pin<&mut Option<D>>,
    cx: &mut Context<'_>,
) -> bool {
    match deadline.as_mut().as_pin_mut() {
        Some(d) => d.poll(cx).is_ready(),
        None => false,
    }
}

/// Waits on another caller's flight until its result, or until the caller's deadline or the
/// load's own (`None`).
struct Waiting<'a, 'd, V, D> {
    flight: &'a Flight<V>,
    /// Our place among the waiters; `None` once the result is ours (or was available when we
    /// subscribed) or we left.
    sub: Option<Subscription>,
    deadline: Pin<&'d mut Option<D>>,
    /// The load's deadline (`load_timeout`), after which the waiter detaches it.
    load_deadline: Option<Sleep>,
}

impl<'a, V, D: Future<Output = ()>> Future for Waiting<'a, '_, V, D> {
    type Output = Option<&'a FlightResult<V>>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let flight = this.flight;
        let Some(sub) = &this.sub else {
            return Poll::Ready(flight.result()); // complete before we could subscribe
        };
        if let Poll::Ready(r) = flight.poll_result(sub, cx) {
            this.sub = None;
            return Poll::Ready(Some(r));
        }
        let load_overdue = match &mut this.load_deadline {
            Some(s) => Pin::new(s).poll(cx).is_ready(),
            None => false,
        };
        if load_overdue || deadline_passed(&mut this.deadline, cx) {
            flight.unsubscribe(sub);
            this.sub = None;
            // A completion that raced the deadline still counts.
            return Poll::Ready(flight.result());
        }
        Poll::Pending
    }
}

impl<V, D> Drop for Waiting<'_, '_, V, D> {
    fn drop(&mut self) {
        if let Some(sub) = &self.sub {
            self.flight.unsubscribe(sub);
        }
    }
}

/// Waits for a flight's result with no deadline: used only once its publication is under
/// way (its completion is claimed).
struct Published<'a, V> {
    flight: &'a Flight<V>,
    sub: Option<Subscription>,
}

impl<'a, V> Future for Published<'a, V> {
    type Output = &'a FlightResult<V>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let flight = this.flight;
        match &this.sub {
            // Complete before we could subscribe.
            None => Poll::Ready(flight.result().expect("no subscription: complete")),
            Some(sub) => flight.poll_result(sub, cx).map(|r| {
                this.sub = None;
                r
            }),
        }
    }
}

impl<V> Drop for Published<'_, V> {
    fn drop(&mut self) {
        if let Some(sub) = &self.sub {
            self.flight.unsubscribe(sub);
        }
    }
}

/// Waits in the limiter's queue for a load permit until the caller's deadline or the end of
/// its permit wait (see `Waits::permit`).
struct Acquiring<'a, D> {
    limiter: &'a Arc<Limiter>,
    queued: Queued,
    /// A wake-up for when a timed-out load's permit can be taken back.
    reclaim: Option<Sleep>,
    deadline: Pin<&'a mut Option<D>>,
    load_deadline: Option<Sleep>,
}

impl<D: Future<Output = ()>> Future for Acquiring<'_, D> {
    type Output = PermitWait;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        loop {
            if let Poll::Ready(p) = this.limiter.poll_acquire(&mut this.queued, cx) {
                return Poll::Ready(PermitWait::Got(p));
            }
            // `queued` leaves the queue when dropped.
            if deadline_passed(&mut this.deadline, cx) {
                return Poll::Ready(PermitWait::CallerDeadline);
            }
            if let Some(s) = &mut this.load_deadline {
                if Pin::new(s).poll(cx).is_ready() {
                    return Poll::Ready(PermitWait::LoadDeadline);
                }
            }
            let Some(at) = this.queued.reclaim_at else {
                return Poll::Pending;
            };
            let sleep = match &mut this.reclaim {
                Some(s) if s.at() == at => s,
                slot => slot.insert(Sleep::until(at)),
            };
            if Pin::new(sleep).poll(cx).is_pending() {
                return Poll::Pending;
            }
            // A permit can be taken back now: ask again.
        }
    }
}

/// Runs a loader future as its flight's leader: each poll marks the polling thread as the
/// flight's leader until it returns (so the loader asking for its own key, from this poll,
/// gets `Recursive` instead of waiting for itself), and a panic that unwinds out of a poll
/// is recorded (the leader's state is dropped only later, when the task is dropped, when the
/// thread no longer unwinds).
struct CatchPanic<'a, F, V> {
    load: Pin<&'a mut F>,
    panicked: &'a AtomicBool,
    flight: &'a Flight<V>,
}

impl<F: Future, V> Future for CatchPanic<'_, F, V> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        struct AfterPoll<'b, V>(&'b AtomicBool, &'b Flight<V>);
        impl<V> Drop for AfterPoll<'_, V> {
            fn drop(&mut self) {
                self.1.clear_leader();
                if std::thread::panicking() {
                    self.0.store(true, Ordering::Relaxed);
                }
            }
        }
        let this = self.get_mut();
        this.flight.set_leader_here();
        let _after = AfterPoll(this.panicked, this.flight);
        this.load.as_mut().poll(cx)
    }
}
