//! The lock-free hashed table under the cache.
//!
//! Open addressing over an array of epoch-protected slot pointers, each with a tag byte, in
//! the manner of papaya. The table knows nothing of expiry or eviction: it is a concurrent map
//! from `K` to `V` whose operations all run under a caller-supplied crossbeam-epoch [`Guard`]
//! of the caller's collector, and whose replaced or removed nodes are retired on that guard.
//!
//! # Consistency
//! - A slot only moves forward: empty, live (replaced in place by nodes of the same key),
//!   tombstone. A migration freezes the empty and live ones; a tombstone is final without it.
//!   A slot is claimed by one key for the life of its array; tombstones are never reused in
//!   place, only dropped by a migration.
//! - Insertion claims the first empty slot of the key's probe sequence (CAS on the pointer,
//!   then the tag byte is stored), and lookups stop at the first unclaimed slot: an empty tag
//!   whose pointer is null. A claimed slot whose tag is not yet stored is examined like a tag
//!   match, so readers and writers agree on what is present. Because slots never return to
//!   empty, a key has at most one live slot per array and a lookup that stops at an empty
//!   slot did not miss it.
//! - Migration (grow, shrink, or same-size rehash to drop tombstones): a writer that finds the
//!   array too full allocates the next array and links it; every writer that sees the link
//!   helps copy chunks of slots (freezing each slot first, except tombstones, which are
//!   final) and waits until the copy is complete before writing to the next array. Readers
//!   never wait: a frozen slot still holds a readable node, and it is the current one for
//!   its key until the copy is complete, since no writer touches the next array before then.
//!
//! # Progress
//! Lookups are wait-free apart from following completed migrations. Writes are lock-free
//! outside migrations; during one, a writer copies chunks itself and then waits for chunks
//! other writers have claimed (each at most [`array::COPY_CHUNK`] slot copies, which run no
//! user code).

mod array;
mod guard;
mod node;
mod pool;
mod probe;

pub use guard::VerifiedGuard;
pub use node::Node;

use std::cell::Cell;
use std::marker::PhantomData;

use crossbeam_epoch::{Atomic, Collector, Guard, Owned, Shared};
use crossbeam_utils::CachePadded;

#[cfg(test)]
use array::HEADROOM;
use array::{SlotArray, COPY_CHUNK};
use node::{tag_of, SlotBits, TAG_EMPTY};
use probe::Probe;

use crate::sync::{spin_wait, AtomicUsize, Backoff, Ordering};

/// What [`Table::update`] decides about the key's current node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Store the new node (insert, or replace the current one).
    Put,
    /// Remove the current node (only meaningful when there is one).
    Remove,
    /// Change nothing.
    Keep,
}

