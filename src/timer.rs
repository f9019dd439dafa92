//! Wake-ups at an instant for futures, without a runtime: what lets a future that waits on a
//! load (or for a load permit) notice the load's deadline, and an inline loader future be
//! cancelled at it.
//!
//! One thread per process, started the first time a future needs a wake-up (so only by
//! caches with a `load_timeout`), keeps the pending wake-ups in a heap ordered by instant and
//! sleeps on a condition variable until the earliest. A [`Sleep`] registers once and updates
//! its waker on later polls; dropping it clears the waker, and the thread discards the spent
//! registration when its instant comes. So the heap holds at most one registration per live
//! or recently dropped `Sleep`, each gone by its instant.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::task::{Context, Poll, Waker};
use std::time::Instant;

/// One registered wake-up.
struct Registration {
    waker: Mutex<Option<Waker>>,
}

struct Entry {
    at: Instant,
    seq: u64,
    registration: Arc<Registration>,
}

impl PartialEq for Entry {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}
impl Eq for Entry {}
impl PartialOrd for Entry {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Entry {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.at, self.seq).cmp(&(other.at, other.seq))
    }
}

#[derive(Default)]
struct Heap {
    entries: BinaryHeap<Reverse<Entry>>,
    seq: u64,
}

struct Timer {
    heap: Mutex<Heap>,
    changed: Condvar,
}

fn timer() -> &'static Timer {
    static TIMER: OnceLock<&'static Timer> = OnceLock::new();
    TIMER.get_or_init(|| {
        let t: &'static Timer = Box::leak(Box::new(Timer {
            heap: Mutex::new(Heap::default()),
            changed: Condvar::new(),
        }));
        std::thread::Builder::new()
            .name("herdcache-timer".into())
            .spawn(move || t.run())
            .expect("herdcache: cannot start its timer thread");
        t
    })
}

impl Timer {
    fn run(&self) {
        let mut heap = self.heap.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            let now = Instant::now();
            let mut due = Vec::new();
            while heap.entries.peek().is_some_and(|e| e.0.at <= now) {
                due.push(heap.entries.pop().expect("peeked").0.registration);
            }
            if !due.is_empty() {
                // Wakers run executor code: never under the heap's lock.
                drop(heap);
                for r in due {
                    let waker = r.waker.lock().unwrap_or_else(|e| e.into_inner()).take();
                    if let Some(w) = waker {
                        // A waker is executor code: if it panics, this thread must live on
                        // for every other deadline of the process.
                        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| w.wake()));
                    }
                }
                heap = self.heap.lock().unwrap_or_else(|e| e.into_inner());
                continue;
            }
            heap = match heap.entries.peek().map(|e| e.0.at) {
                None => self.changed.wait(heap).unwrap_or_else(|e| e.into_inner()),
                Some(at) => {
                    self.changed
                        .wait_timeout(heap, at.saturating_duration_since(now))
                        .unwrap_or_else(|e| e.into_inner())
                        .0
                }
            };
        }
    }

    fn register(&self, at: Instant, registration: Arc<Registration>) {
        let mut heap = self.heap.lock().unwrap_or_else(|e| e.into_inner());
        heap.seq += 1;
        let seq = heap.seq;
        let earliest = heap.entries.peek().is_none_or(|e| at < e.0.at);
        heap.entries.push(Reverse(Entry {
            at,
            seq,
            registration,
        }));
        if earliest {
            self.changed.notify_one();
        }
    }
}

/// A future that completes at `at`.
pub(crate) struct Sleep {
    at: Instant,
    registration: Option<Arc<Registration>>,
}

impl Sleep {
    pub(crate) fn until(at: Instant) -> Self {
        Sleep {
            at,
            registration: None,
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
        if Instant::now() >= this.at {
            return Poll::Ready(());
        }
        match &this.registration {
            Some(r) => {
                let mut w = r.waker.lock().unwrap_or_else(|e| e.into_inner());
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
                timer().register(this.at, Arc::clone(&r));
                this.registration = Some(r);
            }
        }
        // The thread may have fired (taking the waker) before we stored ours: check again,
        // so that wake-up is not lost.
        if Instant::now() >= this.at {
            return Poll::Ready(());
        }
        Poll::Pending
    }
}

impl Drop for Sleep {
    fn drop(&mut self) {
        if let Some(r) = &self.registration {
            drop(r.waker.lock().unwrap_or_else(|e| e.into_inner()).take());
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
