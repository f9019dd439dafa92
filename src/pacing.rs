//! Admission control for loads: a cache-wide count of permits, one per load in flight.
//!
//! Callers that find no permit queue in arrival order, and a released permit is handed to
//! the first of them (and only it is woken), as tokio's batch semaphore does: a release never
//! wakes a herd of waiters to fight over one permit, and nobody is passed over forever.
//!
//! With a `load_timeout`, a permit also has a deadline: a load past it has been timed out
//! (its flight detached, see `engine/lifecycle.rs`), so whoever next looks at the limiter
//! (a caller taking a permit, or a queued caller woken at that deadline) takes the permit
//! back and hands it on. A hung loader therefore holds its permit for at most
//! `load_timeout`, even if no caller ever touches its key again; its own release later
//! finds the permit gone and does nothing.
//!
//! Everything is under one mutex: only the miss path comes here, and it is about to run a
//! load, which costs far more than an uncontended lock. Hits never touch the limiter.

use std::collections::{BTreeSet, VecDeque};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use crate::sync::thread::{self, Thread};
use crate::sync::{AtomicBool, Mutex, MutexGuard, Ordering};

/// The permits of one cache.
#[derive(Debug)]
pub(crate) struct Limiter {
    state: Mutex<State>,
    permits: usize,
    /// How long a permit may be held (the cache's `load_timeout`).
    lease: Option<Duration>,
}

#[derive(Debug, Default)]
struct State {
    available: usize,
    /// Permits with a deadline, earliest first: `(deadline, id)`.
    leased: BTreeSet<(Instant, u64)>,
    next_id: u64,
    /// Callers waiting for a permit, first come first served.
    queue: VecDeque<Arc<Ticket>>,
}

/// A queued caller's place.
#[derive(Debug)]
struct Ticket {
    wake: Wake,
    /// Whether a permit was handed to it (written under the state lock). Its lease starts
    /// when the caller collects it, so a caller slow to be scheduled loses no load time, and
    /// a permit not yet collected is never taken back from under it.
    granted: AtomicBool,
}

#[derive(Debug)]
enum Wake {
    Thread(Thread),
    Task(Mutex<Option<Waker>>),
}

/// A permit's identity in `leased`, if it has a deadline.
type Lease = Option<(Instant, u64)>;

/// One load's permit; dropping it gives it back (to the first queued caller, if any). It
/// owns a handle on its limiter, so a load handed to a spawner can carry it.
#[derive(Debug)]
pub(crate) struct Permit {
    limiter: Arc<Limiter>,
    lease: Lease,
}

impl Permit {
    /// When this permit's lease ends (it is taken back then), if it has one: the load it
    /// admits must be done by then.
    pub(crate) fn deadline(&self) -> Option<Instant> {
        self.lease.map(|(at, _)| at)
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        let mut st = self.limiter.lock();
        let held = match self.lease {
            None => true,
            // Gone if it was taken back at its deadline: then it was handed on already.
            Some(key) => st.leased.remove(&key),
        };
        if held {
            let woken = self.limiter.hand_on(&mut st);
            drop(st);
            wake(woken);
        }
    }
}

fn wake(ticket: Option<Arc<Ticket>>) {
    if let Some(t) = ticket {
        match &t.wake {
            Wake::Thread(th) => th.unpark(),
            Wake::Task(slot) => {
                let w = slot.lock().take();
                if let Some(w) = w {
                    // Executor code: a panic must not lose the hand-off's other effects.
                    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| w.wake()));
                }
            }
        }
    }
}

/// A future's place in the queue, kept across polls; leaving it (drop) gives back a permit
/// handed to it meanwhile.
#[derive(Debug, Default)]
pub(crate) struct Queued {
    ticket: Option<(Arc<Limiter>, Arc<Ticket>)>,
    /// After a `Pending` poll: when a permit of a timed-out load can be taken back, the
    /// instant at which to poll again even if no release wakes the future.
    pub(crate) reclaim_at: Option<Instant>,
}