/// What [`Table::update`] did.
#[derive(Debug)]
pub enum Outcome<'g, K, V> {
    /// The key was absent; the new node is now in the table.
    Inserted(&'g Node<K, V>),
    /// The key's previous node (retired, still readable under the guard) was replaced by the
    /// new node (second field).
    Replaced(&'g Node<K, V>, &'g Node<K, V>),
    /// The key's node (retired, still readable under the guard) was removed.
    Removed(&'g Node<K, V>),
    /// Nothing changed; the current node, if any, and the unused new node, if one was given.
    // The cache only matches on the variant; the raw API's users (tests, fuzz, loom) read it.
    #[cfg_attr(not(any(test, fuzzing, herdcache_loom)), allow(dead_code))]
    Kept(Option<&'g Node<K, V>>, Option<Owned<Node<K, V>>>),
}

/// A lock-free hash table of [`Node`]s keyed by precomputed hashes.
///
/// Its operations take a [`VerifiedGuard`]: a guard pinned on the collector the table was
/// built with, on which it retires the nodes it replaces or removes.
pub struct Table<K, V> {
    root: Atomic<SlotArray<K, V>>,
    /// The collector whose guards the table takes.
    collector: Collector,
    /// Live entries across the table. On a line of its own, away from `root`, which every
    /// read loads: inserts of new keys and removals change it.
    len: CachePadded<AtomicUsize>,
    /// The most entries the table is expected to hold (see `SlotArray::size_for`). Relaxed:
    /// only sizes the next migration's array; a cache whose capacity changes sets it.
    bound: AtomicUsize,
    _marker: PhantomData<Box<Node<K, V>>>,
}

// SAFETY: the table owns its nodes (`K`, `V` move across threads when another thread drops
// a retired node, and are shared by reference with every reader).
unsafe impl<K: Send + Sync, V: Send + Sync> Send for Table<K, V> {}
// SAFETY: as above; all shared mutation goes through atomics.
unsafe impl<K: Send + Sync, V: Send + Sync> Sync for Table<K, V> {}

impl<K, V> std::fmt::Debug for Table<K, V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Table")
            .field("len", &self.len.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

std::thread_local! {
    /// Whether this thread retired an array it outgrew and has not flushed its deferred
    /// frees since (see [`flush_outgrown`]).
    static OUTGREW: Cell<bool> = const { Cell::new(false) };
}

/// Hands this thread's deferred frees to the collector if it retired an outgrown array since
/// it last did. An array is the largest thing a table retires, and a thread's deferred frees
/// wait in its own bag until 64 more come: a table that only grows retires nothing else, so
/// without this every array it outgrew would stay allocated. A writer calls it when its
/// write is done, never under a lock: the collection it starts may run the destructors of
/// retired entries, which are user code. (The flag is the thread's, whatever table set it:
/// a thread writing to two caches may flush the other's guard, and then its own array waits
/// for the next flush or for 64 more retirements.)
pub(crate) fn flush_outgrown(guard: &Guard) {
    if OUTGREW.try_with(|o| o.replace(false)).unwrap_or(false) {
        crate::sync::user_code_may_run("a flush of retired entries");
        guard.flush();
    }
}

impl<K, V> Table<K, V> {
    /// An empty table sized for about `capacity` entries before its first resize, taking
    /// guards of `collector`.
    #[cfg(any(test, fuzzing, herdcache_loom))]
    pub fn with_capacity(capacity: usize, collector: &Collector) -> Self {
        Self::try_with_capacity(capacity, collector)
            .expect("herdcache: out of memory for the table")
    }

    /// Like [`with_capacity`](Self::with_capacity), or `None` if the slots cannot be
    /// allocated.
    pub fn try_with_capacity(capacity: usize, collector: &Collector) -> Option<Self> {
        let array = SlotArray::try_new(SlotArray::<K, V>::initial_size(capacity))?;
        Some(Table {
            root: Atomic::new(array),
            collector: collector.clone(),
            len: CachePadded::new(AtomicUsize::new(0)),
            bound: AtomicUsize::new(usize::MAX),
            _marker: PhantomData,
        })
    }

    /// The table, expecting to hold at most about `bound` entries: its migrations size the
    /// next array with no room to grow past them. More may be written (the arrays grow as
    /// they must), at the cost of migrations a little more frequent than without a bound.
    pub fn with_bound(self, bound: usize) -> Self {
        self.set_bound(bound);
        self
    }

    /// Expects at most about `bound` entries from now on (see `with_bound`): the next
    /// migration sizes its array for it.
    pub fn set_bound(&self, bound: usize) {
        self.bound.store(bound, Ordering::Relaxed);
    }

    /// `guard` as one this table takes.
    ///
    /// # Panics
    /// If `guard` was not pinned on the collector the table was built with.
    #[cfg(any(test, fuzzing, herdcache_loom))]
    pub fn verify<'g>(&self, guard: &'g Guard) -> &'g VerifiedGuard {
        assert!(
            self.owns(guard),
            "herdcache: a guard of another collector handed to a table"
        );
        // SAFETY: checked just above.
        unsafe { VerifiedGuard::from_ref_unchecked(guard) }
    }

    /// Whether `guard` is pinned on this table's collector.
    fn owns(&self, guard: &Guard) -> bool {
        guard.collector() == Some(&self.collector)
    }

    /// Live entries (exact when no write is in progress).
    #[inline]
    pub fn len(&self) -> usize {
        self.len.load(Ordering::Relaxed)
    }

    /// Number of slots of the newest array (for tests).
    #[cfg(any(test, fuzzing, herdcache_loom))]
    pub fn slot_count(&self, guard: &VerifiedGuard) -> usize {
        self.newest(guard).len()
    }

    /// The root array, where every operation starts; debug builds check here that `guard`
    /// is of this table's collector.
    #[inline(always)]
    fn root_array<'g>(&self, guard: &'g VerifiedGuard) -> Shared<'g, SlotArray<K, V>> {
        debug_assert!(self.owns(guard), "a guard of another collector");
        // Acquire pairs with the Release CAS of `root` in `finish_migration`: the promoted
        // array's fields, and every copy into it, are visible.
        self.root.load(Ordering::Acquire, guard)
    }

    /// The newest array whose contents are authoritative: the root, or the target of a
    /// completed migration out of it.
    #[inline]
    fn newest<'g>(&self, guard: &'g VerifiedGuard) -> &'g SlotArray<K, V> {
        let mut array = self.root_array(guard);
        loop {
            // SAFETY: arrays are retired only after being unlinked from `root` (and from every
            // array that points to them), and we hold the guard, so the pointer is valid.
            let a = unsafe { array.deref() };
            match a.completed_next(guard) {
                Some(next) => array = next,
                None => return a,
            }
        }
    }

    /// Looks up the node whose hash is `hash` and whose key satisfies `eq`.
    ///
    /// This is the hit path: one probe of the newest array in the common case, with the
    /// following of a migration kept out of line.
    #[inline(always)]
    pub fn get<'g>(
        &self,
        hash: u64,
        mut eq: impl FnMut(&K) -> bool,
        guard: &'g VerifiedGuard,
    ) -> Option<&'g Node<K, V>> {
        self.get_node(hash, |n| eq(&n.key), guard)
    }

    /// Like [`get`](Self::get), matching whole nodes: with a predicate on what the node
    /// stores beside the key, a caller finds a node without running the key's `Eq` (user
    /// code).
    #[inline(always)]
    pub fn get_node<'g>(
        &self,
        hash: u64,
        mut eq: impl FnMut(&Node<K, V>) -> bool,
        guard: &'g VerifiedGuard,
    ) -> Option<&'g Node<K, V>> {
        let tag = tag_of(hash);
        let mut array = self.root_array(guard);
        loop {
            // SAFETY: see `newest`: reachable arrays are valid under the guard.
            let a = unsafe { array.deref() };
            let found = a.find(hash, tag, &mut eq, guard);
            if let Some((node, false)) = found {
                return Some(node);
            }
            // Missed, or found a frozen node: if a migration completed, writers may since have
            // changed the key in the next array; otherwise this array's answer stands.
            match a.completed_next(guard) {
                Some(next) => array = next,
                None => return found.map(|(node, _)| node),
            }
        }
    }

    /// Inserts or replaces, returning what was there.
    #[cfg(any(test, fuzzing, herdcache_loom))]
    pub fn insert<'g>(
        &self,
        node: Owned<Node<K, V>>,
        eq: impl FnMut(&K) -> bool,
        guard: &'g VerifiedGuard,
    ) -> Option<&'g Node<K, V>> {
        match self.update(node.hash, eq, Some(node), |_| Decision::Put, guard) {
            Outcome::Inserted(_) => None,
            Outcome::Replaced(old, _) => Some(old),
            Outcome::Removed(_) | Outcome::Kept(..) => unreachable!("Put always stores"),
        }
    }

    /// Removes the key's node, returning it (retired, readable under the guard).
    pub fn remove<'g>(
        &self,
        hash: u64,
        eq: impl FnMut(&K) -> bool,
        guard: &'g VerifiedGuard,
    ) -> Option<&'g Node<K, V>> {
        let decide = |cur: Option<&Node<K, V>>| match cur {
            Some(_) => Decision::Remove,
            None => Decision::Keep,
        };
        match self.update(hash, eq, None, decide, guard) {
            Outcome::Removed(old) => Some(old),
            _ => None,
        }
    }

    /// Removes `target` if it is still its key's current node. Identity is by address, which
    /// is sound because the caller has held `guard` since it read `target` (so the address
    /// cannot have been reused); no `Eq` of the key runs.
    ///
    /// The probe compares slot pointers with `target`'s address and reads neither tag bytes
    /// nor other nodes: an eviction's removal touches the slots' line alone. It stops at the
    /// first unclaimed slot (a null pointer without the tombstone bit): claims take the first
    /// unclaimed slot of the sequence, and a claimed slot is never unclaimed again, so none
    /// lies before `target`'s. The claims before it are visible here: the caller read
    /// `target` after its claim (Acquire), and an array reached through a migration is
    /// reached after its copy completed (`migration_complete`, Acquire).
    pub fn remove_node<'g>(&self, target: &'g Node<K, V>, guard: &'g VerifiedGuard) -> bool {
        let mut array = self.root_array(guard);
        'arrays: loop {
            array = self.settled(array, guard);
            // SAFETY: see `newest`.
            let a = unsafe { array.deref() };
            for i in Probe::new(target.hash, a.mask) {
                // Acquire, as in `update_node`: a FROZEN bit seen here comes with the
                // migration's `next` link (the Release of the freeze in `copy_chunks`).
                let mut cur = a.slots[i].load(Ordering::Acquire, guard);
                loop {
                    if cur.tag() & SlotBits::FROZEN != 0 {
                        self.start_or_help(array, guard);
                        continue 'arrays;
                    }
                    if !std::ptr::eq(cur.as_raw(), target) {
                        if cur.is_null() && cur.tag() & SlotBits::TOMBSTONE == 0 {
                            return false; // unclaimed: `target` is not in this array
                        }
                        break; // another key's slot, or a tombstone: keep probing
                    }
                    match self.entomb(a, i, cur, guard) {
                        Ok(()) => return true,
                        // Replaced, removed or frozen since: look again.
                        Err(now) => cur = now,
                    }
                }
            }
            // Every slot probed: `target` is not in this array.
            return false;
        }
    }

    /// Starts loading the home slot of `hash` (its tag byte and its pointer) in the newest
    /// array, for a write about to look there (see `prefetch.rs`).
    #[inline]
    pub fn prefetch(&self, hash: u64, guard: &VerifiedGuard) {
        // The array's `mask`, `tags` and `slots` are read: `root_array`'s Acquire covers them.
        let array = self.root_array(guard);
        // SAFETY: see `newest`.
        let a = unsafe { array.deref() };
        let i = (hash as usize) & a.mask;
        crate::prefetch::prefetch(a.tags.as_ptr().wrapping_add(i));
        crate::prefetch::prefetch(a.slots.as_ptr().wrapping_add(i));
    }

    /// The general write: finds the key's current node, asks `decide` what to do with it, and
    /// does that atomically (retrying `decide` if the slot changed under it).
    ///
    /// `new` is the node to store on [`Decision::Put`]; a `Put` without one is treated as
    /// `Keep`. A replaced or removed node is retired on `guard`.
    pub fn update<'g>(
        &self,
        hash: u64,
        mut eq: impl FnMut(&K) -> bool,
        new: Option<Owned<Node<K, V>>>,
        decide: impl FnMut(Option<&'g Node<K, V>>) -> Decision,
        guard: &'g VerifiedGuard,
    ) -> Outcome<'g, K, V> {
        self.update_node(hash, |n| eq(&n.key), new, decide, guard)
    }

    /// Like [`update`](Self::update), matching whole nodes (see [`get_node`](Self::get_node)).
    /// A node that `eq` rejects is another key's, as far as this write is concerned: with a
    /// predicate narrower than the key's equality (identity, a flight), `decide` must not
    /// answer `Put` to `None`, or a second slot could be claimed for one key.
    pub fn update_node<'g>(
        &self,
        hash: u64,
        mut eq: impl FnMut(&Node<K, V>) -> bool,
        new: Option<Owned<Node<K, V>>>,
        mut decide: impl FnMut(Option<&'g Node<K, V>>) -> Decision,
        guard: &'g VerifiedGuard,
    ) -> Outcome<'g, K, V> {
        let tag = tag_of(hash);
        let mut new = new;
        let mut array = self.root_array(guard);
        'arrays: loop {
            array = self.settled(array, guard);
            // SAFETY: see `newest`.
            let a = unsafe { array.deref() };
            let mut probe = Probe::new(hash, a.mask);
            let mut index = probe.next();
            while let Some(i) = index {
                // Acquire pairs with the Release tag store after a claim (below, and in
                // `SlotArray::place_copy`): seeing the tag means seeing the claim.
                let t = a.tags[i].load(Ordering::Acquire);
                if t != TAG_EMPTY && t != tag {
                    index = probe.next();
                    continue;
                }
                // Acquire pairs with the Release CAS that stored the node (a claim or replace
                // below, or `SlotArray::place_copy`): its hash and key are visible.
                let mut cur = a.slots[i].load(Ordering::Acquire, guard);
                // Examine slot `i` until we act on it or move past it.
                loop {
                    if cur.tag() & SlotBits::FROZEN != 0 {
                        self.start_or_help(array, guard);
                        continue 'arrays;
                    }
                    if cur.tag() & SlotBits::TOMBSTONE != 0 {
                        break; // claimed by a removed key; keep probing
                    }
                    // SAFETY: non-null untagged slot pointers are nodes kept alive by the
                    // guard (see `get`).
                    match unsafe { cur.as_ref() } {
                        None => {
                            // Empty: the key is absent from this array.
                            if decide(None) != Decision::Put || new.is_none() {
                                return Outcome::Kept(None, new);
                            }
                            if a.claimed.load(Ordering::Relaxed) >= a.claim_limit() {
                                self.start_or_help(array, guard);
                                continue 'arrays;
                            }
                            let node = new.take().expect("checked above");
                            // Release publishes the node to the Acquire slot loads (above,
                            // `SlotArray::find`, `Iter::next`, the freeze in `copy_chunks`);
                            // Acquire on failure reads whichever node won the slot to examine.
                            match a.slots[i].compare_exchange(
                                Shared::null(),
                                node,
                                Ordering::AcqRel,
                                Ordering::Acquire,
                                guard,
                            ) {
                                Ok(stored) => {
                                    a.claimed.fetch_add(1, Ordering::Relaxed);
                                    // Release pairs with the Acquire tag loads (above, and in
                                    // `SlotArray::find`): seeing the tag means seeing the claim.
                                    a.tags[i].store(tag, Ordering::Release);
                                    self.len.fetch_add(1, Ordering::Relaxed);
                                    // SAFETY: just published, kept alive by the guard.
                                    return Outcome::Inserted(unsafe { stored.deref() });
                                }
                                Err(e) => {
                                    new = Some(e.new);
                                    cur = e.current;
                                    continue;
                                }
                            }
                        }
                        Some(node) => {
                            if node.hash != hash || !eq(node) {
                                break;
                            }
                            match decide(Some(node)) {
                                Decision::Keep => return Outcome::Kept(Some(node), new),
                                Decision::Put => {
                                    let Some(replacement) = new.take() else {
                                        return Outcome::Kept(Some(node), None);
                                    };
                                    // AcqRel: Release publishes the replacement to the slot
                                    // loads, as a claim does; Acquire on failure reads the
                                    // slot's new content to re-examine it.
                                    match a.slots[i].compare_exchange(
                                        cur,
                                        replacement,
                                        Ordering::AcqRel,
                                        Ordering::Acquire,
                                        guard,
                                    ) {
                                        Ok(stored) => {
                                            // SAFETY: as in `entomb`: unlinked from this
                                            // array, not copied out of it (the slot was not
                                            // frozen), and older arrays holding it frozen are
                                            // unlinked from `root` already.
                                            unsafe { retire(cur, guard) };
                                            // SAFETY: just published, kept alive by the guard.
                                            return Outcome::Replaced(node, unsafe {
                                                stored.deref()
                                            });
                                        }
                                        Err(e) => {
                                            new = Some(e.new);
                                            cur = e.current;
                                        }
                                    }
                                }
                                Decision::Remove => match self.entomb(a, i, cur, guard) {
                                    Ok(()) => return Outcome::Removed(node),
                                    Err(now) => cur = now,
                                },
                            }
                        }
                    }
                }
                index = probe.next();
            }
            // Probed every slot without finding the key or an empty slot: the array is full
            // of claims (possible only if writers raced past the claim limit).
            if decide(None) != Decision::Put || new.is_none() {
                return Outcome::Kept(None, new);
            }
            self.start_or_help(array, guard);
        }
    }

    /// A writer's `newest`: `array`, or the array its linked migrations lead to, each helped
    /// to its end and promoted first. (A migration linked later shows to the write as a
    /// frozen slot.)
    #[inline]
    fn settled<'g>(
        &self,
        mut array: Shared<'g, SlotArray<K, V>>,
        guard: &'g VerifiedGuard,
    ) -> Shared<'g, SlotArray<K, V>> {
        while let Some(next) = self.help_migration(array, guard) {
            array = next;
        }
        array
    }

    /// Replaces `cur`, the node in slot `i` of `a`, with a tombstone, and retires it; or
    /// returns what the slot holds now if that is no longer `cur` (replaced, removed, or
    /// frozen by a migration).
    #[inline]
    fn entomb<'g>(
        &self,
        a: &SlotArray<K, V>,
        i: usize,
        cur: Shared<'g, Node<K, V>>,
        guard: &'g VerifiedGuard,
    ) -> Result<(), Shared<'g, Node<K, V>>> {
        let tomb = Shared::null().with_tag(SlotBits::TOMBSTONE);
        // Release: a thread whose slot load (in `update_node`, `remove_node` or
        // `SlotArray::find`) sees the tombstone sees what preceded the removal. Acquire on
        // failure reads the slot's new content for the caller to examine.
        match a.slots[i].compare_exchange(cur, tomb, Ordering::AcqRel, Ordering::Acquire, guard) {
            Ok(_) => {
                // SAFETY: `cur` is now unlinked from this array, and no migration copied it
                // out of it (the CAS succeeded, so the slot was not frozen). An older array
                // that still holds it frozen was unlinked from `root` before the caller
                // probed `a` (its `settled`), and is retired itself. So once current
                // readers unpin, no array reaches `cur`: it can be destroyed. `guard` is of
                // the table's collector (`VerifiedGuard`).
                unsafe { retire(cur, guard) };
                self.len.fetch_sub(1, Ordering::Relaxed);
                Ok(())
            }
            Err(e) => Err(e.current),
        }
    }
}

