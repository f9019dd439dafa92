//! W-TinyLFU (Einziger, Friedman and Manes, "TinyLFU: A Highly Efficient Cache Admission
//! Policy"), with an adaptive window as in Caffeine: new entries enter a small LRU window; an
//! entry leaving the window joins the main space (segmented LRU: probation, then protected
//! once hit again) only if the frequency sketch says it is more popular than the main space's
//! victim. The window's share of the capacity follows the marginal utility of either side
//! (see `window.rs`), so recency-heavy workloads get a large window and frequency-heavy ones
//! a small one.
//!
//! Single-threaded: the cache runs it under a lock, fed by writes. Entries are known by their
//! policy key (a seeded 64-bit hash of the key) and by the version of the write that put them
//! in the table.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use super::index::Index;
use super::sketch::Sketch;
use super::window::{Resize, Served, Sizer};
use super::EvictionPolicy;

const NIL: u32 = u32::MAX;

/// The window's initial share of the capacity.
const WINDOW_START: f64 = 0.01;
/// The protected segment's share of the main space (Caffeine: 0.8); a smaller share loses
/// less where recency matters (DESIGN.md, "Policy tuning").
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

/// An entry as `Core::ranked` orders it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Ranked {
    /// Higher is listed first (see `preference`).
    pub(crate) pref: (u64, u8, u32),
    pub(crate) pkey: u64,
    pub(crate) hash: u64,
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

#[derive(Debug, Clone)]
struct PNode {
    pkey: u64,
    hash: u64,
    version: u64,
    /// At most `u32::MAX`: a weigher's answer (see `Write::weight`).
    weight: u32,
    region: Region,
    /// In the main space without having won a duel, and not hit since (see `admit`).
    unchallenged: bool,
    /// In probation's cold zone (see `fill_zone`).
    zoned: bool,
    prev: u32,
    next: u32,
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

/// A write's weight as a node stores it: the cache's weights come from a `u32` weigher, so
/// nothing is lost; a larger one (only tests could make it) is held as `u32::MAX`.
fn stored_weight(weight: u64) -> u32 {
    u32::try_from(weight).unwrap_or(u32::MAX)
}

/// An entry the policy chose to evict: the caller removes it from the table if the table
/// still holds that write (`version`) or an older one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Victim {
    pub(crate) pkey: u64,
    pub(crate) hash: u64,
    pub(crate) version: u64,
}

/// A write the table now holds: the key's policy key and hash, the write's version, and its
/// weight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Write {
    pub(crate) pkey: u64,
    pub(crate) hash: u64,
    pub(crate) version: u64,
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

