//! W-TinyLFU (Einziger, Friedman and Manes, "TinyLFU: A Highly Efficient Cache Admission
//! Policy"), with an adaptive window as in Caffeine: new entries enter a small LRU window; an
//! entry leaving the window joins the main space (segmented LRU: probation, then protected
//! once hit again) only if the frequency sketch says it is more popular than the main space's
//! victim. The window's share of the capacity follows the marginal utility of either side
//! (see `window.rs`), so recency-heavy workloads get a large window and frequency-heavy ones
//! a small one.
//!
//! Single-threaded: the cache runs it under a lock, fed by writes and removals. The policy
//! keeps a record per key, which points at the table node of the key's current write
//! ([`Tracked`]: the node's [`Link`]); the node names its record in turn.
//!
//! # Succession
//!
//! Every write of a key publishes a new node, and writers report to the policy after their
//! table write, so reports of one key's writes can arrive in another order than the table
//! saw them. The record passes from node to node by these rules, all applied under the
//! shard's lock (`Link::record` holds a record number, [`UNREPORTED`] or
//! [`DETACHED`]):
//!
//! - A node starts `UNREPORTED`. Whoever takes a node out of the table (a write that
//!   replaces it, a removal, an eviction) reports it, and the report *detaches* it: its
//!   record, if it has one, passes to the node that replaced it or is released, and the node
//!   becomes `DETACHED`. A node leaves the table once, so it is detached once.
//! - A write's report detaches the node it replaced, then looks at its own node. If that is
//!   still `UNREPORTED`, the node takes the replaced node's record (a use of the key) or, if
//!   there was none, a new one (a new key). If it is `DETACHED` already, its own successor or
//!   remover reported first and found no record on it, so the record this write inherited is
//!   released: nothing in the table holds the write it tracked.
//! - A load in progress takes its predecessor's record the same way, without a use
//!   (`carry`); a load with no record to take is `DETACHED` at once, as it is not tracked.
//! - A record passes only within one shard and one policy key. Equal keys share both unless
//!   their `Hash` disagrees with their `Eq`: then the cache reports the replaced node removed
//!   in its own shard before the write (`engine/admit.rs`, `successor`), and a record of
//!   another policy key is released rather than inherited (`Core::of_key`).
//!
//! So each record tracks exactly one node, whose `record` names it, and a node that left the
//! table loses its record in the report of whoever took it out. While reports are on their
//! way a key can hold more than one record, on nodes of which the table holds one at most:
//! writes A, B, C of a key, B's report late and C's first, leave A's record (A is out of the
//! table, detached when B reports) beside the one C takes anew. That thread pinned the
//! epoch before the node left the table and holds the pin until its report: a record's node
//! is never freed while the record points at it, which is what lets the policy read it under
//! the lock (the unsafe contract of [`EvictionPolicy`]). A victim is removed from the table by
//! its node's address.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::ptr::NonNull;

use super::index::Index;
use super::sketch::Sketch;
use super::window::{Resize, Served, Sizer};
use super::{pkey_of_hash, EvictionPolicy, Link, DETACHED, UNREPORTED};

/// Bits of a record number in a list link; the bits above carry the record's region or
/// flags (see `PNode`).
const LINK_BITS: u32 = 30;
const LINK_MASK: u32 = (1 << LINK_BITS) - 1;
/// No record: the end of a list. Records are numbered below it.
const NIL: u32 = LINK_MASK;
/// In `PNode::fore`: in the main space without having won a duel, and not hit since (see
/// `admit`).
const UNCHALLENGED: u32 = 1 << LINK_BITS;
/// In `PNode::fore`: in probation's cold zone (see `fill_zone`).
const ZONED: u32 = 1 << (LINK_BITS + 1);

/// The window's initial share of the capacity.
const WINDOW_START: f64 = 0.01;
/// The protected segment's share of the main space (Caffeine: 0.8); a smaller share loses
/// less where recency matters (docs/LOG.md, "Policy tuning").
const PROTECTED_SHARE: f64 = 0.60;
/// A candidate at least this frequent but not more frequent than the victim is still admitted
/// with probability 1/128, so that an attacker cannot pin the main space with keys whose
/// estimates it inflated.
const HASHDOS_FLOOR: u64 = 6;
/// A candidate must be seen more than this many times more often than the victim to replace
/// it. The sketch halves all its counters at once, so for a while after each halving a
/// candidate just counted looks one higher than an equally frequent victim not yet counted
/// again; without the margin, keys read in a loop displace each other after every halving.
const ADMIT_MARGIN: u64 = 1;
/// Against a victim that entered the main space unchallenged (while it had room, so without
/// a duel) and has not been hit since, a candidate seen at least this often needs only to be
/// more frequent, without the margin. Once a cache fills, its main space holds whatever
/// came first, unproven; with the margin, only keys seen three times could replace them, and
/// the main space turns over too slowly. A candidate seen once is not enough: keys that
/// return after a long loop would be displaced by newcomers seen once.
///
/// This applies only once the main space has had a hit (its protected segment holds an
/// entry): until then nothing in it has proven itself either, and the fill may simply not
/// have come round yet; in a loop longer than the cache, the keys missed on the second pass
/// are all seen twice and would each push out a fill key about to be read again.
const UNCHALLENGED_MIN: u64 = 2;

/// A write as the policy knows it: the [`Link`] inside its table node. Valid only under the
/// lock of its shard, by the rules of "Succession" above.
pub(crate) type Tracked = NonNull<Link>;

/// An entry as `Core::ranked` orders it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Ranked {
    /// Higher is listed first (see `preference`).
    pub(crate) pref: (u64, u8, u32),
    /// The entry's table hash, read under the lock, to find its node again (by `node`'s
    /// address) once the lock is released.
    pub(crate) hash: u64,
    pub(crate) node: Tracked,
}

