//! Single flight: the record of one in-progress load, its waiters, and its result.
//!
//! The leader (the caller whose CAS installed the `Loading` entry holding this flight) runs
//! the loader and calls [`Flight::complete`] exactly once, on every path out of the load
//! (value, error, panic, invalidation). Everyone else waits on the flight.
//!
//! # Waiting without lost wake-ups
//! Waiters are a lock-free stack of nodes, closed by the completion: [`Flight::complete`]
//! writes the result, then swaps the stack head to `CLOSED` (Release), then wakes every node it
//! took. A waiter pushes its node with a CAS that fails if the head is `CLOSED` (then the result
//! is already readable), and after pushing it parks until its node is marked notified. Either
//! the push precedes the swap (the completer sees the node and wakes it; an unpark before the
//! park just makes the park return) or it follows it (the push fails and the waiter reads the
//! result): there is no window in which a completion goes unseen.
//!
//! Each node moves once, by CAS, from `WAITING` to `NOTIFIED` (the completer, which then
//! unparks the thread) or to `ABANDONED` (a waiter leaving at its deadline, which the
//! completer then leaves alone). So no thread is unparked after it has left, and a waiter
//! that sees `NOTIFIED` before it has parked parks once to absorb the wake-up on its way:
//! no stray wake-up outlives the wait. Abandoned nodes stay in the stack (reference-counted)
//! and are freed with it.
//!
//! # Waiting futures
//! A future waits with a node of its own ([`Flight::subscribe`]) that holds its latest
//! `Waker` in a small mutex instead of a thread. Each poll stores the waker and then reads the
//! node's state; the completer moves the state to `NOTIFIED` and then takes the waker. The
//! mutex orders the two: either the completer takes the waker this poll stored (and wakes
//! it), or its state change happened before the poll's store and the poll sees `NOTIFIED`.
//! A future dropped before the result moves its node to `ABANDONED`, as a thread leaving at
//! its deadline does. Threads and futures wait on the same stack, so sync and async callers
//! of one key share one load.

use std::any::Any;
use std::ptr::{self, NonNull};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use crate::pacing::Permit;
use crate::refresh::LoadHistory;
use crate::sync::thread::{self, Thread};
use crate::sync::{AtomicBool, AtomicPtr, AtomicU8, AtomicUsize, Mutex, Ordering, UnsafeCell};

/// How a load ended, as stored in the flight for every waiter.
#[derive(Debug)]
pub(crate) enum FlightResult<V> {
    /// The loaded value.
    Value(V),
    /// The loader's error, type-erased (each caller downcasts to its own `E`).
    Failed(Arc<dyn Any + Send + Sync>),
    /// The loader panicked.
    Panicked,
    /// The leader was dropped before its load finished (a cancelled future), or the load
    /// was detached by `forget`: nothing was cached, and each waiter looks at the key again,
    /// so one of them leads a new load.
    Abandoned,
    /// The load ran past its deadline (`load_timeout`) and was detached: its waiters get
    /// the stale value within its bound or `LoadError::LoadTimedOut`, and the next caller
    /// starts a fresh load.
    TimedOut,
}

/// Waiter node states.
const WAITING: u8 = 0;
const NOTIFIED: u8 = 1;
const ABANDONED: u8 = 2;

/// How to wake a waiter.
enum Wake {
    /// A parked thread.
    Thread(Thread),
    /// A future: the waker of its latest poll.
    Task(Mutex<Option<Waker>>),
}

struct Waiter {
    wake: Wake,
    state: AtomicU8,
    /// Written before the node is published by the push CAS, never after.
    next: *const Waiter,
}

// SAFETY: `next` is written only before the node is published (by the pushing thread) and
// read only by the completer after it took the stack; every other field is thread-safe.
unsafe impl Send for Waiter {}
// SAFETY: as above.
unsafe impl Sync for Waiter {}

