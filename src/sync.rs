//! The one place that chooses between `std` and `loom` primitives.
//!
//! What the crate shares between threads imports its atomics, locks, condition variables,
//! cells and thread parking from here, so that building with `--cfg herdcache_loom`
//! (together with `--cfg crossbeam_loom`, which makes crossbeam-epoch itself use loom) puts
//! every interleaving under the model checker. Whole modules are swapped, std's or loom's,
//! behind one poison-free [`Mutex`] and [`Condvar`].
//!
//! Left on std, on purpose: the statistics' counters and the engine's settings read with
//! `Relaxed` (capacity, the sweep's count), which order no other access; under loom they
//! would multiply the interleavings of every model with nothing to check. And the fleet
//! tier's atomics: its threads block on Redis and never run under loom.

#[cfg(herdcache_loom)]
pub(crate) use loom::sync::atomic::{
    AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering,
};

#[cfg(not(herdcache_loom))]
pub(crate) use std::sync::atomic::{
    AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering,
};

#[cfg(herdcache_loom)]
use loom::sync as imp;
#[cfg(not(herdcache_loom))]
use std::sync as imp;

/// The guard of a [`Mutex`].
pub(crate) type MutexGuard<'a, T> = imp::MutexGuard<'a, T>;

/// A mutex that does not poison: `lock` hands out the guard even after a thread panicked
/// while holding it.
///
/// Poisoning protects data a panic left half-updated. No user code runs under the crate's
/// locks (invariant 9: user code runs only outside them, and debug builds check it), and the
/// crate's own code under them does not panic, so the data behind a lock is whole whenever
/// its holder unwinds; a poisoned lock would only pass one caller's panic on to every later
/// caller of the cache.
#[derive(Debug, Default)]
pub(crate) struct Mutex<T>(imp::Mutex<T>);

impl<T> Mutex<T> {
    pub(crate) fn new(value: T) -> Self {
        Mutex(imp::Mutex::new(value))
    }

    #[inline]
    pub(crate) fn lock(&self) -> MutexGuard<'_, T> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// A condition variable for [`Mutex`], poison-free like it.
#[derive(Debug, Default)]
pub(crate) struct Condvar(imp::Condvar);

impl Condvar {
    pub(crate) fn new() -> Self {
        Condvar(imp::Condvar::new())
    }

    pub(crate) fn wait<'a, T>(&self, guard: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
        self.0
            .wait(guard)
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Waits for a notification or for `timeout`; under loom, which has no time, only a
    /// notification ends the wait.
    pub(crate) fn wait_timeout<'a, T>(
        &self,
        guard: MutexGuard<'a, T>,
        timeout: std::time::Duration,
    ) -> MutexGuard<'a, T> {
        self.0
            .wait_timeout(guard, timeout)
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .0
    }

    pub(crate) fn notify_one(&self) {
        self.0.notify_one();
    }

    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn notify_all(&self) {
        self.0.notify_all();
    }
}

/// Spin-wait helper for the rare places that wait on another thread's bounded work.
pub(crate) use crossbeam_utils::Backoff;

/// Yields to the model checker under loom (a spin loop must yield there or it never ends), and
/// backs off exponentially on real hardware.
#[inline]
pub(crate) fn spin_wait(backoff: &Backoff) {
    #[cfg(herdcache_loom)]
    {
        let _ = backoff;
        loom::thread::yield_now();
    }
    #[cfg(not(herdcache_loom))]
    backoff.snooze();
}

/// An `UnsafeCell` with loom's closure-based access API, so that loom can check accesses.
#[cfg(not(herdcache_loom))]
#[derive(Debug)]
pub(crate) struct UnsafeCell<T>(std::cell::UnsafeCell<T>);

#[cfg(not(herdcache_loom))]
impl<T> UnsafeCell<T> {
    pub(crate) fn new(value: T) -> Self {
        UnsafeCell(std::cell::UnsafeCell::new(value))
    }