impl Ranked {
    /// How much a listing wants an entry whose value to the policy is `score` (higher is
    /// valued more: the frequency estimate, the region's rank, probation 0, window 1,
    /// protected 2, and the position in the region from its least recent entry): the score
    /// itself for the hottest, its complement (the same order reversed) for the coldest.
    fn preference(score: (u64, u8, u32), hottest: bool) -> (u64, u8, u32) {
        if hottest {
            score
        } else {
            (!score.0, !score.1, !score.2)
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum Region {
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
struct PNode {
    node: Tracked,
    /// The previous record in the region's list (`NIL`: none) below `LINK_BITS`, the
    /// region above.
    back: u32,
    /// The next record in the region's list (`NIL`: none) below `LINK_BITS`, the flags
    /// `UNCHALLENGED` and `ZONED` above.
    fore: u32,
}

impl PNode {
    /// A record of `node` in no list yet, with no flag.
    fn new(node: Tracked) -> Self {
        PNode {
            node,
            back: NIL,
            fore: NIL,
        }
    }

    fn prev(&self) -> u32 {
        self.back & LINK_MASK
    }

    fn next(&self) -> u32 {
        self.fore & LINK_MASK
    }

    fn set_prev(&mut self, i: u32) {
        self.back = (self.back & !LINK_MASK) | i;
    }

    fn set_next(&mut self, i: u32) {
        self.fore = (self.fore & !LINK_MASK) | i;
    }

    fn region(&self) -> Region {
        match self.back >> LINK_BITS {
            0 => Region::Window,
            1 => Region::Probation,
            _ => Region::Protected,
        }
    }

    fn set_region(&mut self, region: Region) {
        self.back = (self.back & LINK_MASK) | (region as u32) << LINK_BITS;
    }

    fn unchallenged(&self) -> bool {
        self.fore & UNCHALLENGED != 0
    }

    fn set_unchallenged(&mut self, on: bool) {
        self.set_flag(UNCHALLENGED, on);
    }

    fn zoned(&self) -> bool {
        self.fore & ZONED != 0
    }

    fn set_zoned(&mut self, on: bool) {
        self.set_flag(ZONED, on);
    }

    /// Sets or clears `flag`, one of the bits of `fore` above the link.
    fn set_flag(&mut self, flag: u32, on: bool) {
        self.fore = if on {
            self.fore | flag
        } else {
            self.fore & !flag
        };
    }
}

/// A doubly linked list through `nodes`: `head` is the least recently used.
#[derive(Debug, Clone, Copy)]
struct List {
    head: u32,
    tail: u32,
    weight: u64,
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

/// An entry the policy chose to evict, already detached (its record released): the caller
/// removes its node from the table, if the table still holds it and it is not a load in
/// progress, while it holds the shard's lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Victim {
    pub(crate) node: Tracked,
    /// Its policy key, by which the tests know their entries (the cache knows them by node).
    #[cfg(test)]
    pub(crate) pkey: u64,
}

// SAFETY: a victim is held only under its shard's lock (in the shard's scratch list, empty
// between writes), like the records it comes from (see `Core`'s `Send`).
unsafe impl Send for Victim {}

/// A write the table now holds: the key's policy key, the write's node, the node it
/// replaced in the table (if any), and its weight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Write {
    pub(crate) pkey: u64,
    pub(crate) node: Tracked,
    pub(crate) old: Option<Tracked>,
    pub(crate) weight: u64,
}

/// What the cache reports of a tracked entry when the policy looks at it: the hits since the
/// last look (counted in the entry, see `policy/mod.rs`; the look resets them) and whether it
/// has expired. An entry the table no longer holds reports no hits.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Look {
    pub(crate) hits: u8,
    pub(crate) expired: bool,
}

/// The cache's side of a look.
pub(crate) type Probe<'a> = dyn FnMut(&Victim) -> Look + 'a;

/// Where a record's policy key comes from.
#[derive(Debug)]
enum Keys {
    /// Kept beside the records, by record number: keys the node cannot give (the shared
    /// tier's, hashed from the key alike in every process), and the tests' own; with an
    /// index from policy key to record where entries must be found by policy key (see
    /// `EvictionPolicy::find`).
    Stored {
        keys: Vec<u64>,
        index: Option<Index>,
    },
    /// Read from the record's node: the policy key of its table hash (`pkey_of_hash`),
    /// which lies `back` bytes before the node's link.
    Derived { back: usize, seed: u64 },
}

#[derive(Debug)]
pub(crate) struct Core {
    nodes: Vec<PNode>,
    keys: Keys,
    /// Each record's weight (a weigher's answer, see `Write::weight`), by record number;
    /// `None` while every write has weighed 1, as without a weigher, and then a record at or
    /// past the end weighs 1 too.
    weights: Option<Vec<u64>>,
    free: Vec<u32>,
    lists: [List; 3],
    sketch: Sketch,
    max: u64,
    window_max: u64,
    protected_max: u64,
    sizer: Sizer,
    /// Probation's cold zone: its oldest entries, up to the sizer's reach in weight. `zone_end`
    /// is the zone's newest entry (none: `NIL`); the zone is always a prefix of probation.
    zone_end: u32,
    zone_weight: u64,
    rng: u64,
}

/// The most `reserve` sets aside for nodes ahead of need.
const RESERVE_MAX_BYTES: usize = 32 << 20;

impl Core {
    /// A policy for `max` weight units (entries, without a weigher).
    #[cfg(test)]
    pub(crate) fn new(max: u64, seed: u64) -> Self {
        Self::with_sketch(max, max, seed)
    }

    /// A policy for `max` weight units whose frequency sketch is sized for `sketched` entries
    /// (a cache split into shards bounds their sketches together).
    pub(crate) fn with_sketch(max: u64, sketched: u64, seed: u64) -> Self {
        let mut core = Core {
            nodes: Vec::new(),
            keys: Keys::Stored {
                keys: Vec::new(),
                index: None,
            },
            weights: None,
            free: Vec::new(),
            lists: [List::default(); 3],
            sketch: Sketch::new(sketched.min(max) as usize, seed),
            max,
            window_max: 0,
            protected_max: 0,
            sizer: Sizer::new(max),
            zone_end: NIL,
            zone_weight: 0,
            rng: seed | 1,
        };
        core.set_window(core.initial_window());
        core
    }

    /// The window's first size: `WINDOW_START` of the capacity, and at least one entry, as
    /// Caffeine sizes it.
    fn initial_window(&self) -> u64 {
        self.max - (self.max as f64 * (1.0 - WINDOW_START)) as u64
    }

    /// Sets the window's share. It never goes below one unit: the newest write waits there
    /// (see `make_room`), and a window of zero would send it straight to a duel.
    fn set_window(&mut self, window: u64) {
        self.window_max = window.max(1).min(self.max);
        let main = self.max - self.window_max;
        self.protected_max = (main as f64 * PROTECTED_SHARE) as u64;
    }

    /// Total weight held.
    pub(crate) fn weight(&self) -> u64 {
        self.lists.iter().map(|l| l.weight).sum()
    }

    /// Keeps an index from policy key to record, for `find` (the policy keys must be kept
    /// beside the records, as they are unless `derive_pkeys` was called).
    pub(crate) fn index_by_pkey(&mut self) {
        debug_assert!(matches!(self.keys, Keys::Stored { .. }));
        if let Keys::Stored { index, .. } = &mut self.keys {
            index.get_or_insert_with(Index::default);
        }
    }

    /// Reads each record's policy key from its node instead of keeping it: the table hash,
    /// an initialised `u64` that lies `back` bytes before the link in every node reported
    /// to this policy, through `pkey_of_hash` with `seed`. Only before the first write, and
    /// without an index.
    ///
    /// # Safety
    /// Every write reported to this policy has its table hash there, in the same
    /// allocation as its link, with the provenance of its `Tracked`, and never written
    /// while the node is live.
    pub(crate) unsafe fn derive_pkeys(&mut self, back: usize, seed: u64) {
        debug_assert!(
            self.nodes.is_empty() && matches!(self.keys, Keys::Stored { index: None, .. })
        );
        self.keys = Keys::Derived { back, seed };
    }

    /// Record `i`'s policy key.
    #[inline]
    fn pkey(&self, i: u32) -> u64 {
        match &self.keys {
            Keys::Stored { keys, .. } => keys[i as usize],
            Keys::Derived { back, seed } => {
                // SAFETY: a record's node is live under the shard's lock ("Succession"), and
                // its hash lies there, unchanging (`derive_pkeys`'s contract).
                let hash = unsafe {
                    self.nodes[i as usize]
                        .node
                        .byte_sub(*back)
                        .cast::<u64>()
                        .read()
                };
                pkey_of_hash(hash, *seed)
            }
        }
    }

    /// Reserves room for `entries` nodes, up to `RESERVE_MAX_BYTES`, if the memory can be had:
    /// an unweighted policy knows how many nodes it will hold, and growing by doubling leaves
    /// the allocator holding the smaller arrays freed on the way. Reserved pages not yet
    /// written are not resident. Beyond the bound the array grows by doubling: an allocator
    /// serves arrays that large from their own mappings (glibc from 32 MiB at most), so a
    /// grown array's old one goes back to the system, and a cache configured far larger than
    /// it will ever be does not reserve address space for its capacity.
    pub(crate) fn reserve(&mut self, entries: u64) {
        let most = (RESERVE_MAX_BYTES / std::mem::size_of::<PNode>()) as u64;
        if let Ok(n) = usize::try_from(entries.saturating_add(1).min(most)) {
            let _ = self.nodes.try_reserve_exact(n);
            if let Keys::Stored { keys, .. } = &mut self.keys {
                let _ = keys.try_reserve_exact(n);
            }
        }
    }

    /// Where the sketch's counters are (see `Sketch::hint`).
    pub(crate) fn sketch_hint(&self) -> super::sketch::Hint {
        self.sketch.hint()
    }

    /// The capacity, in weight units.
    #[cfg(test)]
    pub(crate) fn max(&self) -> u64 {
        self.max
    }

    /// The `n` entries this shard values most (`hottest`) or least, best first: by the
    /// sketch's frequency estimate plus the hits that the sketch has not seen yet (`look`
    /// reports them, with the entry's table hash), then by region (protected, window, probation: the
    /// order in which they would be kept), then by recency within the region. O(entries
    /// log n) time, O(n) memory.
    pub(crate) fn ranked(
        &self,
        n: usize,
        hottest: bool,
        look: &dyn Fn(Tracked) -> (u64, u64),
    ) -> Vec<Ranked> {
        // The `n` largest preferences: a min-heap of them, its least pushed out.
        let mut kept: BinaryHeap<Reverse<Ranked>> = BinaryHeap::new();
        for (region, rank) in [
            (Region::Probation, 0),
            (Region::Window, 1),
            (Region::Protected, 2),
        ] {
            // From the least recent: a later position is more recent.
            let (mut i, mut position) = (self.lists[region as usize].head, 0u32);
            while i != NIL && n > 0 {
                let node = &self.nodes[i as usize];
                let (pending, hash) = look(node.node);
                let score = (
                    self.sketch.frequency(self.pkey(i)) + pending,
                    rank,
                    position,
                );
                kept.push(Reverse(Ranked {
                    pref: Ranked::preference(score, hottest),
                    hash,
                    node: node.node,
                }));
                if kept.len() > n {
                    kept.pop();
                }
                i = node.next();
                position = position.saturating_add(1);
            }
        }
        kept.into_sorted_vec()
            .into_iter()
            .map(|Reverse(r)| r)
            .collect()
    }

    /// Keys tracked.
    pub(crate) fn len(&self) -> usize {
        self.nodes.len() - self.free.len()
    }

    /// The link of record `i`'s node.
    #[inline]
    fn link(&self, i: u32) -> &Link {
        // SAFETY: a record's node is live while the shard's lock is held, which `&self` of a
        // shard implies ("Succession"; the contract of the `EvictionPolicy` methods).
        unsafe { self.nodes[i as usize].node.as_ref() }
    }

    /// Takes `node` out of the policy's view: it becomes `DETACHED`; the record it had, if
    /// any, is returned for its successor to take or for release.
    ///
    /// # Safety
    /// `node` is live, and it has left the table or is the load that took its place.
    unsafe fn detach(&mut self, node: Tracked) -> Option<u32> {
        // SAFETY: live (the caller's contract).
        let link = unsafe { node.as_ref() };
        let record = link.record();
        link.set_record(DETACHED);
        // A link naming a record that does not point back is a broken invariant (another
        // shard's record, say): stop here (the caller aborts) rather than move another
        // key's record. The record's line is read next anyway.
        assert!(
            record >= DETACHED
                || self
                    .nodes
                    .get(record as usize)
                    .is_some_and(|n| n.node == node),
            "herdcache: a policy link names a record that does not track it"
        );
        (record < DETACHED).then_some(record)
    }

    /// `inherited`, the record of the write a write of policy key `pkey` replaced, if it is
    /// of that key. A key whose `Hash` disagrees with itself may come with another policy key
    /// than its record's: that record's key is gone (released here), and the write is a new
    /// key.
    fn of_key(&mut self, inherited: Option<u32>, pkey: u64) -> Option<u32> {
        match inherited {
            Some(i) if self.pkey(i) != pkey => {
                self.drop_record(i);
                None
            }
            kept => kept,
        }
    }

    /// Record `i`'s weight.
    #[inline]
    fn weight_of(&self, i: u32) -> u64 {
        self.weights
            .as_ref()
            .and_then(|w| w.get(i as usize))
            .map_or(1, |&w| w)
    }

    /// Gives record `i` the weight of a write weighing `weight`. The first weight other than
    /// 1 makes the policy keep weights.
    fn set_weight(&mut self, i: u32, weight: u64) {
        if self.weights.is_none() && weight == 1 {
            return;
        }
        let weights = self.weights.get_or_insert_with(Vec::new);
        if weights.len() <= i as usize {
            weights.resize(self.nodes.len().max(i as usize + 1), 1);
        }
        weights[i as usize] = weight;
    }

    /// Records a new key. A shard holds fewer than `NIL` (2^30 - 1) records: each is a node
    /// in memory, and a billion of them would take a hundred gigabytes.
    fn alloc(&mut self, node: PNode, pkey: u64) -> u32 {
        let i = match self.free.pop() {
            Some(i) => {
                self.nodes[i as usize] = node;
                i
            }
            None => {
                assert!(
                    self.nodes.len() < NIL as usize,
                    "herdcache: policy shard full"
                );
                self.nodes.push(node);
                (self.nodes.len() - 1) as u32
            }
        };
        if let Keys::Stored { keys, index } = &mut self.keys {
            match keys.get_mut(i as usize) {
                Some(k) => *k = pkey,
                None => keys.push(pkey),
            }
            if let Some(index) = index {
                index.insert(pkey, i, |i| keys[i as usize]);
            }
        }
        i
    }

    /// Lets go of record `i` (unlinked already).
    fn release(&mut self, i: u32) {
        if let Keys::Stored {
            keys,
            index: Some(index),
        } = &mut self.keys
        {
            let held = index.remove(keys[i as usize], i);
            debug_assert!(held, "every record is indexed");
        }
        self.free.push(i);
    }

    /// Unlinks and releases record `i`.
    fn drop_record(&mut self, i: u32) {
        self.unlink(i);
        self.release(i);
    }

    fn push(&mut self, i: u32, region: Region) {
        let tail = self.lists[region as usize].tail;
        {
            let n = &mut self.nodes[i as usize];
            n.set_region(region);
            n.set_prev(tail);
            n.set_next(NIL);
        }
        match tail {
            NIL => self.lists[region as usize].head = i,
            t => self.nodes[t as usize].set_next(i),
        }
        let weight = self.weight_of(i);
        let list = &mut self.lists[region as usize];
        list.tail = i;
        list.weight += weight;
    }

    /// Links `i` into `anchor`'s region just before `anchor` (more recent than all but it).
    fn push_before(&mut self, i: u32, anchor: u32) {
        let (region, prev) = {
            let a = &self.nodes[anchor as usize];
            (a.region(), a.prev())
        };
        {
            let n = &mut self.nodes[i as usize];
            n.set_region(region);
            n.set_prev(prev);
            n.set_next(anchor);
        }
        self.nodes[anchor as usize].set_prev(i);
        match prev {
            NIL => self.lists[region as usize].head = i,
            p => self.nodes[p as usize].set_next(i),
        }
        self.lists[region as usize].weight += self.weight_of(i);
    }

    fn unlink(&mut self, i: u32) {
        let weight = self.weight_of(i);
        let (prev, next, region) = {
            let n = &mut self.nodes[i as usize];
            if n.zoned() {
                n.set_zoned(false);
                self.zone_weight -= weight;
                if self.zone_end == i {
                    // The zone is a prefix: the entry before it is in the zone too, or none.
                    self.zone_end = n.prev();
                }
            }
            (n.prev(), n.next(), n.region())
        };
        match prev {
            NIL => self.lists[region as usize].head = next,
            p => self.nodes[p as usize].set_next(next),
        }
        match next {
            NIL => self.lists[region as usize].tail = prev,
            n => self.nodes[n as usize].set_prev(prev),
        }
        self.lists[region as usize].weight -= weight;
    }

    /// A rewrite of a tracked key: most recently used in its region, and promoted from
    /// probation to protected.
    fn touch(&mut self, i: u32, probe: &mut Probe<'_>, budget: &mut usize) {
        let region = self.nodes[i as usize].region();
        self.unlink(i);
        match region {
            Region::Window => self.push(i, Region::Window),
            Region::Probation | Region::Protected => {
                self.nodes[i as usize].set_unchallenged(false);
                self.push(i, Region::Protected);
                self.demote_overflow(probe, budget);
            }
        }
    }

    /// Looks at entry `i`: folds its hits into the sketch.
    fn look(&mut self, i: u32, probe: &mut Probe<'_>) -> Look {
        let look = probe(&self.victim(i));
        if look.hits > 0 {
            let pkey = self.pkey(i);
            for _ in 0..look.hits {
                self.sketch.increment(pkey);
            }
        }
        look
    }

    /// Keeps the protected segment within its share: its oldest go back to probation, unless
    /// they were hit since the last look (then they go round again).
    fn demote_overflow(&mut self, probe: &mut Probe<'_>, budget: &mut usize) {
        while self.lists[Region::Protected as usize].weight > self.protected_max {
            let oldest = self.lists[Region::Protected as usize].head;
            if oldest == NIL {
                break;
            }
            let look = self.look(oldest, probe);
            self.unlink(oldest);
            if look.hits > 0 && !look.expired && *budget > 0 {
                *budget -= 1;
                self.push(oldest, Region::Protected);
            } else {
                self.push(oldest, Region::Probation);
            }
        }
    }

    /// Brings probation's cold zone up to the sizer's reach, looking at each entry as it
    /// enters: one hit since its last look is promoted now, as it would be at the cold end.
    /// So a hit found at the cold end on a zoned entry came within `reach` of eviction: a main
    /// space `reach` smaller would have missed it, which is the sizer's loss signal, measured
    /// rather than estimated from the segment's length (hits come mostly soon after an entry
    /// arrives, so a share of its stay overstated the loss and kept windows small).
    fn fill_zone(&mut self, probe: &mut Probe<'_>, budget: &mut usize) {
        let reach = self.sizer.reach();
        while self.zone_weight < reach {
            let next = match self.zone_end {
                NIL => self.lists[Region::Probation as usize].head,
                e => self.nodes[e as usize].next(),
            };
            if next == NIL {
                break;
            }
            let look = self.look(next, probe);
            if look.hits > 0 && !look.expired && *budget > 0 {
                *budget -= 1;
                self.promote(next, probe, budget);
                continue;
            }
            self.nodes[next as usize].set_zoned(true);
            self.zone_weight += self.weight_of(next);
            self.zone_end = next;
        }
    }

    /// A probation entry hit since its last look moves to protected.
    fn promote(&mut self, i: u32, probe: &mut Probe<'_>, budget: &mut usize) {
        self.nodes[i as usize].set_unchallenged(false);
        self.unlink(i);
        self.push(i, Region::Protected);
        self.demote_overflow(probe, budget);
    }

    fn main_weight(&self) -> u64 {
        self.lists[Region::Probation as usize].weight
            + self.lists[Region::Protected as usize].weight
    }

    /// The main space's next victim: probation's oldest, else protected's; never `newest`
    /// (the write being made, see `make_room`).
    fn main_victim(&self, newest: u32) -> u32 {
        let probation = self.oldest_but(Region::Probation, newest);
        match probation {
            NIL => self.oldest_but(Region::Protected, newest),
            v => v,
        }
    }

    /// The oldest entry of `region` other than `newest`, or `NIL`.
    fn oldest_but(&self, region: Region, newest: u32) -> u32 {
        match self.lists[region as usize].head {
            h if h == newest && h != NIL => self.nodes[h as usize].next(),
            h => h,
        }
    }

    fn victim(&self, i: u32) -> Victim {
        Victim {
            node: self.nodes[i as usize].node,
            #[cfg(test)]
            pkey: self.pkey(i),
        }
    }

    /// Evicts record `i`: its node is detached here, and the caller takes it out of the
    /// table (a successor not yet reported then finds no record to take, and is a new key).
    fn evict(&mut self, i: u32, out: &mut Vec<Victim>) {
        out.push(self.victim(i));
        self.link(i).set_record(DETACHED);
        self.drop_record(i);
    }

    fn next_random(&mut self) -> u64 {
        // xorshift64: only for the rare hash-flooding admission.
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        self.rng
    }

    /// Starts loading the sketch counters of the window's oldest entry and of probation's,
    /// the candidate and the victim of the duel this write most likely ends with, so that
    /// their misses overlap with the write's bookkeeping (see `prefetch.rs`).
    fn prefetch_duel(&self) {
        for region in [Region::Window, Region::Probation] {
            let head = self.lists[region as usize].head;
            if head != NIL {
                self.sketch.prefetch(self.pkey(head));
            }
        }
    }

    /// TinyLFU's admission: whether the candidate should replace the victim.
    fn admit(&mut self, candidate: u32, victim: u32) -> bool {
        let c = self.sketch.frequency(self.pkey(candidate));
        let v = self.sketch.frequency(self.pkey(victim));
        let relaxed = self.nodes[victim as usize].unchallenged()
            && c >= UNCHALLENGED_MIN
            && self.lists[Region::Protected as usize].weight > 0;
        let margin = if relaxed { 0 } else { ADMIT_MARGIN };
        if c > v + margin {
            true
        } else if c >= HASHDOS_FLOOR {
            self.next_random() & 127 == 0
        } else {
            false
        }
    }

    /// Brings the regions back within their shares after a write of entry `newest`.
    ///
    /// The newest write is never the victim of the admission it triggers (read-your-write,
    /// DESIGN.md §10 invariant 6): it stays the window's most recent entry (entries given a
    /// second chance go just before it), so it leaves the window only when it alone
    /// overflows it, and then it enters the main space without a duel. (`write` evicts an
    /// entry heavier than the whole capacity before coming here.)
    fn make_room(
        &mut self,
        newest: u32,
        out: &mut Vec<Victim>,
        probe: &mut Probe<'_>,
        budget: &mut usize,
    ) {
        // The window's overflow goes to the main space, through admission once it is full.
        // The window and the main space are LRU lists whose hits are seen late (at a look),
        // so an entry hit since its last look gets a second chance, as in CLOCK.
        while self.lists[Region::Window as usize].weight > self.window_max {
            let c = self.lists[Region::Window as usize].head;
            if c == NIL {
                break;
            }
            let forced = c == newest;
            let lc = if forced {
                Look::default()
            } else {
                self.look(c, probe)
            };
            self.unlink(c);
            if lc.expired {
                self.push(c, Region::Probation);
                self.evict(c, out);
                continue;
            }
            if lc.hits > 0 && *budget > 0 {
                *budget -= 1;
                self.requeue_in_window(c, newest);
                continue;
            }
            let main_max = self.max - self.window_max;
            let cw = self.weight_of(c);
            let mut dueled = false;
            loop {
                // Into the main space without a duel while it has room, or while the whole
                // cache does (with weights, the main space's share may be too small for the
                // next entry while the window's is unused: a cache of 1 MiB held only 15
                // entries of 64 KiB, the 16th fitting). With unit weights the second never
                // holds without the first: the window overflows, so it holds its share.
                if self.main_weight() + cw <= main_max || self.weight() + cw <= self.max {
                    self.nodes[c as usize].set_unchallenged(!dueled);
                    self.push(c, Region::Probation);
                    break;
                }
                dueled = true;
                self.fill_zone(probe, budget);
                let v = self.main_victim(newest);
                if v == NIL {
                    // Heavier than the whole main space: it cannot stay.
                    self.push(c, Region::Probation);
                    break;
                }
                let lv = self.look(v, probe);
                if lv.expired {
                    self.evict(v, out);
                    continue;
                }
                if lv.hits > 0 && *budget > 0 {
                    // Hit since its last look: it is not the least recently used after all.
                    *budget -= 1;
                    if self.nodes[v as usize].zoned() {
                        self.sizer.cold_hit();
                    }
                    self.promote(v, probe, budget);
                    continue;
                }
                if forced || self.admit(c, v) {
                    self.evict(v, out);
                } else {
                    // Back in place only to leave through `evict`'s bookkeeping.
                    self.push(c, Region::Probation);
                    self.sizer.rejected(self.pkey(c));
                    self.evict(c, out);
                    break;
                }
            }
        }
        self.evict_overflow(newest, out, probe, budget);
    }

    /// Evicts until the total weight is within the capacity: main space first, `newest` (the
    /// write being made, `NIL`: none) last.
    fn evict_overflow(
        &mut self,
        newest: u32,
        out: &mut Vec<Victim>,
        probe: &mut Probe<'_>,
        budget: &mut usize,
    ) {
        // Over in total still (a heavy entry, or a window that just grew): main space first,
        // the newest write last. Main victims are looked at as in a duel: a window that grows
        // shrinks the main space, and a victim hit near its cold end is the loss the sizer
        // weighs against the window's gain; evicted unseen, those hits would go uncounted
        // and each growth would make the next one look cheaper.
        while self.weight() > self.max {
            let first = self.main_victim(newest);
            if first == NIL {
                let w = self.oldest_but(Region::Window, newest);
                if w == NIL {
                    break;
                }
                self.evict(w, out);
                continue;
            }
            self.fill_zone(probe, budget);
            let v = match self.main_victim(newest) {
                NIL => first,
                v => v,
            };
            let lv = self.look(v, probe);
            if !lv.expired && lv.hits > 0 && *budget > 0 {
                *budget -= 1;
                if self.nodes[v as usize].zoned() {
                    self.sizer.cold_hit();
                }
                self.promote(v, probe, budget);
                continue;
            }
            self.evict(v, out);
        }
    }

    /// Changes the capacity to `max` weight units: the window keeps its share of it, the
    /// sizer starts learning afresh, and what no longer fits is evicted to `out`.
    fn resize_to(&mut self, max: u64, out: &mut Vec<Victim>, probe: &mut Probe<'_>) {
        let share = self.window_max as f64 / self.max.max(1) as f64;
        self.max = max;
        self.sizer = Sizer::new(max);
        self.set_window((max as f64 * share).round() as u64);
        let mut budget = 2 * self.len() + 16;
        self.demote_overflow(probe, &mut budget);
        self.evict_overflow(NIL, out, probe, &mut budget);
    }

    /// A window entry given a second chance goes back as the window's most recent, but
    /// before the newest write when that is in the window, so the newest stays the last to
    /// leave.
    fn requeue_in_window(&mut self, i: u32, newest: u32) {
        if newest != i && newest != NIL && self.nodes[newest as usize].region() == Region::Window {
            self.push_before(i, newest);
        } else {
            self.push(i, Region::Window);
        }
    }

    /// Moves the window as the sizer decided.
    fn resize(&mut self, resize: Resize, probe: &mut Probe<'_>, budget: &mut usize) {
        let window = match resize {
            Resize::Keep => return,
            Resize::Grow(by) => self.window_max.saturating_add(by),
            Resize::Shrink(by) => self.window_max.saturating_sub(by),
            Resize::Restart => self.initial_window(),
        };
        self.set_window(window);
        self.demote_overflow(probe, budget);
    }
}

/// The record a write is tracked by (see `Core::succeed`).
enum Took {
    /// The replaced node's record, which now points at the write, with its weight.
    Inherited(u32),
    /// A new record, at the window's most recent end.
    New(u32),
}

impl Core {
    /// Applies the rules of "Succession" to `write`: the record of the node it replaced
    /// passes to it, re-weighed, or it gets a new one; `None` if its node was taken out of
    /// the table and reported already (the inherited record, tracking nothing now, is
    /// released). No use is counted and nothing is evicted.
    ///
    /// # Safety
    /// As [`EvictionPolicy::write`].
    unsafe fn succeed(&mut self, write: &Write) -> Option<Took> {
        let Write {
            pkey,
            node,
            old,
            weight,
        } = *write;
        // SAFETY: `old` has left the table and `node` is live (the caller's contract).
        let inherited = old.and_then(|o| unsafe { self.detach(o) });
        // SAFETY: as above.
        let link = unsafe { node.as_ref() };
        if link.record() != UNREPORTED {
            if let Some(i) = inherited {
                self.drop_record(i);
            }
            return None;
        }
        Some(match self.of_key(inherited, pkey) {
            Some(i) => {
                link.set_record(i);
                let old = self.weight_of(i);
                self.set_weight(i, weight);
                let n = &mut self.nodes[i as usize];
                n.node = node;
                let region = n.region();
                if n.zoned() {
                    self.zone_weight = self.zone_weight - old + weight;
                }
                let list = &mut self.lists[region as usize];
                list.weight = list.weight - old + weight;
                Took::Inherited(i)
            }
            None => {
                let i = self.alloc(PNode::new(node), pkey);
                self.set_weight(i, weight);
                link.set_record(i);
                self.push(i, Region::Window);
                Took::New(i)
            }
        })
    }
}

// SAFETY: a `Core` is used by one thread at a time (the holder of its shard's lock). The
// nodes its records point at are shared by every thread already (their links are
// atomics), and are read only under that lock.
unsafe impl Send for Core {}

impl EvictionPolicy for Core {
    /// A write that the table now holds: a new key, or a new value (or weight) for a key.
    /// Evicts to stay within the capacity, pushing the victims to `out`.
    /// `probe` looks at a tracked entry: its hits since the last look (folded into the
    /// sketch, and a second chance in its region) and whether it has expired (evicted without
    /// a duel, before live ones). `served` reads the cache's lookup counters, for the sizer.
    unsafe fn write(
        &mut self,
        write: Write,
        out: &mut Vec<Victim>,
        probe: &mut Probe<'_>,
        served: &Served<'_>,
    ) {
        let (pkey, weight) = (write.pkey, write.weight);
        // A new key grows the window, which then most likely sends its oldest to a duel.
        if write.old.is_none() {
            self.prefetch_duel();
        }
        // SAFETY: the caller's contract.
        let Some(took) = (unsafe { self.succeed(&write) }) else {
            return;
        };
        // Second chances given in this call: each resets the entry's hits, so a pass over
        // every entry ends them; the bound also covers hits arriving meanwhile. (Counted
        // without this write's own record.)
        let mut budget = 2 * (self.len() - usize::from(matches!(took, Took::New(_)))) + 16;
        self.sketch.increment(pkey);
        let newest = match took {
            Took::Inherited(i) => {
                self.touch(i, probe, &mut budget);
                i
            }
            Took::New(i) => {
                self.sketch.fit(self.len());
                let resize = self.sizer.new_key(pkey, weight, served);
                self.resize(resize, probe, &mut budget);
                i
            }
        };
        if weight > self.max {
            // It cannot stay, and making room for it would only evict others for nothing.
            self.evict(newest, out);
            return;
        }
        self.make_room(newest, out, probe, &mut budget);
    }

    unsafe fn resize(&mut self, max: u64, out: &mut Vec<Victim>, probe: &mut Probe<'_>) {
        self.resize_to(max, out, probe);
    }

    unsafe fn settle(&mut self, write: Write) {
        // SAFETY: the caller's contract.
        unsafe { self.succeed(&write) };
    }

    unsafe fn carry(&mut self, old: Tracked, new: Tracked, pkey: u64) {
        // SAFETY: the caller's contract.
        let inherited = unsafe { self.detach(old) };
        let inherited = self.of_key(inherited, pkey);
        // SAFETY: the caller's contract.
        let link = unsafe { new.as_ref() };
        match inherited {
            Some(i) if link.record() == UNREPORTED => {
                link.set_record(i);
                self.nodes[i as usize].node = new;
            }
            Some(i) => self.drop_record(i),
            None if link.record() == UNREPORTED => link.set_record(DETACHED),
            None => {}
        }
    }

    unsafe fn remove(&mut self, gone: Tracked) {
        // SAFETY: the caller's contract.
        if let Some(i) = unsafe { self.detach(gone) } {
            self.drop_record(i);
        }
    }

    fn find(&self, pkey: u64, wanted: &mut dyn FnMut(Tracked) -> bool) -> Option<Tracked> {
        let (nodes, Keys::Stored { keys, index }) = (&self.nodes, &self.keys) else {
            debug_assert!(false, "only a policy that keeps its keys is found by key");
            return None;
        };
        let key_of = |i: u32| keys[i as usize];
        let i = index
            .as_ref()?
            .get(pkey, key_of, |i| wanted(nodes[i as usize].node))?;
        Some(nodes[i as usize].node)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::window::Requests;
    use std::collections::HashMap;
    use std::rc::Rc;

    /// The cache's side, as a policy sees it: a table of one node (a shared link) per
    /// key, the hits recorded in them (reported and reset at a look), and the lookups served
    /// (a hit per `hit`, a miss per write). Writes report in table order unless a test
    /// reorders them.
    #[derive(Default)]
    struct Entries {
        /// Shared, not boxed: the policy writes through its own pointers to the nodes, which
        /// a `Box` moved into the map would claim to own alone.
        table: HashMap<u64, Rc<Link>>,
        hits: HashMap<u64, u8>,
        served: Requests,
    }

    fn tracked(link: &Link) -> Tracked {
        NonNull::from(link)
    }

    impl Entries {
        fn hit(&mut self, key: u64) {
            let h = self.hits.entry(key).or_default();
            *h = (*h + 1).min(3);
            self.served.hits += 1;
        }
        /// Whether the table holds `key`: every key the policy has not evicted.
        fn holds(&self, key: u64) -> bool {
            self.table.contains_key(&key)
        }
        /// Takes the victims out of the table, as the cache does, checking each was the
        /// key's node and is detached.
        fn evicted(&mut self, out: &[Victim]) {
            for v in out {
                let node = self
                    .table
                    .remove(&v.pkey)
                    .expect("a victim the table holds");
                assert_eq!(tracked(&node), v.node, "the victim is the key's node");
                assert_eq!(node.record(), DETACHED, "a victim is detached");
                self.hits.remove(&v.pkey);
            }
        }
        /// Writes `key` with `weight` (a new node replacing the key's last, reported at once),
        /// looking at entries with `look` (by default, the hits recorded); returns the
        /// victims, taken out of the table.
        fn put(
            &mut self,
            core: &mut Core,
            key: u64,
            weight: u64,
            look: Option<&mut Probe<'_>>,
        ) -> Vec<Victim> {
            let node = Rc::new(Link::new());
            let write = Write {
                pkey: key,
                node: tracked(&node),
                old: None,
                weight,
            };
            let old = self.table.insert(key, node);
            let write = Write {
                old: old.as_deref().map(tracked),
                ..write
            };
            self.served.misses += 1;
            let served = self.served;
            let mut out = Vec::new();
            let hits = &mut self.hits;
            let mut recorded = |v: &Victim| Look {
                hits: hits.remove(&v.pkey).unwrap_or(0),
                expired: false,
            };
            let look: &mut Probe<'_> = match look {
                Some(look) => look,
                None => &mut recorded,
            };
            // SAFETY: both nodes are live; the old one left the table just now.
            unsafe { core.write(write, &mut out, look, &|| served) };
            self.evicted(&out);
            out
        }
        /// Every node in the table names its record, and each record points back at it.
        fn check(&self, core: &Core) {
            assert_eq!(core.len(), self.table.len(), "one record per key held");
            for (key, node) in &self.table {
                let r = node.record();
                assert!(r < DETACHED, "key {key} has no record");
                assert_eq!(core.nodes[r as usize].node, tracked(node));
                assert_eq!(core.pkey(r), *key);
            }
        }
    }

    fn write_w(core: &mut Core, e: &mut Entries, key: u64, w: u64) -> Vec<Victim> {
        e.put(core, key, w, None)
    }

    /// A lookup of `key` as the cache does it: a hit if the table holds the key, else a
    /// miss and a write.
    fn read(core: &mut Core, e: &mut Entries, key: u64) -> bool {
        if e.holds(key) {
            e.hit(key);
            true
        } else {
            write(core, e, key);
            false
        }
    }

    fn write(core: &mut Core, e: &mut Entries, key: u64) -> Vec<Victim> {
        write_w(core, e, key, 1)
    }

    /// Reports a write of weight 1 of `node` for `pkey`, in place of `old`, with no hits to
    /// look at; returns the victims. The nodes must live to the end of the test.
    fn report(core: &mut Core, pkey: u64, node: &Link, old: Option<&Link>) -> Vec<Victim> {
        let w = Write {
            pkey,
            node: tracked(node),
            old: old.map(tracked),
            weight: 1,
        };
        let mut out = Vec::new();
        // SAFETY: the nodes are live (the caller's word).
        unsafe { core.write(w, &mut out, &mut |_| Look::default(), &Requests::default) };
        out
    }

    /// A cache configured for far more than it holds pays for the counters of what it holds.
    #[test]
    fn a_policy_far_from_its_capacity_counts_for_the_keys_it_holds() {
        let mut core = Core::new(10_000_000, 1);
        let mut e = Entries::default();
        let keys = if cfg!(miri) { 300 } else { 20_000 };
        for k in 0..keys {
            write(&mut core, &mut e, k);
        }
        let words = 8 * core.sketch.blocks();
        assert!(
            words <= (keys as usize).next_power_of_two().max(1_024),
            "{keys} keys held, a sketch of {words} words"
        );
        assert!(
            words >= keys as usize,
            "{keys} keys held, a sketch of {words} words"
        );
    }

    /// A node as the cache lays one out for a policy that reads keys from it: the table
    /// hash, and the link.
    #[repr(C)]
    struct Hashed {
        hash: u64,
        link: Link,
    }

    fn tracked_in(node: &Hashed) -> Tracked {
        // SAFETY: the link is a field of the node, at this offset.
        unsafe {
            NonNull::from(node)
                .byte_add(std::mem::offset_of!(Hashed, link))
                .cast()
        }
    }

    /// A policy that reads each record's key from its node (as a cache without the shared
    /// tier does) keeps, evicts and counts exactly as one told the same keys with each write
    /// and keeping them: the key it reads is the one each write reported.
    #[test]
    fn a_policy_that_reads_its_keys_from_the_nodes_chooses_as_one_that_keeps_them() {
        let seed = 0x5eed;
        let mut kept = Core::new(40, 7);
        let mut read = Core::new(40, 7);
        // SAFETY: `Hashed` keeps its hash before its link, and `tracked_in` addresses the
        // link from the whole node.
        unsafe { read.derive_pkeys(std::mem::offset_of!(Hashed, link), seed) };
        let mut links: HashMap<u64, Rc<Link>> = HashMap::new();
        let mut nodes: HashMap<u64, Rc<Hashed>> = HashMap::new();
        let mut gone: Vec<Rc<Hashed>> = Vec::new();
        let mut hits: HashMap<u64, u8> = HashMap::new();
        let writes = if cfg!(miri) { 300 } else { 3_000u64 };
        for n in 0..writes {
            // Keys 0..120, the lower ones more often, and every fifth write a hit.
            let key = (n * n + 7 * n) % 120 % (1 + n % 120);
            let pkey = pkey_of_hash(key, seed);
            if n % 5 == 0 && nodes.contains_key(&key) {
                let h = hits.entry(pkey).or_default();
                *h = (*h + 1).min(3);
                continue;
            }
            let link = Rc::new(Link::new());
            let node = Rc::new(Hashed {
                hash: key,
                link: Link::new(),
            });
            let old_link = links.insert(pkey, Rc::clone(&link));
            let old_node = nodes.insert(key, Rc::clone(&node));
            let mut out = [Vec::new(), Vec::new()];
            let mut looks = [Vec::new(), Vec::new()];
            let write = |node, old| Write {
                pkey,
                node,
                old,
                weight: 1,
            };
            for (side, (core, write)) in [
                (
                    &mut kept,
                    write(tracked(&link), old_link.as_deref().map(tracked)),
                ),
                (
                    &mut read,
                    write(tracked_in(&node), old_node.as_deref().map(tracked_in)),
                ),
            ]
            .into_iter()
            .enumerate()
            {
                let seen = &mut looks[side];
                let hits = hits.clone();
                let mut probe = |v: &Victim| {
                    seen.push(v.pkey);
                    Look {
                        hits: hits.get(&v.pkey).copied().unwrap_or(0),
                        expired: false,
                    }
                };
                // SAFETY: both nodes are live; the old one left the table just now.
                unsafe { core.write(write, &mut out[side], &mut probe, &Requests::default) };
            }
            for looked in &looks[0] {
                hits.remove(looked);
            }
            gone.extend(old_node);
            let evicted = |out: &Vec<Victim>| out.iter().map(|v| v.pkey).collect::<Vec<_>>();
            assert_eq!(looks[0], looks[1], "write {n}: the same entries looked at");
            assert_eq!(
                evicted(&out[0]),
                evicted(&out[1]),
                "write {n}: the same victims"
            );
            for v in &out[1] {
                let key = nodes
                    .iter()
                    .find(|(_, h)| tracked_in(h) == v.node)
                    .map(|(k, _)| *k);
                gone.extend(key.and_then(|k| nodes.remove(&k)));
                links.remove(&v.pkey);
            }
        }
        assert_eq!(kept.len(), read.len());
        assert!(
            kept.len() <= 40 && kept.len() > 20,
            "{} entries held",
            kept.len()
        );
    }

    /// Also Miri's look at the policy's pointers into the nodes through eviction churn, so
    /// fewer writes there.
    #[test]
    fn stays_within_capacity_and_reports_each_victim_once() {
        let mut core = Core::new(50, 3);
        let mut e = Entries::default();
        let mut held = std::collections::HashSet::new();
        for v in 0..if cfg!(miri) { 300 } else { 1_000u64 } {
            let key = v * 7 % 300;
            held.insert(key);
            if v % 3 == 0 {
                e.hit(v % 40);
            }
            for victim in write(&mut core, &mut e, key) {
                assert!(
                    held.remove(&victim.pkey),
                    "victim {victim:?} reported twice"
                );
            }
            assert!(core.weight() <= 50);
            assert_eq!(core.len(), held.len());
        }
        e.check(&core);
    }

    #[test]
    #[cfg_attr(miri, ignore = "safe code, 20,000 writes: too slow under Miri")]
    fn a_scan_does_not_flush_frequently_read_keys() {
        let mut core = Core::new(100, 9);
        let mut e = Entries::default();
        for k in 0..50 {
            write(&mut core, &mut e, k);
        }
        // One-off keys stream through while the hot keys keep being read.
        for (i, k) in (1_000..21_000).enumerate() {
            read(&mut core, &mut e, i as u64 % 50);
            read(&mut core, &mut e, k);
        }
        let survivors = (0..50).filter(|&k| e.holds(k)).count();
        assert!(
            survivors >= 45,
            "only {survivors} of 50 hot keys survived the scan"
        );
    }

    /// A policy of 100 entries filled with keys 0 to 99, none of them hit: 99 in the main
    /// space, all entered unchallenged, and one in the window.
    fn filled(seed: u64) -> (Core, Entries) {
        let mut core = Core::new(100, seed);
        let mut e = Entries::default();
        for k in 0..100 {
            write(&mut core, &mut e, k);
        }
        (core, e)
    }

    /// `filled`, then key 98 written again: promoted to protected, so the main space has had
    /// a hit and the other 98 fill keys are open to candidates seen twice.
    fn filled_and_reused(seed: u64) -> (Core, Entries) {
        let (mut core, mut e) = filled(seed);
        write(&mut core, &mut e, 98);
        (core, e)
    }

    /// Writes each of `keys` `times` times in a row (each write counts in the sketch).
    fn seen(core: &mut Core, e: &mut Entries, keys: std::ops::Range<u64>, times: u32) {
        for k in keys {
            for _ in 0..times {
                write(core, e, k);
            }
        }
    }

    #[test]
    fn keys_seen_twice_replace_keys_from_the_fill_that_were_never_hit() {
        let (mut core, mut e) = filled_and_reused(11);
        seen(&mut core, &mut e, 1_000..1_050, 2);
        write(&mut core, &mut e, 2_000); // pushes the last of them out of the window
        let admitted = (1_000..1_050).filter(|&k| e.holds(k)).count();
        assert_eq!(admitted, 50, "seen twice against fill keys seen once");
    }

    #[test]
    fn the_fill_keeps_the_margin_until_the_main_space_has_a_hit() {
        // The second pass of a loop longer than the cache: every key that misses is seen
        // twice, and the fill keys it would push out come round at the end of the pass.
        let (mut core, mut e) = filled(11);
        seen(&mut core, &mut e, 1_000..1_050, 2);
        write(&mut core, &mut e, 2_000); // pushes the last of them out of the window
        assert_eq!((0..99).filter(|&k| e.holds(k)).count(), 99);

        // A fill key read again: found at the next duel and promoted. From then on, keys
        // seen twice replace the fill keys that were never hit.
        e.hit(0);
        seen(&mut core, &mut e, 3_000..3_050, 2);
        write(&mut core, &mut e, 4_000);
        assert!(e.holds(0), "the key read again stays");
        let admitted = (3_000..3_050).filter(|&k| e.holds(k)).count();
        assert_eq!(admitted, 50, "seen twice against fill keys seen once");
    }

    #[test]
    fn keys_seen_once_do_not_replace_keys_from_the_fill() {
        // A long loop's first keys look like this until it comes round again. 700 newcomers
        // take the sketch through a halving (every 640 increments here): the fill keys are
        // then estimated at 0, and each newcomer after it at 1.
        let (mut core, mut e) = filled_and_reused(11);
        seen(&mut core, &mut e, 1_000..1_700, 1);
        let held = (0..99).filter(|&k| e.holds(k)).count();
        assert_eq!(held, 99, "a newcomer seen once replaced a fill key");
    }

    #[test]
    fn keys_that_won_their_duel_keep_the_margin() {
        let (mut core, mut e) = filled_and_reused(11);
        // Seen twice: they replace the 98 fill keys in probation, and are in the main space
        // by duel.
        seen(&mut core, &mut e, 1_000..1_098, 2);
        // Seen three times: one more than the winners, which is not enough against them.
        seen(&mut core, &mut e, 3_000..3_030, 3);
        write(&mut core, &mut e, 4_000); // pushes the last of them out of the window
        assert_eq!((1_000..1_098).filter(|&k| e.holds(k)).count(), 98);
        assert!((3_000..3_030).all(|k| !e.holds(k)));
    }

    #[test]
    fn only_hits_near_the_cold_end_count_as_the_main_space_s_loss() {
        // 100 entries: a reach of 3, a window of 1, 98 in probation (0 the coldest).
        let (mut core, mut e) = filled_and_reused(11);
        write(&mut core, &mut e, 1_000); // the first duel: 0, 1 and 2 enter the cold zone
        e.hit(1); // in the zone: a main space 3 smaller would have lost this hit
        e.hit(50); // far from it: promoted when it enters the zone, no loss

        // Keys seen twice replace the fill keys one by one, taking the cold end past 50.
        seen(&mut core, &mut e, 2_000..2_060, 2);
        assert!(e.holds(1) && e.holds(50));
        assert!(!e.holds(51), "the cold end went past 50");
        assert_eq!(core.sizer.pending_loss(), 1.0);
    }

    /// The window's share after `accesses` lookups of `next_key`'s keys through a policy of
    /// `capacity` entries, and the hit ratio.
    fn run(capacity: u64, accesses: u64, mut next_key: impl FnMut(u64) -> u64) -> (f64, f64) {
        let mut core = Core::new(capacity, 5);
        let mut e = Entries::default();
        let mut hits = 0;
        for i in 0..accesses {
            hits += u64::from(read(&mut core, &mut e, next_key(i)));
        }
        (
            core.window_max as f64 / capacity as f64,
            hits as f64 / accesses as f64,
        )
    }

    #[test]
    #[cfg_attr(miri, ignore = "safe code, 200,000 lookups: too slow under Miri")]
    fn the_window_grows_where_recency_pays_and_stays_small_where_it_does_not() {
        // Recency: half the lookups are of a new key, the other half of one of the 80 newest
        // keys. Reads of recent keys pay, frequency says little: at the initial 1% window a
        // new key leaves the window before it is read again and loses the duel against
        // older keys read more often (the first 20,000 lookups hit about 6%).
        let mut rng = 7u64;
        let mut newest = 0u64;
        let recent = |_| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            if rng % 2 == 0 {
                newest += 1;
                newest
            } else {
                newest.saturating_sub((rng >> 8) % 80)
            }
        };
        let (window, hit_ratio) = run(100, 200_000, recent);
        assert!(
            window > 0.5,
            "recency-heavy workload left the window at {window:.2}"
        );
        assert!(
            hit_ratio > 0.35,
            "recency-heavy workload hit only {hit_ratio:.2}"
        );
        // A loop over 120 keys, 20 more than fit: only frequency-based admission keeps most
        // of them (a large window turns the cache into an LRU, which hits nothing here).
        let (window, hit_ratio) = run(100, 200_000, |i| i % 120);
        assert!(
            window < 0.2,
            "looping workload grew the window to {window:.2}"
        );
        assert!(hit_ratio > 0.6, "looping workload hit only {hit_ratio:.2}");
    }

    const ZIPF_KEYS: usize = 400_000;
    const ZIPF_LOOKUPS: u64 = 1_000_000;

    #[test]
    #[cfg_attr(miri, ignore = "safe code, a million lookups: too slow under Miri")]
    fn a_skewed_workload_larger_than_the_cache_keeps_a_small_window() {
        // Zipf(1) over 400,000 keys: frequency pays, recency adds little. Each growth of the
        // window pushes main victims out; evicted unseen, their hits would never count
        // against it, and the window would end at all of the cache (an LRU: 73.0% hits
        // against 75.0% at a 1% window).
        let mut cdf = Vec::with_capacity(ZIPF_KEYS);
        let mut total = 0.0;
        for k in 1..=ZIPF_KEYS {
            total += 1.0 / k as f64;
            cdf.push(total);
        }
        let mut rng = 11u64;
        let zipf = |_| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            let u = (rng >> 11) as f64 / (1u64 << 53) as f64 * total;
            // A policy key is a hash: spread the rank over all 64 bits.
            (cdf.partition_point(|&c| c < u) as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15)
        };
        let (window, hit_ratio) = run(25_000, ZIPF_LOOKUPS, zipf);
        assert!(
            window < 0.5,
            "the window grew to {window:.2} of the cache (hit ratio {hit_ratio:.3})"
        );
    }