impl Drop for Queued {
    fn drop(&mut self) {
        if let Some((limiter, ticket)) = self.ticket.take() {
            limiter.leave(&ticket);
        }
    }
}

impl Limiter {
    pub(crate) fn new(permits: usize, lease: Option<Duration>) -> Self {
        Limiter {
            state: Mutex::new(State {
                available: permits,
                ..State::default()
            }),
            permits,
            lease,
        }
    }

    /// How long a permit may be held (the cache's `load_timeout`), if it has a limit.
    pub(crate) fn lease(&self) -> Option<Duration> {
        self.lease
    }

    /// How many permits there are in all.
    pub(crate) fn permits(&self) -> usize {
        self.permits
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock()
    }

    /// A new lease starting at `now`, recorded in `st`.
    fn lease_at(&self, st: &mut State, now: Instant) -> Lease {
        let deadline = now.checked_add(self.lease?)?;
        st.next_id += 1;
        let key = (deadline, st.next_id);
        st.leased.insert(key);
        Some(key)
    }

    /// A free permit goes to the first queued caller (returned, to be woken outside the
    /// lock), or back to the pool.
    fn hand_on(&self, st: &mut State) -> Option<Arc<Ticket>> {
        match st.queue.pop_front() {
            Some(t) => {
                // Relaxed: read only under the state lock, which orders it.
                t.granted.store(true, Ordering::Relaxed);
                Some(t)
            }
            None => {
                st.available += 1;
                None
            }
        }
    }

    /// Takes back the permits past their deadline (their loads have timed out) and hands
    /// them on; returns the callers to wake.
    fn reclaim(&self, st: &mut State, now: Instant) -> Vec<Arc<Ticket>> {
        let mut woken = Vec::new();
        while let Some(&key) = st.leased.first() {
            if key.0 > now {
                break;
            }
            st.leased.remove(&key);
            woken.extend(self.hand_on(st));
        }
        woken
    }

