//! Admission control for loads: a cache-wide count of permits, one per load in flight.
//!
//! Taking a permit is a CAS on the count; only a caller that finds none blocks, on a condition
//! variable (the miss path may wait, the hit path never comes here), or, for a future,
//! leaves its waker in the list under the same lock. A permit is released by dropping it, so
//! a panicking loader releases its permit too.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Instant;

/// The permits of one cache.
#[derive(Debug)]
pub(crate) struct Limiter {
    available: AtomicUsize,
    /// The futures waiting for a permit (all woken at each release; each then retries).
    lock: Mutex<Vec<Waker>>,
    freed: Condvar,
}

/// One load's permit; dropping it gives it back. It owns a handle on its limiter, so a load
/// handed to a spawner can carry it.
#[derive(Debug)]
pub(crate) struct Permit {
    limiter: Arc<Limiter>,
}

impl Drop for Permit {
    fn drop(&mut self) {
        // Release: the next holder sees whatever this load did (not needed by the cache,
        // which synchronises through the table, but a permit should behave like a lock).
        self.limiter.available.fetch_add(1, Ordering::Release);
        // Taking the lock orders this release before a waiter's check-then-wait: the waiter
        // either sees the permit in its check under the lock or is waiting for this notify
        // (or has left its waker for this release to take).
        let tasks =
            std::mem::take(&mut *self.limiter.lock.lock().unwrap_or_else(|e| e.into_inner()));
        self.limiter.freed.notify_one();
        for w in tasks {
            w.wake();
        }
    }
}

impl Limiter {
    pub(crate) fn new(permits: usize) -> Self {
        Limiter {
            available: AtomicUsize::new(permits),
            lock: Mutex::new(Vec::new()),
            freed: Condvar::new(),
        }
    }

    /// A permit if one is free now.
    pub(crate) fn try_acquire(self: &Arc<Self>) -> Option<Permit> {
        let mut n = self.available.load(Ordering::Relaxed);
        loop {
            if n == 0 {
                return None;
            }
            // Acquire pairs with the Release in `Permit::drop`.
            match self.available.compare_exchange_weak(
                n,
                n - 1,
                Ordering::Acquire,
                Ordering::Relaxed,
            ) {
                Ok(_) => {
                    return Some(Permit {
                        limiter: Arc::clone(self),
                    })
                }
                Err(current) => n = current,
            }
        }
    }

    /// A permit if one is free; otherwise `cx`'s waker is kept until the next release.
    pub(crate) fn poll_acquire(self: &Arc<Self>, cx: &mut Context<'_>) -> Poll<Permit> {
        if let Some(p) = self.try_acquire() {
            return Poll::Ready(p);
        }
        let mut tasks = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(p) = self.try_acquire() {
            return Poll::Ready(p);
        }
        if !tasks.iter().any(|w| w.will_wake(cx.waker())) {
            tasks.push(cx.waker().clone());
        }
        Poll::Pending
    }

    /// A permit, waiting until `deadline` (forever if `None`) for one to be freed.
    pub(crate) fn acquire(self: &Arc<Self>, deadline: Option<Instant>) -> Option<Permit> {
        if let Some(p) = self.try_acquire() {
            return Some(p);
        }
        let mut guard = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(p) = self.try_acquire() {
                return Some(p);
            }
            guard = match deadline {
                None => self.freed.wait(guard).unwrap_or_else(|e| e.into_inner()),
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        return None;
                    }
                    self.freed
                        .wait_timeout(guard, d - now)
                        .unwrap_or_else(|e| e.into_inner())
                        .0
                }
            };
        }
    }
}

#[cfg(all(test, not(herdcache_loom)))]
mod tests {
    use super::*;

    #[test]
    fn permits_are_bounded_and_returned_on_drop() {
        let l = Arc::new(Limiter::new(2));
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
        let l = Arc::new(Limiter::new(1));
        let held = l.try_acquire().unwrap();
        std::thread::scope(|s| {
            // Whichever runs first, the waiter must end up with the permit.
            let waiter = s.spawn(|| l.acquire(None).is_some());
            drop(held);
            assert!(waiter.join().unwrap());
        });
    }
}
