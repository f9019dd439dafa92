//! A load's lifecycle, from a caller's first look at a key to the end of the load it leads
//! or waits on: single flight over the table (DESIGN.md §4 invariants 2-4, §5).
//!
//! - [`Engine::step`] takes one non-blocking look at the key: the caller has its answer (a
//!   hit, a cached error, a throttled caller's stale value), leads a load, must wait on
//!   another caller's flight, or must wait for a load permit. To lead, it installs a
//!   `Loading` entry (holding a fresh [`Flight`]) with one CAS on the key's slot.
//! - The driver ([`Engine::begin`] for threads, [`Engine::drive`] for both) repeats steps
//!   until the caller has an answer or leads. Only the waiting differs between threads and
//!   futures, so it is a parameter ([`Waits`]): a thread blocks in place ([`ThreadWaits`],
//!   whose futures are ready when first polled, so `block_on` runs the driver in one
//!   poll), a future yields to its executor (`FutureWaits` in `future.rs`).
//! - The winner holds a [`Lead`], the guard of the load's obligations. The loading call
//!   runs its loader as it likes (inline, handed to a spawner, polled as a future) and
//!   ends the lead with its result ([`Lead::conclude`] and its variants): the value is
//!   published only if the slot still holds the lead's `Loading` entry (so an `insert`,
//!   `invalidate` or `forget` during the load wins), then the flight completes, which wakes
//!   every waiter. Dropped without a result (the loader unwound, its future was dropped),
//!   the lead completes the flight with `Panicked` or `Abandoned` and removes its entry,
//!   so nothing is left waiting.
//! - A load past its deadline is detached by whoever finds it ([`Engine::time_out`]), and
//!   `forget` detaches one on request ([`Engine::forget`]).

use std::any::Any;
use std::borrow::Borrow;
use std::future::Future;
use std::hash::{BuildHasher, Hash};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::Instant;

use super::{Engine, EntryNode, LoadEnd, Replacement};
use crate::clock::OnceNow;
use crate::entry::{expiry_after, Entry, Kind, NEVER};
use crate::error::LoadError;
use crate::flight::{Flight, FlightResult, Keep, Start};
use crate::local::Pinned;
use crate::pacing::{Limiter, Permit};
use crate::refresh::{LoadHistory, LoadRecord, RefreshState};
use crate::removal::RemovalCause;
use crate::stats::Counter;
use crate::sync::{AtomicBool, Ordering};
use crate::table::Node;
use crate::trace::trace_event;

/// What a caller that is not the leader makes of a finished flight.
pub(crate) enum Joined<V, E> {
    Done(Result<V, LoadError<E>>),
    /// The load failed with another caller's error type: load again ourselves.
    Retry,
}

fn downcast<E: Send + Sync + 'static>(error: &Arc<dyn Any + Send + Sync>) -> Option<Arc<E>> {
    Arc::clone(error).downcast::<E>().ok()
}

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

