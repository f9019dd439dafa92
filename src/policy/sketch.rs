//! TinyLFU's frequency sketch: a count-min sketch of 4-bit counters that halves itself
//! periodically, so it estimates how often a key was seen recently.
//!
//! Each key maps to four counters in one 64-byte block (eight `u64` words of sixteen
//! counters), so an update touches one cache line. The sketch starts small and doubles as
//! its policy tracks more keys, up to one word per entry of capacity: a cache configured for
//! far more than it holds pays for the counters of what it holds. Keys are the policy keys
//! (seeded per cache: a bijection of the table hash, or the shared tier's hash of the key),
//! remixed with a per-sketch seed: keys chosen to collide in the sketch cannot be found
//! without knowing both seeds, unless their table hashes collide outright.

use std::alloc::{alloc_zeroed, handle_alloc_error, Layout};

/// Counters saturate here.
const MAX_COUNT: u64 = 15;

/// Counters per word.
const PER_WORD: usize = 16;

/// The fewest words (8 KiB): a small cache's sketch counts with fewer collisions
/// (docs/LOG.md, "Policy tuning").
const MIN_WORDS: usize = 1024;

/// Halve every this many increments per entry of capacity (Caffeine: 10): aging twice as
/// fast follows shifts in popularity sooner.
const AGE_EVERY: usize = 5;

/// Eight words of counters on one cache line: a block that straddled two lines (the
/// allocator aligns a large array to 16 bytes) would make each update two misses.
#[derive(Debug, Clone, Copy)]
#[repr(C, align(64))]
struct Block([u64; 8]);

#[derive(Debug)]
pub(crate) struct Sketch {
    table: Box<[Block]>,
    block_mask: usize,
    /// The most blocks the sketch grows to.
    max_blocks: usize,
    seed: u64,
    /// Increments since the last halving.
    additions: usize,
    /// Halve every this many increments: `AGE_EVERY` per entry the counters are sized for.
    sample: usize,
    /// `sample` once the sketch has its largest size.
    full_sample: usize,
}

/// `blocks` zeroed blocks, from zeroed memory: the pages of a large sketch are not written
/// (nor resident) before its counters are, as a `vec!` of a struct's default would make
/// them.
fn zeroed(blocks: usize) -> Box<[Block]> {
    let layout = Layout::array::<Block>(blocks).expect("a sketch's size fits in memory");
    if layout.size() == 0 {
        return Box::new([]);
    }
    // SAFETY: the layout's size is not zero.
    let block = unsafe { alloc_zeroed(layout) }.cast::<Block>();
    if block.is_null() {
        handle_alloc_error(layout);
    }
    // SAFETY: allocated by the global allocator with the layout of `blocks` blocks, which is
    // how a `Box<[Block]>` of that length is allocated and freed; all-zero bits are a valid
    // block (eight `u64`s).
    unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(block, blocks)) }
}

/// Blocks for `entries` keys: one 16-counter word per entry, as Caffeine sizes it, but at
/// least `MIN_WORDS`.
fn blocks_for(entries: usize) -> usize {
    let words = entries
        .max(MIN_WORDS)
        .checked_next_power_of_two()
        .unwrap_or(1 << (usize::BITS - 1));
    (words / 8).max(1)
}

/// Increments between two halvings of counters sized for `entries` keys: `AGE_EVERY` per
/// key, and at least as many as 128 keys make, so that a tiny cache's sketch is not halved
/// before its counters tell keys apart.
fn sample_for(entries: usize) -> usize {
    entries.max(128).saturating_mul(AGE_EVERY)
}