// Migration.
impl<K, V> Table<K, V> {
    /// If `array` has a migration in progress or done, helps finish it, promotes the target
    /// to root, and returns the target; otherwise returns `None`.
    #[inline]
    fn help_migration<'g>(
        &self,
        array: Shared<'g, SlotArray<K, V>>,
        guard: &'g VerifiedGuard,
    ) -> Option<Shared<'g, SlotArray<K, V>>> {
        // SAFETY: see `newest`.
        let a = unsafe { array.deref() };
        // Acquire pairs with the Release CAS of `next` in `start_or_help`: the target's
        // fields (`mask`, `tags`, `slots`) are visible before we copy into it.
        let next = a.next.load(Ordering::Acquire, guard);
        if next.is_null() {
            return None;
        }
        self.finish_migration(array, next, guard);
        Some(next)
    }

    /// `help_migration`'s work once a migration is under way: copies, waits for the copy to
    /// complete, promotes `next` and retires `array`. Out of line and cold, since every write
    /// runs `help_migration`'s check and almost always finds no migration.
    #[cold]
    #[inline(never)]
    fn finish_migration<'g>(
        &self,
        array: Shared<'g, SlotArray<K, V>>,
        next: Shared<'g, SlotArray<K, V>>,
        guard: &'g VerifiedGuard,
    ) {
        // SAFETY: see `newest`.
        let a = unsafe { array.deref() };
        // SAFETY: `next` is reachable from `a`, so valid under the guard.
        let target = unsafe { next.deref() };
        self.copy_chunks(a, target, guard);
        let backoff = Backoff::new();
        while !a.migration_complete() {
            spin_wait(&backoff);
        }
        // Promote; whoever wins the CAS retires the old array. Release publishes the link so
        // that a reader loading the root (Acquire) sees the target's contents.
        if self
            .root
            .compare_exchange(array, next, Ordering::AcqRel, Ordering::Acquire, guard)
            .is_ok()
        {
            // SAFETY: the old array is unreachable from root now; readers that loaded it
            // earlier hold guards, so it is destroyed only after they unpin. Dropping an
            // array does not drop the nodes it points to (they live on in `next`).
            unsafe { guard.defer_destroy(array) };
            // Not `with`: this may run while the thread's locals are torn down (a retired
            // value's drop writing to a cache), and a panic here may be under a policy lock.
            let _ = OUTGREW.try_with(|o| o.set(true));
        }
    }

    /// Links a new array of the same size to the newest, as a writer starting a migration
    /// does, without copying anything: for tests of what the writers that help do.
    #[cfg(test)]
    fn link_migration(&self, guard: &Guard) {
        // Acquire: as in `root_array`.
        let array = self.root.load(Ordering::Acquire, guard);
        // SAFETY: see `newest`.
        let a = unsafe { array.deref() };
        let fresh = Owned::new(SlotArray::new(a.len()));
        // AcqRel: as in `start_or_help`.
        let linked = a.next.compare_exchange(
            Shared::null(),
            fresh,
            Ordering::AcqRel,
            Ordering::Acquire,
            guard,
        );
        assert!(linked.is_ok(), "a migration was under way already");
    }

    /// Links a new array to `array` (sized for the live entries) unless one is linked
    /// already, then helps the migration.
    fn start_or_help<'g>(&self, array: Shared<'g, SlotArray<K, V>>, guard: &'g VerifiedGuard) {
        // SAFETY: see `newest`.
        let a = unsafe { array.deref() };
        // Acquire pairs with the Release CAS below (another writer's); only null is tested
        // here, and `help_migration` loads `next` again before it reads the array.
        if a.next.load(Ordering::Acquire, guard).is_null() {
            let size = SlotArray::<K, V>::size_for(self.len(), self.bound.load(Ordering::Relaxed));
            let fresh = Owned::new(SlotArray::new(size));
            // Release publishes the empty array to the Acquire loads of `next` in
            // `help_migration` and `SlotArray::completed_next`; on failure ours is dropped,
            // still empty.
            let _ = a.next.compare_exchange(
                Shared::null(),
                fresh,
                Ordering::AcqRel,
                Ordering::Acquire,
                guard,
            );
        }
        self.help_migration(array, guard);
    }

    /// Claims chunks of `from` until none is left, freezing each slot and copying its live
    /// node into `to`.
    ///
    /// A chunk is copied in three passes: freeze every slot but the tombstones, read the
    /// hashes of the nodes found, place them. The freezes are locked instructions, which would wait for each
    /// node's cache miss if the hash were read between them; read together, the misses
    /// overlap.
    fn copy_chunks(&self, from: &SlotArray<K, V>, to: &SlotArray<K, V>, guard: &Guard) {
        let chunks = from.len().div_ceil(COPY_CHUNK);
        let mut found: [(Shared<'_, Node<K, V>>, u64); COPY_CHUNK] =
            [(Shared::null(), 0); COPY_CHUNK];
        loop {
            let chunk = from.copy_cursor.fetch_add(1, Ordering::Relaxed);
            if chunk >= chunks {
                return;
            }
            let start = chunk * COPY_CHUNK;
            let end = (start + COPY_CHUNK).min(from.len());
            let mut live = 0;
            for i in start..end {
                let slot = &from.slots[i];
                // A tombstone is final in its array: no writer changes it again, so it needs
                // no freeze and carries nothing over. Skipping it saves a locked instruction
                // per key removed since the last migration, which under churn (every insert
                // evicts) is over a third of the slots. Relaxed: nothing is read through it.
                if slot.load(Ordering::Relaxed, guard).tag() & SlotBits::TOMBSTONE != 0 {
                    continue;
                }
                // AcqRel: Acquire pairs with the Release CAS that stored the node (a claim or
                // replace in `update_node`, or `place_copy`), so its hash is readable below.
                // Release: a writer whose slot load in `update_node` sees FROZEN also sees
                // `next` linked (loaded by us before), so `start_or_help` allocates nothing.
                let p = slot.fetch_or(SlotBits::FROZEN, Ordering::AcqRel, guard);
                if !p.is_null() {
                    found[live].0 = p.with_tag(0);
                    live += 1;
                }
                // Empty (frozen now): nothing to carry over.
            }
            for (p, hash) in &mut found[..live] {
                // SAFETY: read from a live slot under `guard`, so not reclaimed before the
                // guard is dropped.
                *hash = unsafe { p.deref() }.hash;
            }
            let mut placed = 0;
            for &(p, hash) in &found[..live] {
                if to.place_copy(p, hash, guard) {
                    placed += 1;
                } else {
                    // Unreachable with `size_for`'s head room. If it ever happened, the entry
                    // would be dropped from the table but not freed: whoever holds its
                    // address outside the table (a cache's policy) can still read it, and
                    // only the one who takes a node out of the table knows to tell them.
                    self.len.fetch_sub(1, Ordering::Relaxed);
                }
            }
            // Relaxed: the count steers when writers migrate again, which they do only after
            // this migration completes (the Release below orders it before that).
            to.claimed.fetch_add(placed, Ordering::Relaxed);
            // Release pairs with the Acquire load in `SlotArray::migration_complete`: whoever
            // sees the count complete sees this chunk's copies.
            from.copied.fetch_add(end - start, Ordering::Release);
        }
    }
}

// Iteration and slot access (weakly consistent).
impl<K, V> Table<K, V> {
    /// Iterates over the live nodes. Weakly consistent: every node live for the whole
    /// iteration is yielded once; nodes inserted or removed meanwhile may or may not be.
    pub fn iter<'g>(&self, guard: &'g VerifiedGuard) -> Iter<'g, K, V> {
        let array = self.newest(guard);
        Iter {
            array,
            index: 0,
            end: array.len(),
            guard,
        }
    }

    /// Iterates over the live nodes of at most `count` slots from slot `start` (taken modulo
    /// the slot count, so a cursor that only grows walks the whole table in turn), weakly
    /// consistent as [`iter`](Self::iter).
    pub fn iter_slots<'g>(
        &self,
        start: usize,
        count: usize,
        guard: &'g VerifiedGuard,
    ) -> Iter<'g, K, V> {
        let array = self.newest(guard);
        let index = start & array.mask;
        Iter {
            array,
            index,
            end: index.saturating_add(count).min(array.len()),
            guard,
        }
    }
}