    #[test]
    #[cfg_attr(miri, ignore = "safe code, 220,000 lookups: too slow under Miri")]
    fn a_loop_after_a_recency_phase_gets_the_small_window_back() {
        let (mut core, mut e) = (Core::new(100, 5), Entries::default());
        // Recency first: a third of the lookups are of a new key, the others of one of the
        // 60 newest keys. The window grows to nearly all of the cache; about half the
        // lookups hit.
        let (mut rng, mut newest) = (7u64, 0u64);
        for _ in 0..200_000 {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            let key = if rng % 3 == 0 {
                newest += 1;
                newest
            } else {
                newest.saturating_sub((rng >> 8) % 60)
            };
            read(&mut core, &mut e, key);
        }
        assert!(
            core.window_max > 80,
            "the recency phase left the window at {}",
            core.window_max
        );
        // Then a loop over 120 new keys, 20 more than fit: the hit ratio collapses, and the
        // window starts over from its initial size. (Without that guard the window stays at
        // all of the cache: in it each rejected key of the loop returns soon after, counted
        // in misses, which looks like a reason to keep it large.)
        let mut hits = 0;
        for i in 0..20_000u64 {
            hits += u64::from(read(&mut core, &mut e, 1 << 40 | (i % 120)));
        }
        assert!(
            core.window_max < 20,
            "the loop left the window at {} of 100",
            core.window_max
        );
        assert!(hits > 10_000, "the loop hit only {hits} of 20,000 lookups");
    }

