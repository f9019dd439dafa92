//! Wake-ups at an instant for futures, without a runtime: what lets a future that waits on a
//! load (or for a load permit) notice the load's deadline, and an inline loader future be
//! cancelled at it.
//!
//! One thread per process, started with the first deadline a future sets (so only by
//! caches with a `load_timeout`), keeps the pending wake-ups in a map ordered by instant and
//! sleeps on a condition variable until the earliest. A [`Sleep`] registers once, when it is
//! first polled before its instant, and updates its waker on later polls; dropping it takes
//! its registration out of the map. So the map holds exactly the registrations of live
//! `Sleep`s that are still to fire: memory follows the loads in flight, not how many loads
//! there have been, however long their deadlines.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll, Waker};
use std::time::Instant;

use crate::sync::{Condvar, Mutex, MutexGuard};

/// One registered wake-up: the waker of the `Sleep`'s latest poll, taken when it fires.
struct Registration {
    waker: Mutex<Option<Waker>>,
}

/// A registration's place in the map: its instant, then the order of registration.
type Slot = (Instant, u64);

#[derive(Default)]
struct Pending {
    by_instant: BTreeMap<Slot, Arc<Registration>>,
    seq: u64,
}

/// The wake-ups of the process (a test may run one of its own).
pub(crate) struct Timer {
    pending: Mutex<Pending>,
    changed: Condvar,
    /// The clock the timer and its sleeps read: `Instant::now`, or a model's clock.
    now: fn() -> Instant,
}

/// The process's timer, its thread started on first use.
fn timer() -> &'static Timer {
    static TIMER: OnceLock<&'static Timer> = OnceLock::new();
    TIMER.get_or_init(|| Timer::start().expect("herdcache: cannot start its timer thread"))
}

impl Timer {
    /// A timer with a thread of its own that runs for the rest of the process.
    fn start() -> std::io::Result<&'static Timer> {
        let t: &'static Timer = Box::leak(Box::new(Timer::new(Instant::now)));
        std::thread::Builder::new()
            .name("herdcache-timer".into())
            .spawn(move || t.run())?;
        Ok(t)
    }

    fn new(now: fn() -> Instant) -> Self {
        Timer {
            pending: Mutex::new(Pending::default()),
            changed: Condvar::new(),
            now,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Pending> {
        self.pending.lock()
    }

    fn run(&self) {
        let mut pending = self.lock();
        loop {
            let now = (self.now)();
            let due = Self::take_due(&mut pending, now);
            if !due.is_empty() {
                // Wakers run executor code: never under the map's lock.
                drop(pending);
                Self::fire(due);
                pending = self.lock();
                continue;
            }
            pending = match pending.by_instant.first_key_value().map(|(slot, _)| slot.0) {
                None => self.changed.wait(pending),
                Some(at) => self
                    .changed
                    .wait_timeout(pending, at.saturating_duration_since(now)),
            };
        }
    }

    /// Takes out the registrations due at `now`.
    fn take_due(pending: &mut Pending, now: Instant) -> Vec<Arc<Registration>> {
        let mut due = Vec::new();
        while let Some(entry) = pending.by_instant.first_entry() {
            if entry.key().0 > now {
                break;
            }
            due.push(entry.remove());
        }
        due
    }

    /// Wakes the tasks of `due` (outside the map's lock).
    fn fire(due: Vec<Arc<Registration>>) {
        for r in due {
            let waker = r.waker.lock().take();
            if let Some(w) = waker {
                // A waker is executor code: if it panics, the timer must live on for every
                // other deadline of the process.
                let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| w.wake()));
            }
        }
    }

    /// One turn of the thread's loop without its wait: fires what is due now (the models
    /// run it on a thread of theirs).
    #[cfg(all(test, herdcache_loom))]
    fn fire_due(&self) {
        let due = Self::take_due(&mut self.lock(), (self.now)());
        Self::fire(due);
    }

    /// Registers a wake-up at `at`; returns its place, to cancel it with.
    fn register(&self, at: Instant, registration: Arc<Registration>) -> Slot {
        let mut pending = self.lock();
        pending.seq += 1;
        let slot = (at, pending.seq);
        let earliest = pending
            .by_instant
            .first_key_value()
            .is_none_or(|(first, _)| slot < *first);
        pending.by_instant.insert(slot, registration);
        if earliest {
            self.changed.notify_one();
        }
        slot
    }

    /// Takes a registration out (its `Sleep` was dropped), if it has not fired yet.
    fn cancel(&self, slot: Slot) {
        let gone = self.lock().by_instant.remove(&slot);
        // Dropped outside the lock: it may hold the last reference to a waker.
        drop(gone);
    }

    /// Registrations waiting to fire.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().by_instant.len()
    }
}