/// Iterator over a table's live nodes, see [`Table::iter`].
#[derive(Debug)]
pub struct Iter<'g, K, V> {
    array: &'g SlotArray<K, V>,
    index: usize,
    end: usize,
    guard: &'g VerifiedGuard,
}

impl<K, V> std::fmt::Debug for SlotArray<K, V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SlotArray")
            .field("slots", &self.len())
            .finish_non_exhaustive()
    }
}

impl<'g, K, V> Iterator for Iter<'g, K, V> {
    type Item = &'g Node<K, V>;

    fn next(&mut self) -> Option<Self::Item> {
        while self.index < self.end {
            let i = self.index;
            self.index += 1;
            // Acquire pairs with the Release CAS that stored the node (`Table::update_node`,
            // `SlotArray::place_copy`): its fields are visible to the caller.
            let p = self.array.slots[i].load(Ordering::Acquire, self.guard);
            // SAFETY: non-null slot pointers are nodes kept alive by the guard.
            if let Some(node) = unsafe { p.as_ref() } {
                return Some(node);
            }
        }
        None
    }
}

/// Retires `node`, unlinked by the caller, to be released with [`Node::release`] once no
/// reader that could have seen it is still pinned. A panic from `K`'s or `V`'s `Drop` is
/// contained there: a node is freed by whichever thread the collector picks, in a batch with
/// others, or in the table's own drop among all its nodes, so a panic would surface in an
/// unrelated operation and leak the rest of the batch. (std's collections likewise go on
/// dropping after a panicking element.)
///
/// # Safety
/// `node` is no longer reachable from any slot, was allocated by `Owned`, and is retired once.
unsafe fn retire<K, V>(node: Shared<'_, Node<K, V>>, guard: &Guard) {
    let raw = node.as_raw() as usize;
    // SAFETY: the closure runs after every guard pinned before now is gone (crossbeam's
    // deferral contract), so no reader still holds the node; the caller guarantees it is
    // unlinked, `Owned`-allocated, and retired once, so this is its only release.
    unsafe {
        guard.defer_unchecked(move || Node::release(raw as *mut Node<K, V>));
    }
}