fn mix(mut x: u64) -> u64 {
    // SplitMix64's finaliser.
    x ^= x >> 30;
    x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x ^= x >> 27;
    x = x.wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// Where `key`'s counters are, in a sketch seeded with `seed` whose block index mask is
/// `block_mask`: its block, and the bits that choose the counters in it (see `positions`).
#[inline(always)]
fn spread(key: u64, seed: u64, block_mask: usize) -> (usize, u64) {
    let h = mix(key ^ seed);
    ((h as usize) & block_mask, h >> 32)
}

impl Sketch {
    /// A sketch for a cache of `capacity` entries, sized for none yet (see [`fit`](Self::fit)).
    pub(crate) fn new(capacity: usize, seed: u64) -> Self {
        let max_blocks = blocks_for(capacity);
        let blocks = blocks_for(0).min(max_blocks);
        let mut sketch = Sketch {
            table: zeroed(blocks),
            block_mask: blocks - 1,
            max_blocks,
            seed: mix(seed | 1),
            additions: 0,
            sample: 0,
            full_sample: sample_for(capacity),
        };
        sketch.set_sample();
        sketch
    }

    /// Ages on the schedule of the entries the counters are sized for (a word each), the
    /// capacity's once they are all there: a small sketch aged on the capacity's schedule
    /// would saturate.
    fn set_sample(&mut self) {
        self.sample = if self.table.len() == self.max_blocks {
            self.full_sample
        } else {
            sample_for(self.table.len() * 8)
        };
    }

    /// The block and the four (word, counter shift) positions for `key`: row `i` uses
    /// word `2i` or `2i + 1` of the block, one bit of the hash choosing, and four more bits
    /// choose the counter. The rows are computed independently (no carried state), so they
    /// unroll into straight-line code, and each word index is masked to the block, so the
    /// counter accesses need no bounds checks.
    #[inline(always)]
    fn positions(&self, key: u64) -> (usize, [(usize, u32); 4]) {
        let (block, bits) = spread(key, self.seed, self.block_mask);
        let spots = std::array::from_fn(|i| {
            let row = bits >> (5 * i);
            let word = (2 * i + (row & 1) as usize) & 7;
            (word, ((row >> 1) & 0xf) as u32 * 4)
        });
        (block, spots)
    }

    /// Makes room for the counters of `entries` keys, up to the capacity's: the blocks double
    /// until there is a 16-counter word per entry (Caffeine's size). Every estimate stays as
    /// it was: a key's block in the larger table is its old block or the one a whole old
    /// table further (one more bit of its hash decides), and both start as copies of the old.
    #[inline]
    pub(crate) fn fit(&mut self, entries: usize) {
        if self.table.len() < self.max_blocks && blocks_for(entries) > self.table.len() {
            self.grow(blocks_for(entries).min(self.max_blocks));
        }
    }

    /// The blocks of counters.
    #[cfg(test)]
    pub(crate) fn blocks(&self) -> usize {
        self.table.len()
    }

    #[cold]
    fn grow(&mut self, blocks: usize) {
        let mut table = zeroed(blocks);
        let old = &self.table;
        for (i, block) in table.iter_mut().enumerate() {
            *block = old[i & self.block_mask];
        }
        self.table = table;
        self.block_mask = blocks - 1;
        self.set_sample();
    }

    /// Where the counters are now, for callers that may not read the sketch (it is under its
    /// shard's lock) to prefetch them (see [`PublishedHint`]).
    pub(crate) fn hint(&self) -> Hint {
        Hint {
            blocks: self.table.as_ptr().addr(),
            block_mask: self.block_mask,
            seed: self.seed,
        }
    }

    /// Starts loading `key`'s block (see `prefetch.rs`).
    #[inline]
    pub(crate) fn prefetch(&self, key: u64) {
        self.hint().prefetch(key);
    }

    /// The estimated recent frequency of `key` (0 to 15).
    pub(crate) fn frequency(&self, key: u64) -> u64 {
        let (block, spots) = self.positions(key);
        let b = &self.table[block].0;
        let count = |(w, shift): (usize, u32)| (b[w] >> shift) & 0xf;
        count(spots[0])
            .min(count(spots[1]))
            .min(count(spots[2]).min(count(spots[3])))
    }

    /// Records one occurrence of `key`. Every counter below the maximum is raised, not only
    /// those at the minimum: one-off keys then displace looping ones less often. A key whose
    /// counters are all saturated changes nothing and does not count towards the next
    /// halving.
    pub(crate) fn increment(&mut self, key: u64) {
        let (block, spots) = self.positions(key);
        let b = &mut self.table[block].0;
        let mut raised = false;
        for (w, shift) in spots {
            if (b[w] >> shift) & 0xf < MAX_COUNT {
                b[w] += 1 << shift;
                raised = true;
            }
        }
        if !raised {
            return;
        }
        self.additions += 1;
        if self.additions >= self.sample {
            self.halve();
        }
    }

    /// Ages every counter by half (once per `sample` increments: kept out of `increment`'s
    /// code).
    #[cold]
    fn halve(&mut self) {
        const LOW_BITS: u64 = 0x7777_7777_7777_7777;
        for block in self.table.iter_mut() {
            for w in block.0.iter_mut() {
                *w = (*w >> 1) & LOW_BITS;
            }
        }
        self.additions /= 2;
    }
}

const _: () = assert!(PER_WORD * 4 == 64);

/// A sketch's layout, readable without its lock (see [`Sketch::hint`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Hint {
    /// The address of the first block: an address only, never read through.
    blocks: usize,
    block_mask: usize,
    seed: u64,
}

impl Hint {
    /// Starts loading the block of `key`'s counters (see `prefetch.rs`).
    #[inline]
    pub(crate) fn prefetch(&self, key: u64) {
        let (block, _) = spread(key, self.seed, self.block_mask);
        let at = self.blocks + block * std::mem::size_of::<Block>();
        crate::prefetch::prefetch(std::ptr::without_provenance::<Block>(at));
    }
}

/// A sketch's [`Hint`] as its shard publishes it beside the lock, renewed under the lock when
/// the sketch grows. Its words are read without the lock, and each may be a growth behind
/// the other: the address then computed is a wrong one, which a prefetch loads for nothing
/// (it never faults, and nothing reads through it). Not modelled under loom, for that reason.
#[derive(Debug)]
pub(crate) struct PublishedHint {
    blocks: std::sync::atomic::AtomicUsize,
    block_mask: std::sync::atomic::AtomicUsize,
    seed: u64,
}

impl PublishedHint {
    pub(crate) fn new(hint: Hint) -> Self {
        PublishedHint {
            blocks: hint.blocks.into(),
            block_mask: hint.block_mask.into(),
            seed: hint.seed,
        }
    }

