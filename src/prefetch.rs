//! A hint to the processor to start loading a cache line that is about to be read.
//!
//! A write at capacity reads lines that are rarely in cache: the key's home slot (its tag
//! byte and its pointer, in two arrays) and its counters in the frequency sketch. Asking for
//! them as soon as their addresses are known lets those misses overlap with the write's
//! other work (hashing, the clock, the node's allocation) instead of each waiting
//! alone when it is reached.
//!
//! A prefetch is not a memory access of the language: it may name any address, including
//! one already freed, and it has no effect on what any load or store sees.

/// Starts loading the cache line holding `p` into every cache level, where the platform has
/// such an instruction (x86-64; elsewhere, and under Miri or loom, it does nothing).
#[inline(always)]
pub(crate) fn prefetch<T>(p: *const T) {
    #[cfg(all(target_arch = "x86_64", not(miri), not(herdcache_loom)))]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        // SAFETY: `prefetch` reads nothing the program can observe and cannot fault, whatever
        // the address; SSE, which it needs, is part of x86-64's baseline.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(p.cast::<i8>()) };
    }
    #[cfg(not(all(target_arch = "x86_64", not(miri), not(herdcache_loom))))]
    let _ = p;
}