    /// When a queued caller should look again even if no release wakes it: at the earliest
    /// instant a permit can be taken back, and, with leases, within one lease from `now`
    /// however things look, since a permit handed to another queued caller that has not
    /// collected it yet starts its lease only when collected (and that caller may then hang
    /// with it, with nobody else left to take it back).
    fn next_reclaim(&self, st: &State, now: Instant) -> Option<Instant> {
        let within_a_lease = self.lease.and_then(|l| now.checked_add(l));
        match (st.leased.first().map(|k| k.0), within_a_lease) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// A permit, if one is free now and nobody is queued before us.
    pub(crate) fn try_acquire(self: &Arc<Self>) -> Option<Permit> {
        let now = Instant::now();
        let mut st = self.lock();
        let woken = self.reclaim(&mut st, now);
        let permit = self.take_free(&mut st, now);
        drop(st);
        woken.into_iter().for_each(|t| wake(Some(t)));
        permit
    }

    fn take_free(self: &Arc<Self>, st: &mut State, now: Instant) -> Option<Permit> {
        if st.available == 0 || !st.queue.is_empty() {
            return None;
        }
        st.available -= 1;
        let lease = self.lease_at(st, now);
        Some(Permit {
            limiter: Arc::clone(self),
            lease,
        })
    }

    /// The permit handed to `ticket`, if any, collected now (its lease starts now).
    fn granted(self: &Arc<Self>, st: &mut State, ticket: &Ticket, now: Instant) -> Option<Permit> {
        if !ticket.granted.swap(false, Ordering::Relaxed) {
            return None;
        }
        let lease = self.lease_at(st, now);
        Some(Permit {
            limiter: Arc::clone(self),
            lease,
        })
    }

    /// Leaves the queue (a caller past its deadline, or a dropped future); a permit handed
    /// to it meanwhile goes to the next caller.
    fn leave(self: &Arc<Self>, ticket: &Arc<Ticket>) {
        let mut st = self.lock();
        st.queue.retain(|t| !Arc::ptr_eq(t, ticket));
        let had = self.granted(&mut st, ticket, Instant::now());
        drop(st);
        // Dropped outside the lock: its drop takes it.
        drop(had);
    }

    /// A permit if one is free; otherwise queues `queued` (once) with `cx`'s waker, and
    /// returns the instant at which a permit could be taken back from a timed-out load (the
    /// caller should poll again then).
    pub(crate) fn poll_acquire(
        self: &Arc<Self>,
        queued: &mut Queued,
        cx: &mut Context<'_>,
    ) -> Poll<Permit> {
        let now = Instant::now();
        let mut st = self.lock();
        let woken = self.reclaim(&mut st, now);
        let ready = match &queued.ticket {
            Some((_, t)) => {
                let p = self.granted(&mut st, t, now);
                if p.is_none() {
                    if let Wake::Task(slot) = &t.wake {
                        *slot.lock() = Some(cx.waker().clone());
                    }
                } else {
                    queued.ticket = None;
                }
                p
            }
            None => match self.take_free(&mut st, now) {
                Some(p) => Some(p),
                None => {
                    let t = Arc::new(Ticket {
                        wake: Wake::Task(Mutex::new(Some(cx.waker().clone()))),
                        granted: AtomicBool::new(false),
                    });
                    st.queue.push_back(Arc::clone(&t));
                    queued.ticket = Some((Arc::clone(self), t));
                    None
                }
            },
        };
        let reclaim_at = self.next_reclaim(&st, now);
        drop(st);
        woken.into_iter().for_each(|t| wake(Some(t)));
        match ready {
            Some(p) => Poll::Ready(p),
            None => {
                queued.reclaim_at = reclaim_at;
                Poll::Pending
            }
        }
    }

    /// A permit, waiting in the queue until `deadline` (forever if `None`).
    pub(crate) fn acquire(self: &Arc<Self>, deadline: Option<Instant>) -> Option<Permit> {
        let now = Instant::now();
        let mut st = self.lock();
        let woken = self.reclaim(&mut st, now);
        if let Some(p) = self.take_free(&mut st, now) {
            drop(st);
            woken.into_iter().for_each(|t| wake(Some(t)));
            return Some(p);
        }
        let ticket = Arc::new(Ticket {
            wake: Wake::Thread(thread::current()),
            granted: AtomicBool::new(false),
        });
        st.queue.push_back(Arc::clone(&ticket));
        drop(st);
        woken.into_iter().for_each(|t| wake(Some(t)));
        loop {
            let now = Instant::now();
            let mut st = self.lock();
            let woken = self.reclaim(&mut st, now);
            let got = self.granted(&mut st, &ticket, now);
            let reclaim_at = self.next_reclaim(&st, now);
            drop(st);
            woken.into_iter().for_each(|t| wake(Some(t)));
            if got.is_some() {
                return got;
            }
            if deadline.is_some_and(|d| now >= d) {
                self.leave(&ticket);
                return None;
            }
            let until = match (deadline, reclaim_at) {
                (Some(d), Some(r)) => Some(d.min(r)),
                (d, r) => d.or(r),
            };
            match until {
                None => thread::park(),
                Some(u) => thread::park_timeout(u.saturating_duration_since(now)),
            }
        }
    }
}

#[cfg(all(test, not(herdcache_loom)))]
mod tests {
    use super::*;

    #[test]
    fn permits_are_bounded_and_returned_on_drop() {
        let l = Arc::new(Limiter::new(2, None));
        let a = l.try_acquire().unwrap();
        let _b = l.try_acquire().unwrap();
        assert!(l.try_acquire().is_none());
        assert!(
            l.acquire(Some(Instant::now())).is_none(),
            "deadline already passed"
        );
        drop(a);
        assert!(l.try_acquire().is_some());
    }

    #[test]
    fn a_waiter_gets_the_permit_another_thread_frees() {
        let l = Arc::new(Limiter::new(1, None));
        let held = l.try_acquire().unwrap();
        std::thread::scope(|s| {
            // Whichever runs first, the waiter must end up with the permit.
            let waiter = s.spawn(|| l.acquire(None).is_some());
            drop(held);
            assert!(waiter.join().unwrap());
        });
    }

