//! One allocation of slots: tag bytes, slot pointers, and the state of a migration out of it.

use crossbeam_epoch::{Atomic, Guard, Shared};
use crossbeam_utils::CachePadded;

use super::node::{Node, SlotBits, TAG_EMPTY};
use crate::sync::{AtomicU8, AtomicUsize, Ordering};

/// Slots copied per claim during a migration: large enough that claiming is rare, small
/// enough that a writer waiting for the migration to finish waits for little work. (Tiny
/// under loom, so that models see a migration split between threads.)
pub(crate) const COPY_CHUNK: usize = if cfg!(herdcache_loom) { 2 } else { 64 };

/// Smallest array, in slots (tiny under loom, so that models can fill one).
pub(crate) const MIN_SLOTS: usize = if cfg!(herdcache_loom) { 4 } else { 16 };

/// Entries of head room a migration target gets beyond the live count, for the writers that
/// race the start of the migration (see [`SlotArray::place_copy`]).
pub(super) const HEADROOM: usize = if cfg!(herdcache_loom) { 2 } else { 64 };

/// A fixed-size array of slots. Arrays are linked by `next` while a migration (a resize or a
/// same-size rehash that drops tombstones) is in progress.
pub(crate) struct SlotArray<K, V> {
    pub(crate) mask: usize,
    /// One byte per slot, see [`super::node::tag_of`]; written once, after the slot's claim.
    pub(crate) tags: Box<[AtomicU8]>,
    pub(crate) slots: Box<[Atomic<Node<K, V>>]>,
    /// Slots ever claimed in this array (live entries plus tombstones): the load factor. On a
    /// line of its own, away from `mask`, `tags` and `slots`, which every read loads: each
    /// insert of a new key bumps it.
    pub(crate) claimed: CachePadded<AtomicUsize>,
    /// The array this one migrates into, once a migration has started.
    pub(crate) next: Atomic<SlotArray<K, V>>,
    /// Next chunk of slots to copy, claimed by `fetch_add`.
    pub(crate) copy_cursor: AtomicUsize,
    /// Slots whose copy has finished; the migration is complete when it equals `len()`.
    pub(crate) copied: AtomicUsize,
}

#[cfg(test)]
std::thread_local! {
    /// Arrays allocated and not yet dropped by this thread: the table's tests check that a
    /// table frees the arrays it outgrew.
    pub(crate) static ALIVE: std::cell::Cell<isize> = const { std::cell::Cell::new(0) };
}

#[cfg(test)]
impl<K, V> Drop for SlotArray<K, V> {
    fn drop(&mut self) {
        ALIVE.with(|n| n.set(n.get() - 1));
    }
}

impl<K, V> SlotArray<K, V> {
    /// An empty array with `slots` slots (a power of two, at least [`MIN_SLOTS`]).
    pub(crate) fn new(slots: usize) -> Self {
        Self::try_new(slots).expect("herdcache: out of memory for the table's slots")
    }

    /// An array of `slots` slots, or `None` if the memory for it cannot be had.
    pub(crate) fn try_new(slots: usize) -> Option<Self> {
        debug_assert!(slots.is_power_of_two() && slots >= MIN_SLOTS);
        let mut tags = Vec::new();
        tags.try_reserve_exact(slots).ok()?;
        tags.extend((0..slots).map(|_| AtomicU8::new(TAG_EMPTY)));
        let mut cells = Vec::new();
        cells.try_reserve_exact(slots).ok()?;
        cells.extend((0..slots).map(|_| Atomic::null()));
        #[cfg(test)]
        ALIVE.with(|n| n.set(n.get() + 1));
        Some(SlotArray {
            mask: slots - 1,
            tags: tags.into_boxed_slice(),
            slots: cells.into_boxed_slice(),
            claimed: CachePadded::new(AtomicUsize::new(0)),
            next: Atomic::null(),
            copy_cursor: AtomicUsize::new(0),
            copied: AtomicUsize::new(0),
        })
    }