    #[inline]
    pub(crate) fn with<R>(&self, f: impl FnOnce(*const T) -> R) -> R {
        f(self.0.get())
    }

    #[inline]
    pub(crate) fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
        f(self.0.get())
    }
}

#[cfg(herdcache_loom)]
pub(crate) use loom::cell::UnsafeCell;

/// Thread identity and parking.
pub(crate) mod thread {
    #[cfg(herdcache_loom)]
    pub(crate) use loom::thread::{current, park, Thread};
    #[cfg(not(herdcache_loom))]
    pub(crate) use std::thread::{current, park, park_timeout, Thread};

    #[cfg(not(herdcache_loom))]
    std::thread_local! {
        static TOKEN: u8 = const { 0 };
    }

    /// A number unique to the calling thread among live threads (never 0): the address of a
    /// thread-local.
    #[cfg(not(herdcache_loom))]
    pub(crate) fn token() -> usize {
        TOKEN
            .try_with(|t| t as *const u8 as usize)
            .unwrap_or(usize::MAX)
    }

    /// Under loom (where model threads share one OS thread, and loom's thread-locals give no
    /// stable addresses): a hash of the model thread's id, never 0.
    #[cfg(herdcache_loom)]
    pub(crate) fn token() -> usize {
        use std::hash::{BuildHasher, BuildHasherDefault};
        let hasher = BuildHasherDefault::<std::collections::hash_map::DefaultHasher>::default();
        (hasher.hash_one(current().id()) as usize) | 1
    }

    /// loom has no time; the flight never parks with a timeout under loom (a waiter with a
    /// deadline gives up at its first check there), so this is never reached.
    #[cfg(herdcache_loom)]
    pub(crate) fn park_timeout(_: std::time::Duration) {
        loom::thread::yield_now();
    }
}

#[cfg(all(debug_assertions, not(herdcache_loom)))]
std::thread_local! {
    /// How many sections where no user code may run (`NoUserCode`) this thread is in.
    static QUIET: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// While it lives, the thread is in a section where no user code may run: a policy lock,
/// under which a user's `Drop`, listener or weigher could deadlock on the cache or see the
/// policy half updated (invariant 9 of DESIGN.md). Debug builds check it where user code
/// runs, or may run, with [`user_code_may_run`]; release builds keep nothing. (Not under
/// loom, whose model threads share one OS thread's locals.)
#[derive(Debug)]
pub(crate) struct NoUserCode(());

impl NoUserCode {
    #[inline]
    pub(crate) fn enter() -> Self {
        #[cfg(all(debug_assertions, not(herdcache_loom)))]
        let _ = QUIET.try_with(|q| q.set(q.get() + 1));
        NoUserCode(())
    }
}

impl Drop for NoUserCode {
    #[inline]
    fn drop(&mut self) {
        #[cfg(all(debug_assertions, not(herdcache_loom)))]
        let _ = QUIET.try_with(|q| q.set(q.get() - 1));
    }
}

/// In debug builds, panics if the thread is in a [`NoUserCode`] section: `what` runs user
/// code, or may (a collection of retired entries runs their destructors). The message also
/// goes straight to the standard error, which a test harness does not capture: under a
/// policy lock the panic aborts the process, and a captured message would be lost with it.
#[inline]
#[track_caller]
pub(crate) fn user_code_may_run(what: &str) {
    #[cfg(all(debug_assertions, not(herdcache_loom)))]
    {
        let quiet = QUIET.try_with(std::cell::Cell::get).unwrap_or(0);
        if quiet != 0 {
            let at = std::panic::Location::caller();
            let message = format!("herdcache: {what} under a policy lock (invariant 9), at {at}");
            let _ = std::io::Write::write_all(
                &mut std::io::stderr(),
                format!("{message}\n").as_bytes(),
            );
            panic!("{message}");
        }
    }
    #[cfg(not(all(debug_assertions, not(herdcache_loom))))]
    let _ = what;
}
