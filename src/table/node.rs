//! The heap cell a slot points to, and the meaning of the low bits of a slot pointer.

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
