//! The heap cell a slot points to, and the meaning of the low bits of a slot pointer.

use std::alloc::{dealloc, Layout};
use std::ptr::NonNull;

use crossbeam_epoch::Owned;

use super::pool;

/// One key-value pair of the table, allocated once and never mutated after publication
/// (interior mutability, where a value needs it, lives inside `V`).
///
/// The alignment of 8 leaves the three low bits of every node pointer free; the slot uses
/// two of them (see `SlotBits`). The fields are in declaration order (`repr(C)`) so that a
/// lookup's first reads, the hash and the key, lead the node and the value follows them:
/// a hit reads the front of the node, usually one cache line.
#[repr(C, align(8))]
#[derive(Debug)]
pub struct Node<K, V> {
    /// The full hash of `key`, computed once by the caller's hasher.
    pub hash: u64,
    /// The key.
    pub key: K,
    /// The value.
    pub value: V,
}

impl<K, V> Node<K, V> {
    /// A node ready to be inserted.
    pub fn new(hash: u64, key: K, value: V) -> Self {
        Node { hash, key, value }
    }

    /// A node ready to be inserted, in memory a retired node of this thread left (see
    /// `pool.rs`) when there is some: the table's writes allocate nodes this way.
    #[inline]
    pub fn owned(hash: u64, key: K, value: V) -> Owned<Self> {
        let node = Node::new(hash, key, value);
        match pool::take(Layout::new::<Self>()) {
            Some(block) => {
                let raw = block.as_ptr().cast::<Self>();
                // SAFETY: the block was allocated by the global allocator with this type's
                // layout and is ours alone (the pool hands each block out once), so it may be
                // written and then owned exactly as a `Box` of the node, which is how `Owned`
                // frees it.
                unsafe {
                    raw.write(node);
                    Owned::from_raw(raw)
                }
            }
            None => Owned::new(node),
        }
    }

    /// Drops the node in place and frees or pools its memory. A panic in `K`'s or `V`'s
    /// `Drop` is contained (see `retire` in `table/mod.rs`), and the memory is released even
    /// if dropping the panic's payload panics in turn. The key and the value are dropped
    /// apart, each under its own `catch_unwind`: dropped together, a value whose `Drop`
    /// panicked while the key's panic unwound would abort the process.
    ///
    /// # Safety
    /// `node` was allocated as a `Box` of the node (by [`Node::owned`] or `Owned::new`), is
    /// reachable by no one else, and is released once.
    pub(super) unsafe fn release(node: *mut Self) {
        /// Releases the block when dropped, on every path out of `release`.
        struct Block(NonNull<u8>, Layout);
        impl Drop for Block {
            fn drop(&mut self) {
                if !pool::give(self.0, self.1) {
                    // SAFETY: allocated by the global allocator with this layout (a `Box` of
                    // the node), its contents dropped, and refused by the pool: freed only
                    // here.
                    unsafe { dealloc(self.0.as_ptr(), self.1) };
                }
            }
        }
        // SAFETY: `Box` allocations are never null.
        let _block = Block(
            unsafe { NonNull::new_unchecked(node.cast::<u8>()) },
            Layout::new::<Self>(),
        );
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            // SAFETY: valid and exclusively ours (the caller's contract); the key is dropped
            // once, here.
            unsafe { std::ptr::drop_in_place(std::ptr::addr_of_mut!((*node).key)) }
        }));
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            // SAFETY: as for the key (and `hash` has no destructor).
            unsafe { std::ptr::drop_in_place(std::ptr::addr_of_mut!((*node).value)) }
        }));
    }
}

/// Tag bits carried in the low bits of a slot pointer (crossbeam-epoch's pointer tag).
///
/// A slot moves only forward through these states, which is what makes the probe argument
/// of `table/mod.rs` work:
///
/// ```text
/// EMPTY (null) --claim--> LIVE (node) --remove--> TOMBSTONE (null | TOMBSTONE), final
///   |                       |  ^ replace (same key)
///   +------ freeze ---------+--+--> ... | FROZEN
/// ```
///
/// A migration freezes empty and live slots; a tombstone is already final, so it is left
/// as it is (and not copied).
pub(crate) struct SlotBits;

impl SlotBits {
    /// The slot has been frozen by a migration: its content is final in this array, and
    /// writers must go to the next array. Readers may still read a frozen node.
    pub(crate) const FROZEN: usize = 0b01;
    /// The slot held a key that was removed. The slot stays claimed (it is never reused in
    /// this array) until a migration drops it.
    pub(crate) const TOMBSTONE: usize = 0b10;
}

/// The tag byte stored beside each slot: the top 7 bits of the hash with the high bit set,
/// so that 0 can mean "not yet claimed".
#[inline]
pub(crate) fn tag_of(hash: u64) -> u8 {
    0x80 | (hash >> 57) as u8
}

/// Tag byte of a slot that nobody has claimed yet (or whose claimer has not published its
/// tag yet: writers then look at the slot pointer itself).
pub(crate) const TAG_EMPTY: u8 = 0;