impl<K, V> Drop for Table<K, V> {
    fn drop(&mut self) {
        // SAFETY: `&mut self`: no guard of any thread can still reach this table's arrays
        // or nodes, so they can be freed now, without the collector.
        let guard = unsafe { crossbeam_epoch::unprotected() };
        let mut array = self.root.load(Ordering::Relaxed, guard);
        // Walk the chain of arrays. Every live node is in the last array when the chain's
        // migrations are complete, which they are: a writer returns only after the migration
        // it joined completes, and copies run no code that can unwind.
        let mut arrays = Vec::new();
        while !array.is_null() {
            arrays.push(array);
            // SAFETY: exclusive access, see above.
            array = unsafe { array.deref() }.next.load(Ordering::Relaxed, guard);
        }
        if let Some(last) = arrays.last() {
            // SAFETY: exclusive access; each live node is owned by the last array alone.
            let last = unsafe { &mut *(last.as_raw() as *mut SlotArray<K, V>) };
            last.for_each_live_exclusive(|node| {
                // SAFETY: the node was allocated by `Owned` (a `Box`) and is referenced by
                // no other live slot; this is its only release.
                unsafe { Node::release(node) };
            });
        }
        for array in arrays {
            // SAFETY: each array was allocated by `Owned::new` and is freed exactly once.
            drop(unsafe { array.into_owned() });
        }
    }
}

#[cfg(all(test, not(herdcache_loom)))]
mod tests;