/// A future that completes at `at`.
pub(crate) struct Sleep {
    at: Instant,
    registration: Option<(Arc<Registration>, Slot)>,
    timer: &'static Timer,
}

impl Sleep {
    /// A sleep on the process's timer (its thread starts with the first sleep).
    pub(crate) fn until(at: Instant) -> Self {
        Self::on(timer(), at)
    }

    /// A sleep on `timer`.
    fn on(timer: &'static Timer, at: Instant) -> Self {
        Sleep {
            at,
            registration: None,
            timer,
        }
    }

    /// The instant it completes at.
    pub(crate) fn at(&self) -> Instant {
        self.at
    }
}

impl Future for Sleep {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        let now = this.timer.now;
        if now() >= this.at {
            return Poll::Ready(());
        }
        match &this.registration {
            Some((r, _)) => {
                let mut w = r.waker.lock();
                match &*w {
                    Some(old) if old.will_wake(cx.waker()) => {}
                    // `None`: the thread fired between our check of the clock and now, or
                    // this is a poll after a spurious wake; store the waker and look again.
                    _ => *w = Some(cx.waker().clone()),
                }
            }
            None => {
                let r = Arc::new(Registration {
                    waker: Mutex::new(Some(cx.waker().clone())),
                });
                let slot = this.timer.register(this.at, Arc::clone(&r));
                this.registration = Some((r, slot));
            }
        }
        // The thread may have fired (taking the waker) before we stored ours: check again,
        // so that wake-up is not lost.
        if now() >= this.at {
            return Poll::Ready(());
        }
        Poll::Pending
    }
}

impl Drop for Sleep {
    fn drop(&mut self) {
        if let Some((_, slot)) = self.registration.take() {
            self.timer.cancel(slot);
        }
    }
}

/// A future polled with a deadline: `None` if the deadline came first (the inner future is
/// then no longer polled; its owner drops it).
pub(crate) struct OrDeadline<F> {
    pub(crate) inner: F,
    pub(crate) sleep: Option<Sleep>,
}

impl<F: Future + Unpin> Future for OrDeadline<F> {
    type Output = Option<F::Output>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        if let Poll::Ready(v) = Pin::new(&mut this.inner).poll(cx) {
            return Poll::Ready(Some(v));
        }
        let passed = match &mut this.sleep {
            Some(s) => Pin::new(s).poll(cx).is_ready(),
            None => false,
        };
        if passed {
            Poll::Ready(None)
        } else {
            Poll::Pending
        }
    }
}

#[cfg(all(test, not(herdcache_loom), not(miri)))]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::Wake;
    use std::time::Duration;

    struct Count(AtomicUsize, std::thread::Thread);
    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
            self.1.unpark();
        }
    }

    #[test]
    fn a_sleep_wakes_its_task_at_its_instant_and_not_before() {
        let count = Arc::new(Count(AtomicUsize::new(0), std::thread::current()));
        let waker = Waker::from(Arc::clone(&count));
        let mut cx = Context::from_waker(&waker);
        let at = Instant::now() + Duration::from_millis(20);
        let mut sleep = Sleep::until(at);
        assert!(Pin::new(&mut sleep).poll(&mut cx).is_pending());
        let bound = Instant::now() + Duration::from_secs(10);
        while count.0.load(Ordering::SeqCst) == 0 {
            assert!(
                Instant::now() < bound,
                "the timer did not wake the task within 10 s"
            );
            std::thread::park_timeout(Duration::from_millis(50));
        }
        assert!(Instant::now() >= at);
        assert!(Pin::new(&mut sleep).poll(&mut cx).is_ready());
    }

    /// A timer of the test's own, so that other tests' sleeps do not count.
    fn own_timer() -> &'static Timer {
        static OWN: OnceLock<&'static Timer> = OnceLock::new();
        OWN.get_or_init(|| Timer::start().expect("a timer thread"))
    }

    #[test]
    fn a_dropped_sleep_leaves_nothing_registered() {
        let count = Arc::new(Count(AtomicUsize::new(0), std::thread::current()));
        let waker = Waker::from(Arc::clone(&count));
        let mut cx = Context::from_waker(&waker);
        // Loads with an hour's `load_timeout` that end at once: their deadlines are far off,
        // and none of them may stay behind in the timer.
        let at = Instant::now() + Duration::from_secs(3600);
        for _ in 0..10_000 {
            let mut sleep = Sleep::on(own_timer(), at);
            assert!(Pin::new(&mut sleep).poll(&mut cx).is_pending());
            drop(sleep);
        }
        assert_eq!(own_timer().len(), 0, "registrations outlived their sleeps");
        let mut live = Sleep::on(own_timer(), at);
        assert!(Pin::new(&mut live).poll(&mut cx).is_pending());
        assert_eq!(own_timer().len(), 1);
        drop(live);
        assert_eq!(own_timer().len(), 0);
    }

    #[test]
    fn a_dropped_sleep_wakes_nobody() {
        let count = Arc::new(Count(AtomicUsize::new(0), std::thread::current()));
        let waker = Waker::from(Arc::clone(&count));
        let mut cx = Context::from_waker(&waker);
        let mut sleep = Sleep::until(Instant::now() + Duration::from_millis(5));
        assert!(Pin::new(&mut sleep).poll(&mut cx).is_pending());
        drop(sleep);
        // A later sleep's wake-up proves the thread went past the dropped one's instant.
        let mut later = Sleep::until(Instant::now() + Duration::from_millis(30));
        assert!(Pin::new(&mut later).poll(&mut cx).is_pending());
        let bound = Instant::now() + Duration::from_secs(10);
        while count.0.load(Ordering::SeqCst) == 0 {
            assert!(Instant::now() < bound, "the timer did not fire within 10 s");
            std::thread::park_timeout(Duration::from_millis(50));
        }
        assert_eq!(
            count.0.load(Ordering::SeqCst),
            1,
            "only the live sleep woke"
        );
    }
}