    /// Publishes `hint`, the sketch's now (under the shard's lock).
    #[inline]
    pub(crate) fn renew(&self, hint: Hint) {
        use std::sync::atomic::Ordering::Relaxed;
        if self.blocks.load(Relaxed) != hint.blocks {
            self.block_mask.store(hint.block_mask, Relaxed);
            self.blocks.store(hint.blocks, Relaxed);
        }
    }

    /// Starts loading the block of `key`'s counters (see `prefetch.rs`).
    #[inline]
    pub(crate) fn prefetch(&self, key: u64) {
        use std::sync::atomic::Ordering::Relaxed;
        let hint = Hint {
            blocks: self.blocks.load(Relaxed),
            block_mask: self.block_mask.load(Relaxed),
            seed: self.seed,
        };
        hint.prefetch(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_s_counters_share_one_cache_line() {
        // Under Miri, a grown sketch of a million entries takes minutes to copy.
        let capacities: &[usize] = if cfg!(miri) {
            &[1_000, 20_000]
        } else {
            &[1_000, 100_000, 1_000_000]
        };
        for &capacity in capacities {
            let mut s = Sketch::new(capacity, 3);
            s.fit(capacity);
            assert_eq!(
                s.table.as_ptr().addr() % 64,
                0,
                "blocks of a sketch for {capacity} entries start off a line boundary"
            );
            assert_eq!(std::mem::size_of::<Block>(), 64);
        }
    }

    #[test]
    fn a_sketch_grows_with_its_entries_up_to_its_capacity() {
        let mut s = Sketch::new(100_000, 1);
        assert_eq!(
            s.table.len(),
            MIN_WORDS / 8,
            "a new sketch counts for no entries yet"
        );
        s.fit(500);
        assert_eq!(s.table.len(), MIN_WORDS / 8);
        s.fit(10_000);
        assert_eq!(s.table.len(), 16_384 / 8);
        s.fit(1_000_000);
        assert_eq!(
            s.table.len(),
            131_072 / 8,
            "grew past one word per entry of capacity"
        );
        assert_eq!(
            s.table.as_ptr().addr() % 64,
            0,
            "a grown sketch's blocks are aligned"
        );
    }

    /// A sketch sized for fewer entries than its capacity ages on their schedule.
    #[test]
    #[cfg_attr(miri, ignore = "safe code, 6,000 increments: too slow under Miri")]
    fn a_small_sketch_ages_on_its_own_schedule() {
        let mut s = Sketch::new(1_000_000, 9);
        for _ in 0..15 {
            s.increment(u64::MAX);
        }
        // 1,024 words: a halving after 5,120 increments, not after the capacity's 5 million.
        for k in 0..6_000 {
            s.increment(k);
        }
        let hot = s.frequency(u64::MAX);
        assert!(
            hot <= MAX_COUNT / 2 + 1,
            "no halving in 6,000 increments: {hot}"
        );
        s.fit(1_000_000);
        assert_eq!(
            s.sample,
            1_000_000 * AGE_EVERY,
            "the full sketch ages on the capacity's"
        );
    }

    #[test]
    #[cfg_attr(miri, ignore = "safe code, 20,000 increments: too slow under Miri")]
    fn growing_keeps_every_estimate() {
        let mut s = Sketch::new(1 << 16, 5);
        for k in 0..5_000u64 {
            for _ in 0..k % 7 {
                s.increment(k);
            }
        }
        let estimates = |s: &Sketch| (0..6_000u64).map(|k| s.frequency(k)).collect::<Vec<_>>();
        let before = estimates(&s);
        s.fit(1 << 16);
        assert_eq!(s.table.len(), (1 << 16) / 8);
        assert_eq!(
            estimates(&s),
            before,
            "an estimate changed with the sketch's size"
        );
    }

    #[test]
    fn counts_saturate_and_age() {
        let mut s = Sketch::new(1_000, 7);
        for _ in 0..20 {
            s.increment(42);
        }
        assert_eq!(s.frequency(42), MAX_COUNT);
        assert_eq!(s.frequency(43), 0);
        s.halve();
        assert_eq!(s.frequency(42), MAX_COUNT / 2);
    }

    #[test]
    #[cfg_attr(miri, ignore = "safe code, 16,000 increments: too slow under Miri")]
    fn frequent_keys_outrank_rare_ones_among_many() {
        let mut s = Sketch::new(512, 1);
        for round in 0..8u64 {
            for k in 0..2_000u64 {
                s.increment(k * 0x9e37_79b9 + round * 1_000_003); // one-off keys
            }
            for _ in 0..4 {
                s.increment(1);
            }
        }
        // Read 32 times among 16,000 one-off keys, with halvings between: still counted as
        // frequent, and above nearly every one-off key.
        let hot = s.frequency(1);
        assert!(hot >= 4, "{hot}");
        let rare = (0..100u64)
            .filter(|k| s.frequency(k * 0x9e37_79b9 + 5) >= hot)
            .count();
        assert!(
            rare < 5,
            "{rare} one-off keys look as frequent as a hot one"
        );
    }
}