/// One in-progress load.
pub(crate) struct Flight<V> {
    /// Stack of waiters, or `CLOSED` once the result is written.
    waiters: AtomicPtr<Waiter>,
    /// Written once by the leader before `waiters` is closed; read only after.
    result: UnsafeCell<Option<FlightResult<V>>>,
    /// The value the load replaces, if any: what a waiter whose deadline passes gets.
    stale: Option<V>,
    /// Until when `stale` is still a valid value (its hard expiry): a refresh serves it to
    /// readers without waiting until then. In the past for a load of an expired value.
    stale_valid_until: u64,
    /// [`thread::token`] of the thread running the loader, or 0 while none is (a refresh job
    /// waiting for its spawner to run it): lets a loader that re-enters for its own key get an
    /// error instead of waiting on itself.
    leader: AtomicUsize,
    /// The replaced entry's load-time estimate and failed-refresh count.
    history: LoadHistory,
    /// Whether this is a refresh: `stale` was a live value when it started, which readers are
    /// served meanwhile and which leaves the cache (told to the listener) only when the
    /// refresh ends without putting it back.
    refresh: bool,
    /// When the load is timed out (`load_timeout`), if ever.
    deadline: Option<Instant>,
    /// Set by the one caller that completes the flight: the leader with its result, or
    /// whoever detaches it first (its deadline, `forget`).
    completing: AtomicBool,
    /// The load's permit (`max_concurrent_loads`), given back by the completion.
    permit: Mutex<Option<Permit>>,
}

// SAFETY: the result cell is written once, by the completer, before `waiters` is closed with
// Release, and read only after `waiters` is seen closed with Acquire; `V` is shared by
// reference with every waiter (hence `Sync`) and may be dropped on any thread (hence `Send`).
unsafe impl<V: Send + Sync> Send for Flight<V> {}
// SAFETY: as above.
unsafe impl<V: Send + Sync> Sync for Flight<V> {}

impl<V> std::fmt::Debug for Flight<V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Flight")
            .field("complete", &self.is_complete())
            .finish_non_exhaustive()
    }
}

/// The head value of a completed flight's waiter stack (never a real node).
fn closed() -> *mut Waiter {
    NonNull::dangling().as_ptr()
}

/// What a new flight starts with.
pub(crate) struct Start<V> {
    /// The value the load replaces, with its hard expiry.
    pub(crate) stale: Option<(V, u64)>,
    /// The replaced entry's load-time estimate and failed-refresh count.
    pub(crate) history: LoadHistory,
    /// Whether it is a refresh of a live value (`stale`).
    pub(crate) refresh: bool,
    /// When the load is timed out.
    pub(crate) deadline: Option<Instant>,
    /// The load's permit.
    pub(crate) permit: Option<Permit>,
}

impl<V> Flight<V> {
    /// A flight led by the calling thread.
    pub(crate) fn new(start: Start<V>) -> Self {
        let (stale, stale_valid_until) = match start.stale {
            Some((v, until)) => (Some(v), until),
            None => (None, 0),
        };
        Flight {
            waiters: AtomicPtr::new(ptr::null_mut()),
            result: UnsafeCell::new(None),
            stale,
            stale_valid_until,
            leader: AtomicUsize::new(thread::token()),
            history: start.history,
            refresh: start.refresh,
            deadline: start.deadline,
            completing: AtomicBool::new(false),
            permit: Mutex::new(start.permit),
        }
    }

    /// The replaced entry's load-time estimate and failed-refresh count.
    pub(crate) fn history(&self) -> LoadHistory {
        self.history
    }

    /// Whether this load is a refresh of a value that was live when it started.
    pub(crate) fn is_refresh(&self) -> bool {
        self.refresh
    }

    /// When the load is timed out, if ever.
    pub(crate) fn deadline(&self) -> Option<Instant> {
        self.deadline
    }

    /// Whether the load has run past its deadline at `now`. loom has no time: there, a load
    /// with a deadline is overdue at every check, which loom places at every point relative
    /// to the load's completion.
    pub(crate) fn overdue(&self, now: Instant) -> bool {
        self.deadline
            .is_some_and(|d| now >= d || cfg!(herdcache_loom))
    }

    /// The replaced value if it is still valid at `now` (a refresh in progress).
    #[inline]
    pub(crate) fn serving(&self, now: impl FnOnce() -> u64) -> Option<&V> {
        let v = self.stale.as_ref()?;
        (now() < self.stale_valid_until).then_some(v)
    }

    /// The hard expiry of the replaced value (0 if there is none).
    pub(crate) fn stale_valid_until(&self) -> u64 {
        self.stale_valid_until
    }