/// loom models of the races between a sleep's poll or drop and the timer firing it. They
/// run one turn of the timer's loop ([`Timer::fire_due`]) on a model thread, on a clock the
/// model moves, since loom has no time (the loop's waits are plain condition-variable waits).
#[cfg(all(test, herdcache_loom))]
mod models {
    use super::*;
    use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::SeqCst};
    use std::task::Wake;
    use std::time::Duration;

    /// The models' clock: milliseconds after a fixed instant. Plain std atomics: loom runs one
    /// model thread at a time, and each model sets it before it starts its threads.
    static MS: AtomicU64 = AtomicU64::new(0);
    static BASE: OnceLock<Instant> = OnceLock::new();

    fn model_now() -> Instant {
        *BASE.get_or_init(Instant::now) + Duration::from_millis(MS.load(SeqCst))
    }

    fn model_timer() -> &'static Timer {
        MS.store(0, SeqCst);
        // One per execution, for the rest of the test process: a sleep keeps a `&'static`.
        Box::leak(Box::new(Timer::new(model_now)))
    }

    #[derive(Default)]
    struct Count(AtomicUsize);
    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, SeqCst);
        }
    }

    fn waker() -> (Arc<Count>, Waker) {
        let count = Arc::new(Count::default());
        (Arc::clone(&count), Waker::from(count))
    }

    /// A new model timer, and a sleep on it 10 ms away, polled once (so registered) with a
    /// waker that counts its wakes.
    fn a_registered_sleep() -> (&'static Timer, Sleep, Arc<Count>) {
        let timer = model_timer();
        let mut sleep = Sleep::on(timer, model_now() + Duration::from_millis(10));
        let (count, w) = waker();
        assert!(Pin::new(&mut sleep)
            .poll(&mut Context::from_waker(&w))
            .is_pending());
        (timer, sleep, count)
    }

    /// The instant passes and the timer fires while the task polls again with a new waker:
    /// a poll that returns `Pending` has left a waker the timer wakes, so no wake-up is lost
    /// between the poll's look at the clock and its storing of the waker.
    #[test]
    fn a_poll_racing_the_timer_loses_no_wake_up() {
        loom::model(|| {
            let (timer, mut sleep, first) = a_registered_sleep();
            let fires = loom::thread::spawn(move || {
                MS.store(10, SeqCst);
                timer.fire_due();
            });
            let (second, w2) = waker();
            let polled = Pin::new(&mut sleep).poll(&mut Context::from_waker(&w2));
            fires.join().unwrap();
            let (woke_first, woke_second) = (first.0.load(SeqCst), second.0.load(SeqCst));
            if polled.is_pending() {
                // The poll saw the clock before the instant both times it looked, so the
                // fire came after it had stored its waker: that waker is the one woken.
                assert_eq!((woke_first, woke_second), (0, 1), "the wake-up was lost");
            } else {
                assert!(
                    woke_first + woke_second <= 1,
                    "one registration fired twice"
                );
            }
            drop(sleep);
            assert_eq!(timer.len(), 0, "a registration outlived its sleep");
        });
    }

    /// A sleep dropped while the timer fires it: each waker woken at most once, and nothing
    /// stays registered.
    #[test]
    fn a_sleep_dropped_as_it_fires_leaves_nothing_behind() {
        loom::model(|| {
            let (timer, sleep, count) = a_registered_sleep();
            MS.store(10, SeqCst);
            let fires = loom::thread::spawn(move || timer.fire_due());
            drop(sleep);
            fires.join().unwrap();
            assert!(count.0.load(SeqCst) <= 1);
            assert_eq!(timer.len(), 0, "a registration outlived its sleep");
        });
    }
}