    #[test]
    fn expired_entries_go_before_live_ones() {
        let mut core = Core::new(4, 1);
        let mut e = Entries::default();
        for k in 0..4 {
            write(&mut core, &mut e, k);
        }
        let look = &mut |v: &Victim| Look {
            hits: 0,
            expired: v.pkey == 0,
        };
        let out = e.put(&mut core, 9, 1, Some(look));
        // 0 is the main space's victim: expired, it goes without a duel (which the candidate
        // leaving the window, 3, would have lost: it is no more frequent than 0).
        assert_eq!(out.iter().map(|v| v.pkey).collect::<Vec<_>>(), [0]);
        assert!(e.holds(3) && e.holds(9));
        e.check(&core);
    }

    /// Reports of one key's writes and removals in every order the table allows: `A`
    /// replaced `O`, then `B` replaced `A` (or a removal took `A` out), reported in the
    /// reverse order.
    #[test]
    fn a_record_follows_the_key_whatever_order_its_writes_report_in() {
        let write = |core: &mut Core, node: &Link, old: Option<&Link>| {
            let out = report(core, 7, node, old);
            assert!(out.is_empty(), "a cache of 10 evicts nothing here");
        };
        let nodes: Vec<Link> = (0..3).map(|_| Link::new()).collect();
        let (o, a, b) = (&nodes[0], &nodes[1], &nodes[2]);

        // In order: each write takes its predecessor's record.
        let mut core = Core::new(10, 1);
        write(&mut core, o, None);
        write(&mut core, a, Some(o));
        write(&mut core, b, Some(a));
        assert_eq!((core.len(), core.weight()), (1, 1));
        assert_eq!(core.nodes[b.record() as usize].node, tracked(b));
        assert_eq!((o.record(), a.record()), (DETACHED, DETACHED));

        // B reports before A: A is detached by B's report, so A's report releases the record
        // it takes from O, and B is the key's one record.
        let nodes: Vec<Link> = (0..3).map(|_| Link::new()).collect();
        let (o, a, b) = (&nodes[0], &nodes[1], &nodes[2]);
        let mut core = Core::new(10, 1);
        write(&mut core, o, None);
        write(&mut core, b, Some(a));
        write(&mut core, a, Some(o));
        assert_eq!((core.len(), core.weight()), (1, 1));
        assert_eq!(core.nodes[b.record() as usize].node, tracked(b));
        assert_eq!((o.record(), a.record()), (DETACHED, DETACHED));

        // A removal of A reports before A's write: nothing of the key is left.
        let nodes: Vec<Link> = (0..2).map(|_| Link::new()).collect();
        let (o, a) = (&nodes[0], &nodes[1]);
        let mut core = Core::new(10, 1);
        write(&mut core, o, None);
        // SAFETY: live.
        unsafe { core.remove(tracked(a)) };
        write(&mut core, a, Some(o));
        assert_eq!((core.len(), core.weight()), (0, 0));

        // A load takes O's place and carries its record; the value that ends it takes it on.
        let nodes: Vec<Link> = (0..3).map(|_| Link::new()).collect();
        let (o, load, done) = (&nodes[0], &nodes[1], &nodes[2]);
        let mut core = Core::new(10, 1);
        write(&mut core, o, None);
        let record = o.record();
        // SAFETY: live.
        unsafe { core.carry(tracked(o), tracked(load), 7) };
        assert_eq!(load.record(), record, "the load carries the key's record");
        write(&mut core, done, Some(load));
        assert_eq!(done.record(), record, "and hands it on");
        assert_eq!(core.len(), 1);

        // A load with no record to carry is not tracked, and its value is a new key.
        let nodes: Vec<Link> = (0..2).map(|_| Link::new()).collect();
        let (load, done) = (&nodes[0], &nodes[1]);
        let mut core = Core::new(10, 1);
        // SAFETY: live.
        unsafe { core.remove(tracked(load)) };
        write(&mut core, done, Some(load));
        assert_eq!(core.len(), 1);
    }