    /// Whether the calling thread is running this flight's loader (so waiting on it would
    /// deadlock). Relaxed: only the calling thread's own writes matter for a true answer.
    pub(crate) fn led_by_current_thread(&self) -> bool {
        self.leader.load(Ordering::Relaxed) == thread::token()
    }

    /// Records that the calling thread runs the loader from now on.
    pub(crate) fn set_leader_here(&self) {
        self.leader.store(thread::token(), Ordering::Relaxed);
    }

    /// Records that no thread runs the loader yet (a job handed to a spawner).
    pub(crate) fn clear_leader(&self) {
        self.leader.store(0, Ordering::Relaxed);
    }

    /// The expired value this load replaces, if one was kept.
    pub(crate) fn stale(&self) -> Option<&V> {
        self.stale.as_ref()
    }

    /// Whether the result is available.
    pub(crate) fn is_complete(&self) -> bool {
        // Acquire pairs with the AcqRel swap to CLOSED in `publish`, which follows the
        // result's write.
        self.waiters.load(Ordering::Acquire) == closed()
    }

    /// The result, once complete.
    pub(crate) fn result(&self) -> Option<&FlightResult<V>> {
        if !self.is_complete() {
            return None;
        }
        // SAFETY: complete, so the cell was written before the Release swap we synchronised
        // with, and is never written again; shared reads are all that happen from now on.
        self.result.with(|r| unsafe { (*r).as_ref() })
    }

    /// Claims the right to complete the flight: true for exactly one caller. The leader
    /// claims before it publishes its result to the table, and a detacher (a deadline,
    /// `forget`) before it touches the table, so exactly one of them decides what the key
    /// and the waiters get. Relaxed: the claim only elects; the result is published by the
    /// Release swap in `publish`.
    pub(crate) fn claim(&self) -> bool {
        !self.completing.swap(true, Ordering::Relaxed)
    }

    /// Whether the flight was claimed (completed, or being completed): a leader that has not
    /// started yet has nothing left to do.
    pub(crate) fn is_claimed(&self) -> bool {
        self.completing.load(Ordering::Relaxed)
    }

    /// Claims the flight and completes it with `result`; false (and `result` dropped) if it
    /// was claimed already (a detached load finishing late, or a detacher losing to the
    /// leader, whose result is then about to be published).
    #[cfg(test)]
    pub(crate) fn complete(&self, result: FlightResult<V>) -> bool {
        if !self.claim() {
            return false;
        }
        // SAFETY: we just claimed it.
        unsafe { self.publish(result) };
        true
    }

