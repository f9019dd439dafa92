//! The miss-path driver: the one loop that threads and futures both run from a lookup to a
//! result or to a load they lead.
//!
//! Each turn takes one non-blocking look at the key ([`Cache::step`]): it has the answer,
//! leads the load, must wait on another caller's flight, or must wait for a load permit.
//! Only the waiting differs between callers, so it is a parameter ([`Waits`]): a thread
//! blocks in place ([`ThreadWaits`], whose futures are ready when first polled, so
//! [`block_on`](crate::spawn::block_on) runs the driver in one poll), and a future yields to
//! its executor (`FutureWaits` in `future.rs`). What the leader then does with its load
//! (run it inline, hand it to the spawner) is the caller's. A thread enters the driver
//! through `begin`, here; a future through `future.rs`.

use std::borrow::Borrow;
use std::future::Future;
use std::hash::{BuildHasher, Hash};
use std::sync::Arc;
use std::time::Instant;

use crate::cache::Cache;
use crate::flight::{Flight, FlightResult};
use crate::load::{Begin, Joined, LoadError, Step};
use crate::pacing::{Limiter, Permit};
use crate::stats::Counter;

/// How a caller waits on the miss path.
pub(crate) trait Waits<V> {
    /// Waits on another caller's flight until its result, or until the caller's deadline or
    /// the load's own passes (`None`).
    fn flight<'f>(
        &mut self,
        flight: &'f Flight<V>,
    ) -> impl Future<Output = Option<&'f FlightResult<V>>>;

    /// Waits, with no deadline, for the result of a flight whose publication is under way
    /// (its completion is claimed).
    fn published<'f>(
        &mut self,
        flight: &'f Flight<V>,
    ) -> impl Future<Output = Option<&'f FlightResult<V>>>;

    /// Waits for a load permit until the caller's deadline or, at the latest, a
    /// `load_timeout` after the caller first waited for one (DESIGN.md §10 invariant 7: no
    /// caller waits for a permit past its load's deadline).
    fn permit(&mut self, limiter: &Arc<Limiter>) -> impl Future<Output = PermitWait>;
}

/// How a wait for a load permit ended.
pub(crate) enum PermitWait {
    Got(Permit),
    /// The caller's own deadline passed first.
    CallerDeadline,
    /// The caller waited a whole `load_timeout` for a permit.
    LoadDeadline,
}

/// When a caller's wait for a permit that starts now ends at the latest: a `load_timeout`
/// (the limiter's lease) from now, if there is one.
pub(crate) fn permit_deadline(limiter: &Limiter) -> Option<Instant> {
    limiter.lease().and_then(|l| Instant::now().checked_add(l))
}

/// A thread's waits: it blocks in place (parked) until its deadline.
pub(crate) struct ThreadWaits {
    pub(crate) deadline: Option<Instant>,
    /// When its waits for a permit end at the latest (set by the first such wait).
    pub(crate) permit_by: Option<Instant>,
}

impl<V> Waits<V> for ThreadWaits {
    async fn flight<'f>(&mut self, flight: &'f Flight<V>) -> Option<&'f FlightResult<V>> {
        let until = match (self.deadline, flight.deadline()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        flight.wait(until)
    }

    async fn published<'f>(&mut self, flight: &'f Flight<V>) -> Option<&'f FlightResult<V>> {
        flight.wait(None)
    }

    async fn permit(&mut self, limiter: &Arc<Limiter>) -> PermitWait {
        if self.permit_by.is_none() {
            self.permit_by = permit_deadline(limiter);
        }
        let (mine, load) = (self.deadline, self.permit_by);
        let until = match (mine, load) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        match limiter.acquire(until) {
            Some(p) => PermitWait::Got(p),
            None if load.is_some_and(|b| mine.is_none_or(|d| b < d)) => PermitWait::LoadDeadline,
            None => PermitWait::CallerDeadline,
        }
    }
}