    #[test]
    fn an_evicted_key_s_unreported_successor_is_a_new_key() {
        let nodes: Vec<Link> = (0..3).map(|_| Link::new()).collect();
        let (a, b, successor) = (&nodes[0], &nodes[1], &nodes[2]);
        let mut core = Core::new(1, 1);
        assert!(report(&mut core, 1, a, None).is_empty());
        let out = report(&mut core, 2, b, None);
        assert_eq!(out.len(), 1, "a cache of 1 holds one key");
        let victim = out[0];
        // SAFETY: live.
        assert_eq!(unsafe { victim.node.as_ref() }.record(), DETACHED);
        // A write that replaced the victim in the table before the eviction took it, and
        // reports after: the record is gone, so the write is a new key, and the cache still
        // holds one.
        // SAFETY: live.
        let gone = unsafe { victim.node.as_ref() };
        let out = report(&mut core, victim.pkey, successor, Some(gone));
        assert!(successor.record() < DETACHED, "the successor is tracked");
        assert_eq!(out.len(), 1);
        assert_eq!(core.len(), 1);
    }

    #[test]
    fn a_write_under_another_policy_key_than_its_predecessor_s_is_a_new_key() {
        // A key whose `Hash` disagrees with its `Eq`: the table matched the write with the
        // previous one, the policy key differs.
        let nodes: Vec<Link> = (0..2).map(|_| Link::new()).collect();
        let (first, second) = (&nodes[0], &nodes[1]);
        let mut core = Core::new(10, 1);
        core.index_by_pkey();
        assert!(report(&mut core, 1, first, None).is_empty());
        assert!(report(&mut core, 2, second, Some(first)).is_empty());
        assert_eq!(core.len(), 1, "the first write's record went with it");
        assert_eq!(first.record(), DETACHED);
        assert_eq!(core.pkey(second.record()), 2);
        assert_eq!(core.find(1, &mut |_| true), None);
        assert_eq!(core.find(2, &mut |_| true), Some(tracked(second)));

        // A load in its place, under yet another policy key, carries nothing.
        let load = Link::new();
        // SAFETY: live.
        unsafe { core.carry(tracked(second), tracked(&load), 3) };
        assert_eq!((second.record(), load.record()), (DETACHED, DETACHED));
        assert_eq!(core.len(), 0);
        assert_eq!(core.find(2, &mut |_| true), None);
    }

