//! The guard a table's methods take: an epoch guard known to be pinned on the collector
//! that retires the table's nodes.

use std::ops::Deref;

use crossbeam_epoch::Guard;

/// An epoch guard pinned on the collector of the table it is handed to (invariant 10 of
/// DESIGN.md §10).
///
/// The table retires replaced and removed nodes on the guard it is given, and hands out
/// references that live as long as that guard. Both are sound only if the guard belongs to
/// the table's collector: a guard of another collector neither delays the frees of this
/// one's retired nodes nor is delayed by this one's readers. So the table takes this type,
/// which only two places make:
/// - [`Table::verify`](super::Table::verify), which checks the guard's collector (the raw
///   API's users: tests, fuzzing, loom);
/// - the cache's domain ([`crate::local::Domain`]), which pins only its own collector, the
///   one its table was built with.
#[repr(transparent)]
#[derive(Debug)]
pub struct VerifiedGuard(Guard);

impl VerifiedGuard {
    /// `guard`, trusted to be pinned on the collector of every table it will be handed to.
    ///
    /// # Safety
    /// The caller pins `guard` on the collector of the tables it hands the result to. (Debug
    /// builds check it in every table operation.)
    #[inline]
    pub(crate) unsafe fn new_unchecked(guard: Guard) -> Self {
        VerifiedGuard(guard)
    }

    /// A reference to `guard`, verified (see [`new_unchecked`](Self::new_unchecked)).
    ///
    /// # Safety
    /// As for [`new_unchecked`](Self::new_unchecked).
    #[cfg(any(test, fuzzing, herdcache_loom))]
    #[inline]
    pub(crate) unsafe fn from_ref_unchecked(guard: &Guard) -> &Self {
        // SAFETY: `VerifiedGuard` is `repr(transparent)` over `Guard`, so the two references
        // have the same layout; the caller vouches for the collector.
        unsafe { &*(guard as *const Guard as *const VerifiedGuard) }
    }

    /// The epoch guard.
    #[inline]
    pub(crate) fn into_inner(self) -> Guard {
        self.0
    }
}

impl Deref for VerifiedGuard {
    type Target = Guard;

    #[inline]
    fn deref(&self) -> &Guard {
        &self.0
    }
}
