//! The policy's per-key record and its lists: two words per key, the list links carrying the
//! record's region and flags in their top bits.

use super::Tracked;

/// Bits of a record number in a list link; the bits above carry the record's region or
/// flags (see `PNode`).
pub(super) const LINK_BITS: u32 = 30;
pub(super) const LINK_MASK: u32 = (1 << LINK_BITS) - 1;
/// No record: the end of a list. Records are numbered below it.
pub(super) const NIL: u32 = LINK_MASK;
/// In `PNode::fore`: in the main space without having won a duel, and not hit since (see
/// `admit`).
pub(super) const UNCHALLENGED: u32 = 1 << LINK_BITS;
/// In `PNode::fore`: in probation's cold zone (see `fill_zone`).
pub(super) const ZONED: u32 = 1 << (LINK_BITS + 1);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(super) enum Region {
    Window = 0,
    Probation = 1,
    Protected = 2,
}

/// A key's record: where it stands in the policy, and the node of its current write. Two
/// words: the list links carry the region and the flags in their top bits; the policy key
/// is read from the node, or kept beside the records where the node cannot give it
/// (`Keys`), and the weight is kept beside them only once a write weighs other than 1
/// (`Core::weights`).
#[derive(Debug, Clone)]
pub(super) struct PNode {
    pub(super) node: Tracked,
    /// The previous record in the region's list (`NIL`: none) below `LINK_BITS`, the
    /// region above.
    pub(super) back: u32,
    /// The next record in the region's list (`NIL`: none) below `LINK_BITS`, the flags
    /// `UNCHALLENGED` and `ZONED` above.
    pub(super) fore: u32,
}

impl PNode {
    /// A record of `node` in no list yet, with no flag.
    pub(super) fn new(node: Tracked) -> Self {
        PNode {
            node,
            back: NIL,
            fore: NIL,
        }
    }

    pub(super) fn prev(&self) -> u32 {
        self.back & LINK_MASK
    }

    pub(super) fn next(&self) -> u32 {
        self.fore & LINK_MASK
    }

    pub(super) fn set_prev(&mut self, i: u32) {
        self.back = (self.back & !LINK_MASK) | i;
    }

    pub(super) fn set_next(&mut self, i: u32) {
        self.fore = (self.fore & !LINK_MASK) | i;
    }

    pub(super) fn region(&self) -> Region {
        match self.back >> LINK_BITS {
            0 => Region::Window,
            1 => Region::Probation,
            _ => Region::Protected,
        }
    }

    pub(super) fn set_region(&mut self, region: Region) {
        self.back = (self.back & LINK_MASK) | (region as u32) << LINK_BITS;
    }

    pub(super) fn unchallenged(&self) -> bool {
        self.fore & UNCHALLENGED != 0
    }

    pub(super) fn set_unchallenged(&mut self, on: bool) {
        self.set_flag(UNCHALLENGED, on);
    }

    pub(super) fn zoned(&self) -> bool {
        self.fore & ZONED != 0
    }

    pub(super) fn set_zoned(&mut self, on: bool) {
        self.set_flag(ZONED, on);
    }

    /// Sets or clears `flag`, one of the bits of `fore` above the link.
    pub(super) fn set_flag(&mut self, flag: u32, on: bool) {
        self.fore = if on {
            self.fore | flag
        } else {
            self.fore & !flag
        };
    }
}

/// A doubly linked list through `nodes`: `head` is the least recently used.
#[derive(Debug, Clone, Copy)]
pub(super) struct List {
    pub(super) head: u32,
    pub(super) tail: u32,
    pub(super) weight: u64,
}

impl Default for List {
    fn default() -> Self {
        List {
            head: NIL,
            tail: NIL,
            weight: 0,
        }
    }
}