    #[test]
    fn a_settled_write_is_tracked_as_a_write_is_without_admission() {
        let nodes: Vec<Link> = (0..4).map(|_| Link::new()).collect();
        let (a, b, c, d) = (&nodes[0], &nodes[1], &nodes[2], &nodes[3]);
        let settle = |core: &mut Core, node: &Link, old: Option<&Link>, weight: u64| {
            let w = Write {
                pkey: 7,
                node: tracked(node),
                old: old.map(tracked),
                weight,
            };
            // SAFETY: every node lives to the end of the test.
            unsafe { core.settle(w) };
        };
        let mut core = Core::new(4, 1);
        // A new key, then its rewrite with another weight, which takes its record.
        settle(&mut core, a, None, 2);
        assert_eq!((core.len(), core.weight()), (1, 2));
        settle(&mut core, b, Some(a), 3);
        assert_eq!((core.len(), core.weight()), (1, 3));
        assert_eq!(
            (a.record(), core.nodes[b.record() as usize].node),
            (DETACHED, tracked(b))
        );
        // Over the bound, with no victims: the next write evicts down to it.
        settle(&mut core, d, None, 3);
        assert_eq!(core.weight(), 6, "settling evicts nothing");
        // SAFETY: live.
        unsafe { core.remove(tracked(d)) };
        // A write whose node was already taken out and reported: nothing is kept of it.
        // SAFETY: live.
        unsafe { core.remove(tracked(c)) };
        settle(&mut core, c, Some(b), 1);
        assert_eq!((core.len(), core.weight()), (0, 0));
        // Over the bound again; a write brings it back within.
        let (e, f) = (Link::new(), Link::new());
        settle(&mut core, &e, None, 4);
        let out = report(&mut core, 8, &f, None);
        assert!(core.weight() <= 4, "{} over a bound of 4", core.weight());
        assert!(!out.is_empty());
    }