    #[test]
    fn a_released_permit_goes_to_the_first_queued_caller_only() {
        let l = Arc::new(Limiter::new(1, None));
        let held = l.try_acquire().unwrap();
        let (mut first, mut second) = (Queued::default(), Queued::default());
        let waker = std::task::Waker::noop();
        let mut cx = Context::from_waker(waker);
        assert!(l.poll_acquire(&mut first, &mut cx).is_pending());
        assert!(l.poll_acquire(&mut second, &mut cx).is_pending());
        drop(held);
        // Nobody jumps the queue, and the second caller is still waiting.
        assert!(l.try_acquire().is_none());
        assert!(l.poll_acquire(&mut second, &mut cx).is_pending());
        let p = match l.poll_acquire(&mut first, &mut cx) {
            Poll::Ready(p) => p,
            Poll::Pending => panic!("the first queued caller must have the permit"),
        };
        drop(p);
        assert!(l.poll_acquire(&mut second, &mut cx).is_ready());
    }

    #[test]
    fn a_caller_leaving_the_queue_passes_a_permit_handed_to_it_on() {
        let l = Arc::new(Limiter::new(1, None));
        let held = l.try_acquire().unwrap();
        let (mut first, mut second) = (Queued::default(), Queued::default());
        let mut cx = Context::from_waker(std::task::Waker::noop());
        assert!(l.poll_acquire(&mut first, &mut cx).is_pending());
        assert!(l.poll_acquire(&mut second, &mut cx).is_pending());
        drop(held); // handed to `first`
        drop(first); // which leaves without taking it
        assert!(l.poll_acquire(&mut second, &mut cx).is_ready());
    }

    #[test]
    fn a_permit_handed_on_is_not_taken_back_before_its_caller_collects_it() {
        let lease = Duration::from_millis(20);
        let l = Arc::new(Limiter::new(1, Some(lease)));
        let held = l.try_acquire().unwrap();
        let mut first = Queued::default();
        let mut cx = Context::from_waker(std::task::Waker::noop());
        assert!(l.poll_acquire(&mut first, &mut cx).is_pending());
        drop(held); // handed to `first`, which is not polled for longer than a lease
        std::thread::sleep(2 * lease);
        assert!(
            l.try_acquire().is_none(),
            "the permit handed on is not free for the taking"
        );
        assert!(l.poll_acquire(&mut first, &mut cx).is_ready());
    }

    /// A queued thread that sees no lease to wait for (the only permit handed to a caller
    /// that has not collected it yet) still wakes within a lease: that caller may collect it
    /// and hang, and nobody else would ever take it back and wake the thread.
    #[test]
    fn a_queued_thread_wakes_to_take_back_a_lease_that_began_after_it_parked() {
        let lease = Duration::from_millis(20);
        let l = Arc::new(Limiter::new(1, Some(lease)));
        let first_hung = l.try_acquire().unwrap();
        let mut second = Queued::default();
        let mut cx = Context::from_waker(std::task::Waker::noop());
        assert!(l.poll_acquire(&mut second, &mut cx).is_pending());
        let (done, got) = std::sync::mpsc::channel();
        let waiter = {
            let l = Arc::clone(&l);
            std::thread::spawn(move || {
                let p = l.acquire(None);
                let _ = done.send(p.is_some());
                drop(p);
            })
        };
        // The first lease ends; whoever looks next hands its permit to `second` (queued
        // first), uncollected, leased to nobody: the waiter then has nothing to wake for.
        std::thread::sleep(3 * lease);
        drop(l.try_acquire());
        // `second` collects it and hangs with it: its lease ends a lease from now.
        let second_hung = match l.poll_acquire(&mut second, &mut cx) {
            Poll::Ready(p) => p,
            Poll::Pending => panic!("the permit taken back went to the first in the queue"),
        };
        let woke = got.recv_timeout(Duration::from_secs(30));
        assert_eq!(
            woke,
            Ok(true),
            "the waiter never took back the permit of a lease that ended after it parked"
        );
        drop((first_hung, second_hung));
        waiter.join().unwrap();
    }