impl<K, V, S> Engine<K, V, S>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
    S: BuildHasher,
{
    /// `Cache::forget`: detaches the load of `key` in progress, if any.
    pub(crate) fn forget<Q>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let pinned = self.pin();
        let hash = self.hash(key);
        let current = self.find(hash, key, pinned.guard());
        let Some(Kind::Loading(flight)) = current.map(|n| n.value.kind()) else {
            return false;
        };
        // Claimed first, as a time-out is: if the leader has claimed, its result is being
        // published and there is nothing left to detach.
        if !flight.claim() {
            return false;
        }
        let flight = Arc::clone(flight);
        self.end_load(
            hash,
            &flight,
            LoadEnd::Remove(RemovalCause::Invalidated),
            &self.once_now(),
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
        self.pin().count(Counter::LoadTimeouts);
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
        let now = self.now();
        // The put-back's own reading, taken when first needed: after the user code below.
        let at = self.once_now();
        // The value to put back runs user code (`Clone`, the weigher): if it panics, the
        // load is removed instead, so the flight still completes.
        let restore = catch_unwind(AssertUnwindSafe(|| {
            flight.serving(|| now).map(|v| {
                let key = key.to_owned();
                let weight = self.weight_of(&key, v);
                let pkey = self.pkey(hash, &key);
                let entry = self.put_back_entry(pkey, flight, v.clone(), &at);
                Replacement {
                    node: Node::owned(hash, key, entry),
                    weight,
                    pkey,
                }
            })
        }))
        .unwrap_or(None);
        let end = match restore {
            Some(put_back) => LoadEnd::PutBack(put_back),
            // A refresh's value whose put-back panicked leaves with its load.
            None => LoadEnd::Remove(RemovalCause::Replaced),
        };
        let pinned = self.pin();
        self.end_load(hash, flight, end, &at, &pinned);
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
        let LoadHistory { delta, failures } = flight.history();
        let until = flight.stale_valid_until();
        self.ready_entry(
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
        self.pin().count(Counter::StaleServed);
        Some(v)
    }

    /// Whether a value that expires (or expired) at `expires_at` may still be served as a
    /// fallback now.
    pub(crate) fn within_stale_bound(&self, expires_at: u64) -> bool {
        self.now() <= expires_at.saturating_add(self.settings().max_stale)
    }

    /// One look at the key, which never blocks: what the caller does next. `held` is a permit
    /// the caller obtained by waiting (taken if this step leads).
    #[inline]
    pub(crate) fn step<Q, E>(
        self: &Arc<Self>,
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
            let pinned = self.pin();
            let current = self.find(hash, key, pinned.guard());
            // What a load started now replaces: the previous value with its hard expiry, and
            // the previous entry's load-time estimate and refresh failures.
            let mut replaced: Option<(V, u64)> = None;
            let mut history = LoadHistory::default();
            // The entry's refresh claim, if this caller won one: it then leads a refresh, not
            // a load after a miss.
            let mut claimed: Option<&RefreshState> = None;
            if let Some(node) = current {
                let entry = &node.value;
                let now = self.once_now();
                // A live value, or the value a refresh in progress still serves.
                if let Some(v) = self.hit(entry, || now.get(), &pinned) {
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
                    let due = self.settings().refresh.due(
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
            let permit = match self.limiter() {
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
                    self.settings()
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
        self: &Arc<Self>,
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
        let pkey = self.pkey(hash, key);
        let loading = Entry::loading(self.shard_of(pkey), Arc::clone(&flight));
        // Both clones of the key (user code) before the install: once our `Loading` entry
        // is in the table, only the `Lead` (whose drop settles it) may run user code.
        let node = Node::owned(hash, key.to_owned(), loading);
        let lead_key = key.to_owned();
        if !self.install_load((hash, pkey), key, node, seen, refresh, pinned) {
            return Err(flight);
        }
        Ok(Lead {
            engine: Arc::clone(self),
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
                self.pin().count(Counter::Timeouts);
                trace_event!(
                    DEBUG,
                    "a caller's deadline passed while it waited for a load"
                );
                Joined::Done(self.fallback(flight).ok_or(LoadError::Timeout))
            }
        }
    }
}

impl<K, V, S> Engine<K, V, S>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
    S: BuildHasher,
{
    /// The miss path up to the loader, for a thread: a hit, a joined flight, a cached error
    /// or a throttled caller end here (`Done`); a caller that wins the install gets the
    /// `Lead` to run.
    #[inline]
    pub(crate) fn begin<Q, E>(
        self: &Arc<Self>,
        key: &Q,
        deadline: Option<Instant>,
    ) -> Begin<K, V, S, E>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
        E: Send + Sync + 'static,
    {
        let hash = self.hash(key);
        match self.step(key, hash, &mut None) {
            Step::Begin(begin) => begin,
            wait => self.begin_waiting(key, hash, wait, deadline),
        }
    }

    /// `begin` past a first look that must wait: out of line, so that a hit does not carry
    /// the driver's frame.
    #[inline(never)]
    fn begin_waiting<Q, E>(
        self: &Arc<Self>,
        key: &Q,
        hash: u64,
        wait: Step<K, V, S, E>,
        deadline: Option<Instant>,
    ) -> Begin<K, V, S, E>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
        E: Send + Sync + 'static,
    {
        // A thread's waits block in place: the driver is ready when first polled.
        crate::spawn::block_on(self.drive(
            key,
            hash,
            wait,
            &mut ThreadWaits {
                deadline,
                permit_by: None,
            },
        ))
    }

    /// A future's first look at `key`: a hit, a cached error or a won load end the miss path
    /// here, without the driver, whose state machine would cost a hit more than the hit
    /// itself; else the step to `drive` from. (A thread's first look is `begin`'s.)
    #[inline]
    #[allow(clippy::type_complexity)] // two of the miss path's own enums
    pub(crate) fn first_look<Q, E>(
        self: &Arc<Self>,
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

    /// Carries the miss path on from `first` (a wait, see `begin` and `first_look`) until it
    /// has a result, waiting as `waits` does, or leads the load.
    pub(crate) async fn drive<Q, E, W>(
        self: &Arc<Self>,
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
                    self.pin().count(Counter::CoalescedWaits);
                    match self.await_flight(key, hash, &flight, waits).await {
                        Joined::Done(r) => return Begin::Done(r),
                        Joined::Retry => continue,
                    }
                }
                Step::Throttled(limiter) => match waits.permit(&limiter).await {
                    // The key may have changed while we waited: look again.
                    PermitWait::Got(p) => held = Some(p),
                    PermitWait::CallerDeadline => {
                        self.pin().count(Counter::Timeouts);
                        return Begin::Done(Err(LoadError::Timeout));
                    }
                    PermitWait::LoadDeadline => {
                        self.pin().count(Counter::Timeouts);
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

/// Leads for the calls that act on several keys or on the value in place: a batch load
/// (`get_or_load_all`) and `compute`.
impl<K, V, S> Engine<K, V, S>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
    S: BuildHasher,
{
    /// One look at `key` (hash `hash`) of a batch. With `lead` (the batch's permit, taken by
    /// the first flight installed, and the flights' deadline), a miss is led; without, it is
    /// only reported.
    pub(crate) fn look_for_batch<Q, E>(
        self: &Arc<Self>,
        key: &Q,
        hash: u64,
        mut lead: Option<(&mut Option<Permit>, Option<Instant>)>,
    ) -> BatchLook<K, V, S, E>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
        E: Send + Sync + 'static,
    {
        loop {
            let pinned = self.pin();
            let current = self.find(hash, key, pinned.guard());
            let now = self.once_now();
            let mut stale = None;
            let mut history = LoadHistory::default();
            if let Some(node) = current {
                let entry = &node.value;
                // A hit (an early refresh due is left to the single-key calls).
                if let Some(v) = self.hit(entry, || now.get(), &pinned) {
                    return BatchLook::Hit(v.clone());
                }
                match entry.kind() {
                    Kind::Loading(flight) => {
                        pinned.count(Counter::Misses);
                        return BatchLook::Wait(Arc::clone(flight));
                    }
                    Kind::Failed { error, .. } if !entry.is_expired(|| now.get()) => {
                        if let Ok(e) = Arc::clone(error).downcast::<E>() {
                            pinned.count(Counter::Misses);
                            return BatchLook::Failed(e);
                        }
                    }
                    Kind::Ready(r) => {
                        history = r.history();
                        stale = Some((r.value.clone(), r.valid_until(now.get())));
                    }
                    Kind::Failed { .. } => {}
                }
            }
            let Some((permit, deadline)) = lead.as_mut() else {
                return BatchLook::Miss;
            };
            pinned.count(Counter::Misses);
            let flight = Arc::new(Flight::new(Start {
                stale,
                history,
                refresh: false,
                deadline: *deadline,
                permit: permit.take(),
            }));
            match self.install_lead(key, hash, current, flight, false, &pinned) {
                Ok(lead) => {
                    pinned.count(Counter::Loads);
                    return BatchLook::Lead(lead);
                }
                Err(flight) => {
                    // The key changed first: look again, with the permit back.
                    **permit = flight.take_permit();
                }
            }
        }
    }

    /// Leads `key` for a compute, with the value it holds (if live): a load or another
    /// compute of the key in flight is waited for first, and detached past its deadline, as
    /// its waiters would.
    pub(crate) fn lead_for_compute<Q>(self: &Arc<Self>, key: &Q) -> (Lead<K, V, S>, Option<V>)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let hash = self.hash(key);
        loop {
            match self.look_for_compute(key, hash) {
                ComputeLook::Lead(lead, old) => return (lead, old),
                ComputeLook::Wait(flight) => {
                    if flight.wait(flight.deadline()).is_none() && flight.overdue(Instant::now()) {
                        self.time_out(key, hash, &flight);
                    }
                }
            }
        }
    }

    /// One look at `key` for a compute: a load in flight to wait for, or the key led by
    /// this compute, with the value it holds.
    fn look_for_compute<Q>(self: &Arc<Self>, key: &Q, hash: u64) -> ComputeLook<K, V, S>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        loop {
            let pinned = self.pin();
            let current = self.find(hash, key, pinned.guard());
            let now = self.once_now();
            let mut old = None;
            let mut history = LoadHistory::default();
            if let Some(node) = current {
                match node.value.kind() {
                    Kind::Loading(flight) => {
                        assert!(
                            !flight.led_by_current_thread(),
                            "compute: called for the key a loader on this thread is loading"
                        );
                        return ComputeLook::Wait(Arc::clone(flight));
                    }
                    Kind::Ready(r) if r.live(|| now.get()) => {
                        history = r.history();
                        old = Some((r.value.clone(), r.valid_until(now.get())));
                    }
                    Kind::Ready(_) | Kind::Failed { .. } => {}
                }
            }
            let value = old.as_ref().map(|(v, _)| v.clone());
            let refresh = old.is_some();
            let flight = Arc::new(Flight::new(Start {
                stale: old,
                history,
                refresh,
                deadline: self
                    .settings()
                    .load_timeout
                    .and_then(|t| Instant::now().checked_add(t)),
                permit: None,
            }));
            match self.install_lead(key, hash, current, flight, refresh, &pinned) {
                Ok(mut lead) => {
                    lead.load = false;
                    return ComputeLook::Lead(lead, value);
                }
                // The key changed first: look again.
                Err(_) => continue,
            }
        }
    }
}

/// One look at one key of a batch.
pub(crate) enum BatchLook<K, V, S, E>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
    S: BuildHasher,
{
    Hit(V),
    /// A cached error of the caller's type (`negative_ttl`).
    Failed(Arc<E>),
    /// Another caller's load: wait for it.
    Wait(Arc<Flight<V>>),
    /// Nothing usable: this call should load it.
    Miss,
    /// This call leads the key's load now.
    Lead(Lead<K, V, S>),
}

/// Where a compute stands after one look at its key.
enum ComputeLook<K, V, S>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
    S: BuildHasher,
{
    /// A load (or another compute) of the key is in flight: wait for it, then look again.
    Wait(Arc<Flight<V>>),
    /// This compute leads the key, whose value (if it has one) is this.
    Lead(Lead<K, V, S>, Option<V>),
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

/// One look at the key ([`Engine::step`]).
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
    pub(crate) engine: Arc<Engine<K, V, S>>,
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
        let engine = &self.engine;
        let pinned = engine.pin();
        let node = Replacement {
            node: Node::owned(self.hash, self.key.clone(), make()),
            weight,
            pkey: self.pkey,
        };
        let end = if put_back {
            LoadEnd::PutBack(node)
        } else {
            LoadEnd::Publish(node)
        };
        let replaced = engine.end_load(self.hash, &self.flight, end, now, &pinned);
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
        let now = self.engine.now();
        crate::fleet::LoadPlan {
            pkey: self.pkey,
            ttl: self
                .engine
                .settings()
                .time_to_live
                .map(std::time::Duration::from_nanos),
            refreshing: self.flight.serving(|| now).map(|_| {
                std::time::Duration::from_nanos(self.flight.stale_valid_until().saturating_sub(now))
            }),
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
        let pinned = self.engine.pin();
        // The policy may still track the write our load replaced: `end_load` tells it.
        let engine = &self.engine;
        let end = LoadEnd::Remove(cause);
        engine.end_load(self.hash, &self.flight, end, &engine.once_now(), &pinned)
    }

    /// Puts `old`, the value the flight served, back in place of our `Loading` entry as it
    /// was (its expiry, its refresh plan's history), if the slot still holds the entry: a
    /// `compute` that kept it. Returns whether it did.
    pub(crate) fn put_back(&mut self, old: &V) -> bool {
        let engine = Arc::clone(&self.engine);
        let weight = engine.weight_of(&self.key, old);
        let LoadHistory { delta, failures } = self.flight.history();
        let (pkey, until) = (self.pkey, self.flight.stale_valid_until());
        let at = engine.once_now();
        let load = LoadRecord {
            delta,
            took: 0,
            failures,
        };
        self.replace_loading(weight, &at, true, || {
            engine.ready_entry(pkey, old.clone(), until, load, &at)
        })
    }

    /// If the flight still serves a valid value (a refresh), puts it back with one more
    /// failure behind it (so the next refresh waits for a backoff) and completes the flight
    /// with it; returns it. `None` (and nothing done) otherwise.
    fn restore_stale(&mut self, now: u64) -> Option<V> {
        let old = self.flight.serving(|| now).cloned()?;
        let engine = Arc::clone(&self.engine);
        let weight = engine.weight_of(&self.key, &old);
        let (pkey, flight) = (self.pkey, Arc::clone(&self.flight));
        let for_waiters = old.clone();
        // Taken when first needed, after the `Clone` in the closure.
        let at = engine.once_now();
        self.replace_loading(weight, &at, true, || {
            engine.put_back_entry(pkey, &flight, old.clone(), &at)
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
            self.engine.time_out(&self.key, self.hash, &self.flight);
        }
        let out = match self.flight.result() {
            Some(FlightResult::Value(v)) => Ok(v.clone()),
            _ => self
                .engine
                .fallback(&self.flight)
                .ok_or(LoadError::LoadTimedOut),
        };
        // Before `out` is returned, as in `conclude_keeping`.
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
            self.engine.pin().count(Counter::LoadsEnded);
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
        self.engine.pin().count(counter);
        let now = self.engine.now();
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

impl<K, V, S> Lead<K, V, S>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
    S: BuildHasher,
{
    /// Runs the loader as the flight's leader and finishes the flight on every path out.
    /// `queued`: the load waited for a spawner (a refresh job) and may be past its deadline
    /// before it starts; a caller's own inline load starts at once and always runs.
    pub(crate) fn run<E, F>(self, loader: F, queued: bool) -> Result<V, LoadError<E>>
    where
        F: FnOnce(&K) -> Result<V, E>,
        E: Send + Sync + 'static,
    {
        let lead = self;
        lead.flight.set_leader_here();
        if queued && lead.stale_before_start() {
            return lead.time_out();
        }
        // Measured with the cache's clock, so a manual clock drives XFetch's delta in tests.
        let started = lead.engine.now();
        #[cfg(feature = "redis")]
        if let Some(tier) = lead.engine.shared() {
            let count = lead.engine.counting();
            let fetched =
                tier.load_sync(&lead.key, lead.shared_plan(), &count, || loader(&lead.key));
            drop(count);
            return lead.conclude_from_tier(started, fetched);
        }
        let result = loader(&lead.key);
        lead.conclude(started, result)
    }

    /// Publishes a finished load's result (started at `started`) and completes the flight.
    pub(crate) fn conclude<E>(self, started: u64, result: Result<V, E>) -> Result<V, LoadError<E>>
    where
        E: Send + Sync + 'static,
    {
        self.conclude_keeping(started, result, Keep::For(None))
    }

    /// Like `conclude`, for a load that went through the shared tier: then checks that no
    /// other instance's write of the key was heard while it ran.
    #[cfg(feature = "redis")]
    pub(crate) fn conclude_from_tier<E>(
        self,
        started: u64,
        fetched: crate::fleet::Fetched<V, E>,
    ) -> Result<V, LoadError<E>>
    where
        E: Send + Sync + 'static,
    {
        let (engine, pkey) = (Arc::clone(&self.engine), self.pkey);
        let r = self.conclude_keeping(started, fetched.result, fetched.keep);
        engine.recheck(pkey, fetched.seen);
        r
    }

    /// Like `conclude`, for a value the cache keeps as `keep` says (one taken from the shared
    /// tier expires here when it expires there; one that raced a write elsewhere is not kept).
    pub(crate) fn conclude_keeping<E>(
        mut self,
        started: u64,
        result: Result<V, E>,
        keep: Keep,
    ) -> Result<V, LoadError<E>>
    where
        E: Send + Sync + 'static,
    {
        let out = self.settle(started, result.map_err(Arc::new), keep);
        // The lead goes first, while `out` is still a local: its key's and its flight's
        // values' drops are user code, and a panic there would leak a return value already
        // built (rust-lang/rust#47949), where it drops a local.
        drop(self);
        out
    }

    /// Like `conclude`, for a load whose error is shared with other loads (one batch's).
    pub(crate) fn conclude_batch<E>(
        mut self,
        started: u64,
        result: Result<V, Arc<E>>,
    ) -> Result<V, LoadError<E>>
    where
        E: Send + Sync + 'static,
    {
        let out = self.settle(started, result, Keep::For(None));
        // As in `conclude_keeping`.
        drop(self);
        out
    }

    /// `conclude_keeping`'s work: the table and the flight settled with `result`.
    fn settle<E>(
        &mut self,
        started: u64,
        result: Result<V, Arc<E>>,
        keep: Keep,
    ) -> Result<V, LoadError<E>>
    where
        E: Send + Sync + 'static,
    {
        let lead = self;
        let engine = Arc::clone(&lead.engine);
        let finished = engine.now();
        // The publication's reading (see `Engine::once_now`), taken when first needed: after
        // the user code below (the hooks, `Clone`), which may take any time.
        let now = engine.once_now();
        if lead.load {
            engine.pin().latency(finished.saturating_sub(started));
        }
        trace_event!(
            DEBUG,
            nanos = finished.saturating_sub(started),
            ok = result.is_ok(),
            "load finished"
        );
        let previous_delta = lead.flight.history().delta;
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
                let expiry = match engine.ttl_of(&lead.key, &value) {
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
                let weight = engine.weight_of(&lead.key, &value);
                let pkey = lead.pkey;
                // Every clone (user code) before the table changes: what the waiters get and
                // what the table holds cannot then part ways on a panic.
                let for_waiters = value.clone();
                lead.replace_loading(weight, &now, false, || {
                    engine.ready_entry(pkey, value.clone(), expires_at, load, &now)
                });
                lead.finish(FlightResult::Value(for_waiters));
                Ok(value)
            }
            Err(error) => {
                let erased: Arc<dyn Any + Send + Sync> = error.clone();
                engine.pin().count(Counter::LoadErrors);
                // Stale-if-error: a failed refresh of a still-valid value puts that value
                // back, with a backoff before the next attempt.
                if engine.settings().refresh.stale_if_error {
                    if let Some(old) = lead.restore_stale(finished) {
                        engine.pin().count(Counter::RefreshFailures);
                        trace_event!(
                            WARN,
                            "refresh failed; the current value stays (stale-if-error)"
                        );
                        return Ok(old);
                    }
                }
                match engine.settings().negative_ttl {
                    Some(ttl) => {
                        let expires_at = expiry_after(finished, ttl);
                        let pkey = lead.pkey;
                        let entry = || {
                            Entry::failed(engine.shard_of(pkey), Arc::clone(&erased), expires_at)
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