    /// Stores the result, wakes every waiter and gives the load's permit back.
    ///
    /// # Safety
    /// The caller won [`claim`](Self::claim) and publishes once.
    pub(crate) unsafe fn publish(&self, result: FlightResult<V>) {
        // SAFETY: the caller's claim makes it the only writer, and no reader reads before
        // the close below.
        self.result.with_mut(|r| unsafe { *r = Some(result) });
        // AcqRel: Release publishes the result to the Acquire load in `is_complete`; Acquire
        // pairs with the Release CAS in `push`, so the pushed nodes' fields are visible.
        let mut node = self.waiters.swap(closed(), Ordering::AcqRel);
        debug_assert_ne!(node, closed(), "flight completed twice");
        while !node.is_null() {
            // SAFETY: each pushed node is an `Arc::into_raw` whose reference the stack owns;
            // we took the whole stack, so we own those references now.
            let waiter = unsafe { Arc::from_raw(node as *const Waiter) };
            node = waiter.next as *mut Waiter;
            // Release pairs with the Acquire state loads in `wait` and `poll_result`: a waiter
            // that sees NOTIFIED then finds the stack CLOSED in `result`, so the result is
            // readable. A waiter that abandoned is gone.
            if waiter
                .state
                .compare_exchange(WAITING, NOTIFIED, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                match &waiter.wake {
                    Wake::Thread(t) => t.unpark(),
                    Wake::Task(slot) => {
                        // Taken under the lock, woken outside it (waking runs executor code,
                        // which must not stop the other wake-ups if it panics).
                        let waker = slot.lock().take();
                        if let Some(w) = waker {
                            let _ =
                                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| w.wake()));
                        }
                    }
                }
            }
        }
        // After the wake-ups: a caller queued for a permit then finds the key settled.
        drop(self.take_permit());
    }

    /// The load's permit, taken out of the flight (a flight that never got installed gives
    /// it back to its caller, who keeps its place).
    pub(crate) fn take_permit(&self) -> Option<Permit> {
        self.permit.lock().take()
    }

    /// Pushes `node` (an `Arc` reference given to the stack) unless the flight is complete;
    /// returns whether it did.
    fn push(&self, node: &Arc<Waiter>) -> bool {
        let raw = Arc::into_raw(Arc::clone(node)) as *mut Waiter;
        // Acquire pairs with the swap in `publish`; the head is never dereferenced here, and a
        // caller that finds it CLOSED reads the result through `result`, which loads it again.
        let mut head = self.waiters.load(Ordering::Acquire);
        loop {
            if head == closed() {
                // SAFETY: `raw` was never published; reclaim the stack's reference.
                drop(unsafe { Arc::from_raw(raw) });
                return false;
            }
            // SAFETY: `raw` is unpublished, so we are its only accessor.
            unsafe { (*raw).next = head };
            // Release pairs with the Acquire swap in `publish`, which reads the node's `next`
            // and fields; on failure, Acquire reads the new head (as the load above).
            match self.waiters.compare_exchange_weak(
                head,
                raw,
                Ordering::Release,
                Ordering::Acquire,
            ) {
                Ok(_) => return true,
                Err(h) => head = h,
            }
        }
    }

    /// Registers a future as a waiter: `None` if the result is already available.
    pub(crate) fn subscribe(&self) -> Option<Subscription> {
        if self.is_complete() {
            return None;
        }
        let node = Arc::new(Waiter {
            wake: Wake::Task(Mutex::new(None)),
            state: AtomicU8::new(WAITING),
            next: ptr::null(),
        });
        self.push(&node).then_some(Subscription(node))
    }

    /// Polls a subscription: the result once the completer has notified it, else `Pending`
    /// with `cx`'s waker stored for the completer (see the module docs for the ordering).
    pub(crate) fn poll_result(
        &self,
        sub: &Subscription,
        cx: &mut Context<'_>,
    ) -> Poll<&FlightResult<V>> {
        // Acquire pairs with the completer's AcqRel CAS to NOTIFIED (which follows its Release
        // close of the stack, so the result is readable).
        if sub.0.state.load(Ordering::Acquire) == NOTIFIED {
            return Poll::Ready(self.result().expect("notified after completion"));
        }
        if let Wake::Task(slot) = &sub.0.wake {
            let mut w = slot.lock();
            match &*w {
                Some(old) if old.will_wake(cx.waker()) => {}
                _ => *w = Some(cx.waker().clone()),
            }
        }
        // Acquire as above, now that the waker is stored (see the module docs).
        if sub.0.state.load(Ordering::Acquire) == NOTIFIED {
            return Poll::Ready(self.result().expect("notified after completion"));
        }
        Poll::Pending
    }

    /// Leaves a subscription before its result (a dropped or timed-out future): the completer
    /// will not wake it. A subscription already notified needs nothing.
    pub(crate) fn unsubscribe(&self, sub: &Subscription) {
        // AcqRel/Acquire as for a thread leaving at its deadline.
        let _ =
            sub.0
                .state
                .compare_exchange(WAITING, ABANDONED, Ordering::AcqRel, Ordering::Acquire);
        if let Wake::Task(slot) = &sub.0.wake {
            // Drop our waker now rather than when the flight goes.
            drop(slot.lock().take());
        }
    }

    /// Waits for the result until `deadline` (forever if `None`). `None` if the deadline passed
    /// first; the flight carries on for the others either way.
    pub(crate) fn wait(&self, deadline: Option<Instant>) -> Option<&FlightResult<V>> {
        if let Some(r) = self.result() {
            return Some(r);
        }
        let node = Arc::new(Waiter {
            wake: Wake::Thread(thread::current()),
            state: AtomicU8::new(WAITING),
            next: ptr::null(),
        });
        if !self.push(&node) {
            return self.result();
        }
        // Whether we have parked since we last saw WAITING: if not, the completer's unpark for
        // a NOTIFIED we see is still to come, and we absorb it.
        let mut parked = false;
        loop {
            // Acquire pairs with the completer's AcqRel CAS to NOTIFIED.
            if node.state.load(Ordering::Acquire) == NOTIFIED {
                if !parked {
                    thread::park();
                }
                return self.result();
            }
            parked = false;
            match deadline {
                None => {
                    thread::park();
                    parked = true;
                }
                Some(d) => {
                    let now = Instant::now();
                    // loom has no time: there, a waiter with a deadline gives up at its first
                    // check, which loom places at every point relative to the completion.
                    if now >= d || cfg!(herdcache_loom) {
                        // Pairs with the CAS to NOTIFIED in `publish`, which then skips this
                        // node; on failure (NOTIFIED), Acquire makes the result readable.
                        let left = node.state.compare_exchange(
                            WAITING,
                            ABANDONED,
                            Ordering::AcqRel,
                            Ordering::Acquire,
                        );
                        if left.is_ok() {
                            return self.result();
                        }
                        continue; // notified meanwhile: take the result
                    }
                    thread::park_timeout(d - now);
                    parked = true;
                }
            }
        }
    }
}

