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

mod record;
use record::{List, PNode, Region, NIL};

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
mod tests;