    #[test]
    fn a_key_s_overlapping_records_are_found_apart_by_node() {
        // Writes a, b, c of one key: b replaces a, c replaces b and reports first, so a
        // (out of the table, its report pending) and c both hold a record for a moment.
        let nodes: Vec<Link> = (0..3).map(|_| Link::new()).collect();
        let (a, b, c) = (&nodes[0], &nodes[1], &nodes[2]);
        let mut core = Core::new(10, 1);
        core.index_by_pkey();
        report(&mut core, 7, a, None);
        report(&mut core, 7, c, Some(b));
        assert_eq!(core.len(), 2, "a's record and c's");
        assert_eq!(core.find(7, &mut |t| t == tracked(c)), Some(tracked(c)));
        assert_eq!(core.find(7, &mut |t| t == tracked(a)), Some(tracked(a)));
        // c is removed first: its own record goes, not a's.
        // SAFETY: live.
        unsafe { core.remove(tracked(c)) };
        assert_eq!(core.len(), 1);
        assert_eq!(core.find(7, &mut |t| t == tracked(c)), None);
        assert_eq!(core.find(7, &mut |_| true), Some(tracked(a)));
        // b's report: a's record goes too, and nothing of the key is left.
        report(&mut core, 7, b, Some(a));
        assert_eq!(core.len(), 0);
        assert_eq!(core.find(7, &mut |_| true), None);
    }