    #[test]
    fn a_permit_past_its_lease_is_taken_back_and_its_late_release_is_ignored() {
        let l = Arc::new(Limiter::new(1, Some(Duration::ZERO)));
        let hung = l.try_acquire().unwrap();
        // The lease ended at once: the next caller takes the permit back.
        let next = l
            .try_acquire()
            .expect("a permit past its lease is reclaimed");
        drop(hung); // the hung load returns at last: nothing to give back
        let l2 = Arc::new(Limiter::new(1, Some(Duration::from_secs(3600))));
        let a = l2.try_acquire().unwrap();
        assert!(l2.try_acquire().is_none(), "a live lease is not reclaimed");
        drop(a);
        drop(next);
        assert!(l2.try_acquire().is_some());
    }
}

/// loom models of the hand-off: a released permit reaches the first queued caller, thread or
/// future, and is never lost, whatever the order of release, queueing and leaving. Leases
/// are off: loom has no time, and a lease only adds take-backs on the same paths.
#[cfg(all(test, herdcache_loom))]
mod models {
    use super::*;
    use std::task::Waker;

    fn all_permits_back(l: &Arc<Limiter>) {
        let p = l.try_acquire();
        assert!(p.is_some(), "a permit was lost");
        drop(p);
        assert_eq!(l.lock().available, l.permits(), "a permit was lost or made");
    }

    /// A limiter of one permit, that permit, and a future queued for it.
    fn a_future_queued_behind_the_permit() -> (Arc<Limiter>, Permit, Queued) {
        let l = Arc::new(Limiter::new(1, None));
        let held = l.try_acquire().expect("a free permit");
        let mut queued = Queued::default();
        let mut cx = Context::from_waker(Waker::noop());
        assert!(l.poll_acquire(&mut queued, &mut cx).is_pending());
        (l, held, queued)
    }

    /// Three threads through one permit: each gets it in turn (a release wakes the first
    /// queued thread, which never misses its unpark), and it ends free.
    #[test]
    fn threads_queued_on_one_permit_each_get_it() {
        loom::model(|| {
            let l = Arc::new(Limiter::new(1, None));
            let others: Vec<_> = (0..2)
                .map(|_| {
                    let l = Arc::clone(&l);
                    loom::thread::spawn(move || drop(l.acquire(None).expect("no deadline")))
                })
                .collect();
            drop(l.acquire(None).expect("no deadline"));
            for t in others {
                t.join().unwrap();
            }
            all_permits_back(&l);
        });
    }

    /// A queued future leaves (is dropped) while the permit is released towards it: the
    /// permit goes on to the thread queued behind it or back to the pool, never lost.
    #[test]
    fn a_future_leaving_as_the_permit_reaches_it_passes_it_on() {
        loom::model(|| {
            let (l, held, mut queued) = a_future_queued_behind_the_permit();
            let mut cx = Context::from_waker(Waker::noop());
            let l2 = Arc::clone(&l);
            let behind = loom::thread::spawn(move || drop(l2.acquire(None).expect("no deadline")));
            let releaser = loom::thread::spawn(move || drop(held));
            drop(queued);
            releaser.join().unwrap();
            behind.join().unwrap();
            all_permits_back(&l);
        });
    }

    /// A queued future polled again as the permit reaches it gets it or stays queued,
    /// and its permit, once collected and dropped, frees the limiter.
    #[test]
    fn a_future_polled_as_the_permit_reaches_it_collects_it() {
        loom::model(|| {
            let (l, held, mut queued) = a_future_queued_behind_the_permit();
            let mut cx = Context::from_waker(Waker::noop());
            let releaser = loom::thread::spawn(move || drop(held));
            let early = l.poll_acquire(&mut queued, &mut cx);
            releaser.join().unwrap();
            let permit = match early {
                Poll::Ready(p) => p,
                Poll::Pending => match l.poll_acquire(&mut queued, &mut cx) {
                    Poll::Ready(p) => p,
                    Poll::Pending => panic!("released, yet not handed to the queued future"),
                },
            };
            drop(permit);
            drop(queued);
            all_permits_back(&l);
        });
    }
}
