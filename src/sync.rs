//! The one place that chooses between `std` and `loom` primitives.
//!
//! Everything in the crate that is shared between threads imports its atomics from here, so
//! that building with `--cfg herdcache_loom` (together with `--cfg crossbeam_loom`, which makes
//! crossbeam-epoch itself use loom) puts every interleaving under the model checker.

#[cfg(herdcache_loom)]
pub(crate) use loom::sync::atomic::{AtomicU8, AtomicUsize, Ordering};

#[cfg(not(herdcache_loom))]
pub(crate) use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};

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