impl<K, V, S> Cache<K, V, S>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
    S: BuildHasher,
{
    /// The miss path up to the loader, for a thread: a hit, a joined flight, a cached error
    /// or a throttled caller end here (`Done`); a caller that wins the install gets the
    /// `Lead` to run.
    pub(crate) fn begin<Q, E>(&self, key: &Q, deadline: Option<Instant>) -> Begin<K, V, S, E>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
        E: Send + Sync + 'static,
    {
        let hash = self.inner.hash(key);
        match self.first_look(key, hash) {
            Ok(begin) => begin,
            // A thread's waits block in place: the driver is ready when first polled.
            Err(wait) => crate::spawn::block_on(self.drive(
                key,
                hash,
                wait,
                &mut ThreadWaits {
                    deadline,
                    permit_by: None,
                },
            )),
        }
    }

    /// The first look at `key`: a hit, a cached error or a won load end the miss path here,
    /// without the driver, whose state machine would cost a hit more than the hit itself;
    /// else the step to `drive` from.
    #[inline]
    #[allow(clippy::type_complexity)] // two of the miss path's own enums
    pub(crate) fn first_look<Q, E>(
        &self,
        key: &Q,
        hash: u64,
    ) -> Result<Begin<K, V, S, E>, Step<K, V, S, E>>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
        E: Send + Sync + 'static,
    {
        match self.step(key, hash, &mut None) {
            Step::Begin(begin) => Ok(begin),
            wait => Err(wait),
        }
    }

    /// Carries the miss path on from `first` (a wait, see `first_look`) until it has a
    /// result, waiting as `waits` does, or leads the load.
    pub(crate) async fn drive<Q, E, W>(
        &self,
        key: &Q,
        hash: u64,
        first: Step<K, V, S, E>,
        waits: &mut W,
    ) -> Begin<K, V, S, E>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
        E: Send + Sync + 'static,
        W: Waits<V>,
    {
        // A load permit obtained by waiting, kept across a retry.
        let mut held = None;
        let mut next = Some(first);
        loop {
            let step = match next.take() {
                Some(step) => step,
                None => self.step(key, hash, &mut held),
            };
            match step {
                Step::Begin(begin) => return begin,
                Step::Wait(flight) => {
                    // A permit we waited for is of no use while another caller loads.
                    held = None;
                    // This thread runs the flight's loader, and the loader asked for its own
                    // key (from a thread, or from a future it polls in place).
                    if flight.led_by_current_thread() {
                        return Begin::Done(Err(LoadError::Recursive));
                    }
                    self.inner.pin().count(Counter::CoalescedWaits);
                    match self.await_flight(key, hash, &flight, waits).await {
                        Joined::Done(r) => return Begin::Done(r),
                        Joined::Retry => continue,
                    }
                }
                Step::Throttled(limiter) => match waits.permit(&limiter).await {
                    // The key may have changed while we waited: look again.
                    PermitWait::Got(p) => held = Some(p),
                    PermitWait::CallerDeadline => {
                        self.inner.pin().count(Counter::Timeouts);
                        return Begin::Done(Err(LoadError::Timeout));
                    }
                    PermitWait::LoadDeadline => {
                        self.inner.pin().count(Counter::Timeouts);
                        return Begin::Done(Err(LoadError::LoadTimedOut));
                    }
                },
            }
        }
    }

    /// Waits on `flight` (of `key`) as `waits` does, detaching its load if the load ran past
    /// its own deadline, and says what the wait gave.
    pub(crate) async fn await_flight<Q, E, W>(
        &self,
        key: &Q,
        hash: u64,
        flight: &Arc<Flight<V>>,
        waits: &mut W,
    ) -> Joined<V, E>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
        E: Send + Sync + 'static,
        W: Waits<V>,
    {
        let mut outcome = waits.flight(flight).await;
        if outcome.is_none() && flight.overdue(Instant::now()) {
            self.time_out(key, hash, flight);
            outcome = match flight.result() {
                Some(r) => Some(r),
                // The leader claimed first and is publishing: wait for that alone.
                None => waits.published(flight).await,
            };
        }
        self.joined(flight, outcome)
    }
}