    /// Two words per key beside the node: a cache without the shared tier keeps no policy
    /// key in its records.
    #[test]
    fn a_record_is_two_words() {
        assert_eq!(std::mem::size_of::<PNode>(), 16);
    }

    #[test]
    fn records_reused_once_weights_appear_weigh_what_their_own_writes_weigh() {
        let mut core = Core::new(8, 1);
        let mut e = Entries::default();
        let mut weighs = HashMap::new();
        let mut write = |core: &mut Core, e: &mut Entries, key: u64, w: u64| {
            weighs.insert(key, w);
            write_w(core, e, key, w);
            e.check(core);
            let held: u64 = e.table.keys().map(|k| weighs[k]).sum();
            assert_eq!(core.weight(), held, "after writing key {key}, weighing {w}");
            assert!(held <= 8, "{held} held by a policy of 8");
        };
        // Evictions leave free records, with no weight kept while every write weighs 1.
        for k in 0..16 {
            write(&mut core, &mut e, k, 1);
        }
        assert!(
            core.weights.is_none(),
            "weights kept for writes that all weigh 1"
        );
        write(&mut core, &mut e, 100, 3);
        // Writes of weight 1 take the records freed since, whatever those weighed.
        for k in 200..216 {
            write(&mut core, &mut e, k, 1 + k % 2);
        }
        // A held key rewritten with another weight.
        let k = *e.table.keys().next().expect("keys are held");
        write(&mut core, &mut e, k, 2);
    }

    #[test]
    fn weights_count_against_the_capacity() {
        let mut core = Core::new(10, 1);
        let mut e = Entries::default();
        assert!(write_w(&mut core, &mut e, 1, 4).is_empty());
        assert!(write_w(&mut core, &mut e, 2, 4).is_empty());
        assert_eq!(write_w(&mut core, &mut e, 3, 4).len(), 1);
        assert!(core.weight() <= 10);
        // Heavier than the whole cache: evicted at once.
        let out = write_w(&mut core, &mut e, 4, 11);
        assert!(out.iter().any(|v| v.pkey == 4));
        assert!(core.weight() <= 10);
    }
}