/// A future's place among a flight's waiters (see [`Flight::subscribe`]).
pub(crate) struct Subscription(Arc<Waiter>);

impl<V> Drop for Flight<V> {
    fn drop(&mut self) {
        // A flight is always completed before its last reference goes; if it was not (a bug),
        // free the nodes anyway rather than leak them.
        // Acquire pairs with the Release CAS in `push`, which `&mut self` already orders
        // before this load.
        let mut node = self.waiters.load(Ordering::Acquire);
        if node == closed() {
            return;
        }
        while !node.is_null() {
            // SAFETY: exclusive access; each node is an `Arc::into_raw` owned by the stack.
            let waiter = unsafe { Arc::from_raw(node as *const Waiter) };
            node = waiter.next as *mut Waiter;
        }
    }
}

/// What the local cache does with a load's value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Keep {
    /// Cache it, for at most this long (`None`: the cache's own expiry).
    For(Option<Duration>),
    /// Give it to the load's waiters only: it raced a write made elsewhere.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    No,
}

#[cfg(all(test, not(herdcache_loom)))]
mod tests {
    use super::*;
    use std::time::Duration;

    fn start(stale: Option<(u32, u64)>) -> Start<u32> {
        Start {
            stale,
            history: LoadHistory::default(),
            refresh: false,
            deadline: None,
            permit: None,
        }
    }

    #[test]
    fn only_the_first_completion_counts_and_it_gives_the_permit_back() {
        let limiter = Arc::new(crate::pacing::Limiter::new(1, None));
        let flight: Flight<u32> = Flight::new(Start {
            permit: limiter.try_acquire(),
            ..start(None)
        });
        assert!(
            limiter.try_acquire().is_none(),
            "the flight holds the only permit"
        );
        assert!(flight.complete(FlightResult::TimedOut));
        assert!(
            limiter.try_acquire().is_some(),
            "completion returns the permit"
        );
        // The hung leader finishing late changes nothing.
        assert!(!flight.complete(FlightResult::Value(9)));
        assert!(matches!(flight.result(), Some(FlightResult::TimedOut)));
    }

    #[test]
    fn every_waiter_gets_the_result_and_late_waiters_read_it_at_once() {
        let flight: Arc<Flight<u32>> = Arc::new(Flight::new(start(None)));
        let waiters: Vec<_> = (0..3)
            .map(|_| {
                let f = Arc::clone(&flight);
                std::thread::spawn(move || match f.wait(None) {
                    Some(FlightResult::Value(v)) => *v,
                    other => panic!("{other:?}"),
                })
            })
            .collect();
        assert!(flight.complete(FlightResult::Value(7)));
        for w in waiters {
            assert_eq!(w.join().unwrap(), 7);
        }
        assert!(matches!(flight.wait(None), Some(FlightResult::Value(7))));
    }

    #[test]
    fn a_waiter_past_its_deadline_leaves_and_the_flight_completes_anyway() {
        let flight: Flight<u32> = Flight::new(start(Some((1, 0))));
        let passed = Instant::now() - Duration::from_millis(1);
        assert!(flight.wait(Some(passed)).is_none());
        assert_eq!(flight.stale(), Some(&1));
        assert!(flight.complete(FlightResult::Panicked));
        assert!(matches!(flight.result(), Some(FlightResult::Panicked)));
        assert!(flight.led_by_current_thread());
    }
}