    /// Number of slots.
    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.mask + 1
    }

    /// Array size for a new table expected to hold `entries`: under the claim limit.
    pub(crate) fn initial_size(entries: usize) -> usize {
        entries
            .saturating_mul(4)
            .div_ceil(3)
            .saturating_add(1)
            .checked_next_power_of_two()
            .unwrap_or(1 << (usize::BITS - 1))
            .max(MIN_SLOTS)
    }

    /// Claimed slots at which a writer stops claiming and starts a migration (3/4 full).
    #[inline]
    pub(crate) fn claim_limit(&self) -> usize {
        self.len() - self.len() / 4
    }

    /// Array size that holds `live` entries at a load factor of at most 1/2, with head room for
    /// the writers that race the start of a migration, and room to grow by a quarter, but
    /// not past `bound` entries: a table that holds about all it may (a cache at its
    /// capacity, which replaces as many entries as it takes) migrates to shed tombstones,
    /// and room for entries it will not hold would only cost memory (up to twice the slots,
    /// by the rounding to a power of two).
    pub(crate) fn size_for(live: usize, bound: usize) -> usize {
        let room = (live / 4).min(bound.saturating_sub(live));
        let want = live.saturating_add(room).saturating_add(HEADROOM);
        want.saturating_mul(2)
            .checked_next_power_of_two()
            .unwrap_or(1 << (usize::BITS - 1))
            .max(MIN_SLOTS)
    }

    /// Probes this array for the key whose hash is `hash` (tag byte `tag`) and which
    /// satisfies `eq`: its node and whether its slot is frozen, or `None` when the probe
    /// reaches an unclaimed slot (or covers the whole array) without finding it.
    ///
    /// A slot claimed but whose tag is not yet stored is examined like a tag match: stopping
    /// there would make lookups miss a key that writers see, so a caller that loads on a miss
    /// would retry until the claiming writer runs again.
    #[inline(always)]
    pub(crate) fn find<'g>(
        &self,
        hash: u64,
        tag: u8,
        eq: &mut impl FnMut(&Node<K, V>) -> bool,
        guard: &'g Guard,
    ) -> Option<(&'g Node<K, V>, bool)> {
        let home = hash as usize & self.mask;
        let mut i = home;
        loop {
            // SAFETY: `i <= mask`, and both boxes hold `mask + 1` elements.
            let (tag_slot, slot) =
                unsafe { (self.tags.get_unchecked(i), self.slots.get_unchecked(i)) };
            // Acquire pairs with the Release tag store after a claim (`Table::update_node`,
            // `place_copy`): seeing the tag means seeing the slot's claim.
            let t = tag_slot.load(Ordering::Acquire);
            if t == tag || t == TAG_EMPTY {
                // Acquire pairs with the Release CAS that published the node (a claim or
                // replace in `Table::update_node`, or `place_copy`), also through a freeze,
                // an RMW, which continues that CAS's release sequence.
                let p = slot.load(Ordering::Acquire, guard);
                // SAFETY: a non-null slot pointer is a node that is not yet reclaimed: it is
                // retired only after being unlinked, and the caller's guard keeps it alive
                // since. (`as_ref` ignores the tag bits.)
                match unsafe { p.as_ref() } {
                    Some(node) if node.hash == hash && eq(node) => {
                        return Some((node, p.tag() & SlotBits::FROZEN != 0));
                    }
                    Some(_) => {} // another key
                    // Unclaimed (possibly frozen empty): the probe ends. A null pointer with
                    // the tombstone bit was claimed and removed: probe on.
                    None if t == TAG_EMPTY && p.tag() & SlotBits::TOMBSTONE == 0 => return None,
                    None => {}
                }
            }
            i = (i + 1) & self.mask;
            if i == home {
                return None; // every slot examined
            }
        }
    }

    /// Whether every slot of this array has been copied into `next`.
    ///
    /// Acquire: pairs with the Release `fetch_add` of every copier (`Table::copy_chunks`),
    /// so a thread that sees the migration complete sees every copied node in the next array.
    #[inline]
    pub(crate) fn migration_complete(&self) -> bool {
        self.copied.load(Ordering::Acquire) == self.len()
    }

    /// The next array, if a migration has started and finished.
    #[inline]
    pub(crate) fn completed_next<'g>(&self, guard: &'g Guard) -> Option<Shared<'g, Self>> {
        // Acquire pairs with the Release CAS of `next` in `Table::start_or_help`: the next
        // array's fields are visible.
        let next = self.next.load(Ordering::Acquire, guard);
        if !next.is_null() && self.migration_complete() {
            Some(next)
        } else {
            None
        }
    }

    /// Places `node`, whose hash is `hash`, into the first free slot of its probe sequence.
    /// Used only to copy into a migration's target, where no key can be present twice (each
    /// source slot is copied by exactly one chunk owner) and no writer runs until the copy is
    /// complete, so no key comparison, and thus no user code, is needed. The caller counts
    /// the slot as claimed.
    ///
    /// Returns false if the array is full, which the sizing in [`Self::size_for`] rules out
    /// unless far more writers than that head room raced the start of the migration.
    pub(crate) fn place_copy<'g>(
        &self,
        node: Shared<'g, Node<K, V>>,
        hash: u64,
        guard: &'g Guard,
    ) -> bool {
        for i in super::probe::Probe::new(hash, self.mask) {
            if self.tags[i].load(Ordering::Relaxed) != TAG_EMPTY {
                continue;
            }
            // Release publishes the node's fields to readers of the slot (Acquire loads in
            // `find`, `Table::update_node`, `Iter::next`).
            // Failure means another copier took the slot: try the next one.
            if self.slots[i]
                .compare_exchange(
                    Shared::null(),
                    node,
                    Ordering::Release,
                    Ordering::Relaxed,
                    guard,
                )
                .is_ok()
            {
                // Release pairs with the Acquire tag loads in `find` and `Table::update_node`.
                self.tags[i].store(super::node::tag_of(hash), Ordering::Release);
                return true;
            }
        }
        false
    }

    /// Live nodes whose slot is not a tombstone, for teardown. The caller must have exclusive
    /// access (no guard needed).
    pub(crate) fn for_each_live_exclusive(&mut self, mut f: impl FnMut(*mut Node<K, V>)) {
        for slot in self.slots.iter() {
            // SAFETY: exclusive access (`&mut self`): no other thread can change or free the
            // slot, so an unprotected load is sound.
            let p = slot.load(Ordering::Relaxed, unsafe { crossbeam_epoch::unprotected() });
            if !p.is_null() && p.tag() & SlotBits::TOMBSTONE == 0 {
                f(p.as_raw() as *mut Node<K, V>);
            }
        }
    }
}