#[derive(Debug)]
pub(crate) struct Core {
    nodes: Vec<PNode>,
    free: Vec<u32>,
    index: Index,
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
            free: Vec::new(),
            index: Index::default(),
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
        }
    }

    /// The capacity, in weight units.
    #[cfg(test)]
    pub(crate) fn max(&self) -> u64 {
        self.max
    }

    /// The `n` entries this shard values most (`hottest`) or least, best first: by the
    /// sketch's frequency estimate plus the hits `pending` reports (by policy key and hash)
    /// that the sketch has not seen yet, then by region (protected, window, probation: the
    /// order in which they would be kept), then by recency within the region. O(entries
    /// log n) time, O(n) memory.
    pub(crate) fn ranked(
        &self,
        n: usize,
        hottest: bool,
        pending: &dyn Fn(u64, u64) -> u64,
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
                let score = (
                    self.sketch.frequency(node.pkey) + pending(node.pkey, node.hash),
                    rank,
                    position,
                );
                kept.push(Reverse(Ranked {
                    pref: Ranked::preference(score, hottest),
                    pkey: node.pkey,
                    hash: node.hash,
                }));
                if kept.len() > n {
                    kept.pop();
                }
                i = node.next;
                position = position.saturating_add(1);
            }
        }
        kept.into_sorted_vec()
            .into_iter()
            .map(|Reverse(r)| r)
            .collect()
    }

    /// Entries held.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.index.len()
    }

    /// Whether the policy holds this write of the key (or a newer one).
    #[cfg(test)]
    pub(crate) fn holds(&self, pkey: u64) -> Option<u64> {
        self.find(pkey).map(|i| self.nodes[i as usize].version)
    }

    /// The node of `pkey`, if tracked.
    #[inline]
    fn find(&self, pkey: u64) -> Option<u32> {
        let nodes = &self.nodes;
        self.index.get(pkey, |i| nodes[i as usize].pkey)
    }

    fn alloc(&mut self, node: PNode) -> u32 {
        match self.free.pop() {
            Some(i) => {
                self.nodes[i as usize] = node;
                i
            }
            None => {
                self.nodes.push(node);
                (self.nodes.len() - 1) as u32
            }
        }
    }

    fn release(&mut self, i: u32) {
        let pkey = self.nodes[i as usize].pkey;
        let nodes = &self.nodes;
        self.index.remove(pkey, |i| nodes[i as usize].pkey);
        self.free.push(i);
    }

    fn push(&mut self, i: u32, region: Region) {
        let tail = self.lists[region as usize].tail;
        {
            let n = &mut self.nodes[i as usize];
            n.region = region;
            n.prev = tail;
            n.next = NIL;
        }
        match tail {
            NIL => self.lists[region as usize].head = i,
            t => self.nodes[t as usize].next = i,
        }
        let list = &mut self.lists[region as usize];
        list.tail = i;
        list.weight += u64::from(self.nodes[i as usize].weight);
    }

    /// Links `i` into `anchor`'s region just before `anchor` (more recent than all but it).
    fn push_before(&mut self, i: u32, anchor: u32) {
        let (region, prev) = {
            let a = &self.nodes[anchor as usize];
            (a.region, a.prev)
        };
        {
            let n = &mut self.nodes[i as usize];
            n.region = region;
            n.prev = prev;
            n.next = anchor;
        }
        self.nodes[anchor as usize].prev = i;
        match prev {
            NIL => self.lists[region as usize].head = i,
            p => self.nodes[p as usize].next = i,
        }
        self.lists[region as usize].weight += u64::from(self.nodes[i as usize].weight);
    }

    fn unlink(&mut self, i: u32) {
        let (prev, next, region, weight) = {
            let n = &mut self.nodes[i as usize];
            let zoned = std::mem::take(&mut n.zoned);
            if zoned {
                self.zone_weight -= u64::from(n.weight);
                if self.zone_end == i {
                    // The zone is a prefix: the entry before it is in the zone too, or none.
                    self.zone_end = n.prev;
                }
            }
            (n.prev, n.next, n.region, u64::from(n.weight))
        };
        match prev {
            NIL => self.lists[region as usize].head = next,
            p => self.nodes[p as usize].next = next,
        }
        match next {
            NIL => self.lists[region as usize].tail = prev,
            n => self.nodes[n as usize].prev = prev,
        }
        self.lists[region as usize].weight -= weight;
    }

    /// A rewrite of a tracked key: most recently used in its region, and promoted from
    /// probation to protected.
    fn touch(&mut self, i: u32, probe: &mut Probe<'_>, budget: &mut usize) {
        let region = self.nodes[i as usize].region;
        self.unlink(i);
        match region {
            Region::Window => self.push(i, Region::Window),
            Region::Probation | Region::Protected => {
                self.nodes[i as usize].unchallenged = false;
                self.push(i, Region::Protected);
                self.demote_overflow(probe, budget);
            }
        }
    }

    /// Looks at entry `i`: folds its hits into the sketch.
    fn look(&mut self, i: u32, probe: &mut Probe<'_>) -> Look {
        let look = probe(&self.victim(i));
        let pkey = self.nodes[i as usize].pkey;
        for _ in 0..look.hits {
            self.sketch.increment(pkey);
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
                e => self.nodes[e as usize].next,
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
            let n = &mut self.nodes[next as usize];
            n.zoned = true;
            self.zone_weight += u64::from(n.weight);
            self.zone_end = next;
        }
    }

    /// A probation entry hit since its last look moves to protected.
    fn promote(&mut self, i: u32, probe: &mut Probe<'_>, budget: &mut usize) {
        self.nodes[i as usize].unchallenged = false;
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
            h if h == newest && h != NIL => self.nodes[h as usize].next,
            h => h,
        }
    }

    fn victim(&self, i: u32) -> Victim {
        let n = &self.nodes[i as usize];
        Victim {
            pkey: n.pkey,
            hash: n.hash,
            version: n.version,
        }
    }

    fn evict(&mut self, i: u32, out: &mut Vec<Victim>) {
        out.push(self.victim(i));
        self.unlink(i);
        self.release(i);
    }

    fn next_random(&mut self) -> u64 {
        // xorshift64: only for the rare hash-flooding admission.
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        self.rng
    }

    /// TinyLFU's admission: whether the candidate should replace the victim.
    fn admit(&mut self, candidate: u32, victim: u32) -> bool {
        let c = self.sketch.frequency(self.nodes[candidate as usize].pkey);
        let v = self.sketch.frequency(self.nodes[victim as usize].pkey);
        let relaxed = self.nodes[victim as usize].unchallenged
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
            let cw = u64::from(self.nodes[c as usize].weight);
            let mut dueled = false;
            loop {
                if self.main_weight() + cw <= main_max {
                    self.nodes[c as usize].unchallenged = !dueled;
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
                    if self.nodes[v as usize].zoned {
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
                    self.sizer.rejected(self.nodes[c as usize].pkey);
                    self.evict(c, out);
                    break;
                }
            }
        }
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
                if self.nodes[v as usize].zoned {
                    self.sizer.cold_hit();
                }
                self.promote(v, probe, budget);
                continue;
            }
            self.evict(v, out);
        }
    }

    /// A window entry given a second chance goes back as the window's most recent, but
    /// before the newest write when that is in the window, so the newest stays the last to
    /// leave.
    fn requeue_in_window(&mut self, i: u32, newest: u32) {
        if newest != i && newest != NIL && self.nodes[newest as usize].region == Region::Window {
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

impl EvictionPolicy for Core {
    /// A write that the table now holds: a new key, or a new value (or weight) for a key.
    /// Evicts to stay within the capacity, pushing the victims to `out`.
    /// `probe` looks at a tracked entry: its hits since the last look (folded into the
    /// sketch, and a second chance in its region) and whether it has expired (evicted without
    /// a duel, before live ones). `served` reads the cache's lookup counters, for the sizer.
    fn write(
        &mut self,
        write: Write,
        out: &mut Vec<Victim>,
        probe: &mut Probe<'_>,
        served: &Served<'_>,
    ) {
        let Write {
            pkey,
            hash,
            version,
            weight,
        } = write;
        // Second chances given in this call: each resets the entry's hits, so a pass over
        // every entry ends them; the bound also covers hits arriving meanwhile.
        let mut budget = 2 * self.index.len() + 16;
        self.sketch.increment(pkey);
        let newest = match self.find(pkey) {
            Some(i) => {
                let n = &mut self.nodes[i as usize];
                if n.version > version {
                    return; // an older write, reported late: the newer one stands
                }
                n.version = version;
                n.hash = hash;
                let (region, old) = (n.region, u64::from(n.weight));
                n.weight = stored_weight(weight);
                if n.zoned {
                    self.zone_weight = self.zone_weight - old + weight;
                }
                let list = &mut self.lists[region as usize];
                list.weight = list.weight - old + weight;
                self.touch(i, probe, &mut budget);
                i
            }
            None => {
                let i = self.alloc(PNode {
                    pkey,
                    hash,
                    version,
                    weight: stored_weight(weight),
                    region: Region::Window,
                    unchallenged: false,
                    zoned: false,
                    prev: NIL,
                    next: NIL,
                });
                let nodes = &self.nodes;
                self.index.insert(pkey, i, |i| nodes[i as usize].pkey);
                self.push(i, Region::Window);
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

    /// The table no longer holds the key's write `version` (nor, then, any older one).
    fn remove(&mut self, pkey: u64, version: u64) {
        if let Some(i) = self.find(pkey) {
            if self.nodes[i as usize].version <= version {
                self.unlink(i);
                self.release(i);
            }
        }
    }

    fn hash_of(&self, pkey: u64) -> Option<u64> {
        self.find(pkey).map(|i| self.nodes[i as usize].hash)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::window::Requests;
    use std::collections::HashMap;

    /// Hits recorded in the test's "entries", reported (and reset) at a look, and the
    /// lookups served (a hit per `hit`, a miss per write).
    #[derive(Default)]
    struct Entries {
        hits: HashMap<u64, u8>,
        served: Requests,
    }

    impl Entries {
        fn hit(&mut self, key: u64) {
            let h = self.hits.entry(key).or_default();
            *h = (*h + 1).min(3);
            self.served.hits += 1;
        }
        fn look(&mut self, v: &Victim) -> Look {
            Look {
                hits: self.hits.remove(&v.pkey).unwrap_or(0),
                expired: false,
            }
        }
    }

    fn write_w(core: &mut Core, e: &mut Entries, key: u64, version: u64, w: u64) -> Vec<Victim> {
        let mut out = Vec::new();
        let write = Write {
            pkey: key,
            hash: key,
            version,
            weight: w,
        };
        e.served.misses += 1;
        let served = e.served;
        core.write(write, &mut out, &mut |v| e.look(v), &|| served);
        for v in &out {
            e.hits.remove(&v.pkey);
        }
        out
    }

    /// A lookup of `key` as the cache does it: a hit if the policy holds the key, else a
    /// miss and a write of the next version.
    fn read(core: &mut Core, e: &mut Entries, key: u64, version: &mut u64) -> bool {
        if core.holds(key).is_some() {
            e.hit(key);
            true
        } else {
            *version += 1;
            write(core, e, key, *version);
            false
        }
    }

    fn write(core: &mut Core, e: &mut Entries, key: u64, version: u64) -> Vec<Victim> {
        write_w(core, e, key, version, 1)
    }

    #[test]
    #[cfg_attr(miri, ignore = "safe code: too slow under Miri")]
    fn stays_within_capacity_and_reports_each_victim_once() {
        let mut core = Core::new(50, 3);
        let mut e = Entries::default();
        let mut held = std::collections::HashSet::new();
        for v in 0..1_000u64 {
            let key = v * 7 % 300;
            held.insert(key);
            if v % 3 == 0 {
                e.hit(v % 40);
            }
            for victim in write(&mut core, &mut e, key, v) {
                assert!(
                    held.remove(&victim.pkey),
                    "victim {victim:?} reported twice"
                );
            }
            assert!(core.weight() <= 50);
            assert_eq!(core.len(), held.len());
        }
    }

    #[test]
    #[cfg_attr(miri, ignore = "safe code, 20,000 writes: too slow under Miri")]
    fn a_scan_does_not_flush_frequently_read_keys() {
        let mut core = Core::new(100, 9);
        let mut e = Entries::default();
        let mut v = 0;
        for k in 0..50 {
            v += 1;
            write(&mut core, &mut e, k, v);
        }
        // One-off keys stream through while the hot keys keep being read.
        for (i, k) in (1_000..21_000).enumerate() {
            read(&mut core, &mut e, i as u64 % 50, &mut v);
            read(&mut core, &mut e, k, &mut v);
        }
        let survivors = (0..50).filter(|k| core.holds(*k).is_some()).count();
        assert!(
            survivors >= 45,
            "only {survivors} of 50 hot keys survived the scan"
        );
    }

    /// A policy of 100 entries filled with keys 0 to 99, none of them hit: 99 in the main
    /// space, all entered unchallenged, and one in the window.
    fn filled(seed: u64) -> (Core, Entries, u64) {
        let mut core = Core::new(100, seed);
        let mut e = Entries::default();
        for k in 0..100 {
            write(&mut core, &mut e, k, k + 1);
        }
        (core, e, 100)
    }

    /// `filled`, then key 98 written again: promoted to protected, so the main space has had
    /// a hit and the other 98 fill keys are open to candidates seen twice.
    fn filled_and_reused(seed: u64) -> (Core, Entries, u64) {
        let (mut core, mut e, v) = filled(seed);
        write(&mut core, &mut e, 98, v + 1);
        (core, e, v + 1)
    }

    /// Writes each of `keys` `times` times in a row (each write counts in the sketch).
    fn seen(core: &mut Core, e: &mut Entries, v: &mut u64, keys: std::ops::Range<u64>, times: u32) {
        for k in keys {
            for _ in 0..times {
                *v += 1;
                write(core, e, k, *v);
            }
        }
    }

    #[test]
    fn keys_seen_twice_replace_keys_from_the_fill_that_were_never_hit() {
        let (mut core, mut e, mut v) = filled_and_reused(11);
        seen(&mut core, &mut e, &mut v, 1_000..1_050, 2);
        v += 1;
        write(&mut core, &mut e, 2_000, v); // pushes the last of them out of the window
        let admitted = (1_000..1_050).filter(|k| core.holds(*k).is_some()).count();
        assert_eq!(admitted, 50, "seen twice against fill keys seen once");
    }

    #[test]
    fn the_fill_keeps_the_margin_until_the_main_space_has_a_hit() {
        // The second pass of a loop longer than the cache: every key that misses is seen
        // twice, and the fill keys it would push out come round at the end of the pass.
        let (mut core, mut e, mut v) = filled(11);
        seen(&mut core, &mut e, &mut v, 1_000..1_050, 2);
        v += 1;
        write(&mut core, &mut e, 2_000, v); // pushes the last of them out of the window
        assert_eq!((0..99).filter(|k| core.holds(*k).is_some()).count(), 99);

        // A fill key read again: found at the next duel and promoted. From then on, keys
        // seen twice replace the fill keys that were never hit.
        e.hit(0);
        seen(&mut core, &mut e, &mut v, 3_000..3_050, 2);
        v += 1;
        write(&mut core, &mut e, 4_000, v);
        assert!(core.holds(0).is_some(), "the key read again stays");
        let admitted = (3_000..3_050).filter(|k| core.holds(*k).is_some()).count();
        assert_eq!(admitted, 50, "seen twice against fill keys seen once");
    }

    #[test]
    fn keys_seen_once_do_not_replace_keys_from_the_fill() {
        // A long loop's first keys look like this until it comes round again. 700 newcomers
        // take the sketch through a halving (every 640 increments here): the fill keys are
        // then estimated at 0, and each newcomer after it at 1.
        let (mut core, mut e, mut v) = filled_and_reused(11);
        seen(&mut core, &mut e, &mut v, 1_000..1_700, 1);
        let held = (0..99).filter(|k| core.holds(*k).is_some()).count();
        assert_eq!(held, 99, "a newcomer seen once replaced a fill key");
    }

    #[test]
    fn keys_that_won_their_duel_keep_the_margin() {
        let (mut core, mut e, mut v) = filled_and_reused(11);
        // Seen twice: they replace the 98 fill keys in probation, and are in the main space
        // by duel.
        seen(&mut core, &mut e, &mut v, 1_000..1_098, 2);
        // Seen three times: one more than the winners, which is not enough against them.
        seen(&mut core, &mut e, &mut v, 3_000..3_030, 3);
        v += 1;
        write(&mut core, &mut e, 4_000, v); // pushes the last of them out of the window
        assert_eq!(
            (1_000..1_098).filter(|k| core.holds(*k).is_some()).count(),
            98
        );
        assert!((3_000..3_030).all(|k| core.holds(k).is_none()));
    }

    #[test]
    fn only_hits_near_the_cold_end_count_as_the_main_space_s_loss() {
        // 100 entries: a reach of 3, a window of 1, 98 in probation (0 the coldest).
        let (mut core, mut e, mut v) = filled_and_reused(11);
        v += 1;
        write(&mut core, &mut e, 1_000, v); // the first duel: 0, 1 and 2 enter the cold zone
        e.hit(1); // in the zone: a main space 3 smaller would have lost this hit
        e.hit(50); // far from it: promoted when it enters the zone, no loss

        // Keys seen twice replace the fill keys one by one, taking the cold end past 50.
        seen(&mut core, &mut e, &mut v, 2_000..2_060, 2);
        assert!(core.holds(1).is_some() && core.holds(50).is_some());
        assert!(core.holds(51).is_none(), "the cold end went past 50");
        assert_eq!(core.sizer.pending_loss(), 1.0);
    }

    /// The window's share after `accesses` lookups of `next_key`'s keys through a policy of
    /// `capacity` entries, and the hit ratio.
    fn run(capacity: u64, accesses: u64, mut next_key: impl FnMut(u64) -> u64) -> (f64, f64) {
        let mut core = Core::new(capacity, 5);
        let mut e = Entries::default();
        let (mut v, mut hits) = (0, 0);
        for i in 0..accesses {
            hits += u64::from(read(&mut core, &mut e, next_key(i), &mut v));
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
        let mut v = 0;
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
            read(&mut core, &mut e, key, &mut v);
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
            hits += u64::from(read(&mut core, &mut e, 1 << 40 | (i % 120), &mut v));
        }
        assert!(
            core.window_max < 20,
            "the loop left the window at {} of 100",
            core.window_max
        );
        assert!(hits > 10_000, "the loop hit only {hits} of 20,000 lookups");
    }

    #[test]
    fn a_late_report_of_an_older_write_is_ignored() {
        let mut core = Core::new(10, 1);
        let mut e = Entries::default();
        write(&mut core, &mut e, 1, 5);
        write(&mut core, &mut e, 1, 3);
        assert_eq!(core.holds(1), Some(5));
        core.remove(1, 4);
        assert_eq!(
            core.holds(1),
            Some(5),
            "removing an older write keeps the newer"
        );
        core.remove(1, 5);
        assert_eq!(core.holds(1), None);
    }

    #[test]
    fn expired_entries_go_before_live_ones() {
        let mut core = Core::new(4, 1);
        for k in 0..4 {
            write(&mut core, &mut Entries::default(), k, k);
        }
        let mut out = Vec::new();
        let write = Write {
            pkey: 9,
            hash: 9,
            version: 9,
            weight: 1,
        };
        let look = &mut |v: &Victim| Look {
            hits: 0,
            expired: v.pkey == 0,
        };
        core.write(write, &mut out, look, &Requests::default);
        // 0 is the main space's victim: expired, it goes without a duel (which the candidate
        // leaving the window, 3, would have lost: it is no more frequent than 0).
        assert_eq!(out.iter().map(|v| v.pkey).collect::<Vec<_>>(), [0]);
        assert!(core.holds(3).is_some() && core.holds(9).is_some());
    }

    #[test]
    fn weights_count_against_the_capacity() {
        let mut core = Core::new(10, 1);
        let mut e = Entries::default();
        assert!(write_w(&mut core, &mut e, 1, 1, 4).is_empty());
        assert!(write_w(&mut core, &mut e, 2, 2, 4).is_empty());
        assert_eq!(write_w(&mut core, &mut e, 3, 3, 4).len(), 1);
        assert!(core.weight() <= 10);
        // Heavier than the whole cache: evicted at once.
        let out = write_w(&mut core, &mut e, 4, 4, 11);
        assert!(out.iter().any(|v| v.pkey == 4));
        assert!(core.weight() <= 10);
    }
}
