//! Eviction policy, behind a small internal trait so that it stays one module.
//!
//! The policy (W-TinyLFU, `tinylfu.rs`) is a single-threaded structure under a lock, taken by
//! writes (inserts, published loads) and removals, which keep its view of the table exact; a
//! large cache splits it into shards by policy key, each with its lock and its share of the
//! capacity, so that writers of different keys rarely wait for each other.
//! Hits never take it: a hit only raises a small counter in its own entry, test before set
//! ([`EntryState::on_hit`]), so once an entry has been hit a few times since the policy last
//! looked at it, further hits read that byte and write nothing. When the policy considers an
//! entry (as a victim or as a candidate leaving the window) it reads and resets the counter:
//! the hits are folded into the frequency sketch, and an entry hit since its last look gets a
//! second chance in its region, as in CLOCK. So hits cost what they cost under CLOCK, and the
//! sketch still counts every key's recent popularity, resident or not.
//!
//! Each entry is stored once, in the table's node. The policy's per-key record (its place in
//! the recency lists, its weight) points at the node that holds the key's current write, and
//! the node's [`Link`] says which record that is: victims are found, looked at and
//! removed by that pointer, with no second lookup by hash (an index from policy key to
//! record is kept only with the shared tier, whose broadcasts name keys so).
//! How a record passes from one write of a key to the next, when writers report to the
//! policy in another order than they wrote the table, is the succession of `tinylfu.rs`.

mod index;
mod sketch;
mod tinylfu;
mod window;

pub(crate) use tinylfu::{Look, Probe, Ranked, Tracked, Victim, Write};
pub(crate) use window::{Requests, Served};

use crossbeam_utils::CachePadded;

use crate::sync::{AtomicU32, AtomicU8, Mutex, NoUserCode, Ordering};

/// Hits an entry counts between two looks of the policy (more are not told apart).
const MAX_HITS: u8 = 3;

/// Per-entry use: hits since the policy last looked at the entry, the policy shard that tracks
/// its key, a byte the entry keeps here, and the entry's [`Link`]. One word: a hit reads its
/// first bytes (the hit counter, and the tag that names the entry's state); the link, which
/// hits never read, fills the rest of it.
#[repr(C)]
#[derive(Debug)]
pub(crate) struct EntryState {
    hits: AtomicU8,
    /// The shard of the key's policy key (`Policy::shard_of`): where a removal reports.
    shard: u8,
    /// A byte the entry keeps here, where it costs no space and a hit reads it with the
    /// hit counter: which state it holds (`entry.rs`). The policy never reads it; fixed at
    /// construction.
    tag: u8,
    /// The entry's place in the policy.
    pub(crate) link: Link,
}

/// The entry's place in the policy: the number of the policy record that tracks this write,
/// or [`UNREPORTED`] / [`DETACHED`] (see `tinylfu.rs`, "Succession"). The policy knows a
/// write by its link ([`Tracked`]). Read and written only under the lock of the entry's
/// shard, which orders every access: Relaxed.
#[derive(Debug)]
pub(crate) struct Link {
    record: AtomicU32,
}

impl Link {
    /// The link of a write not yet reported.
    pub(crate) fn new() -> Self {
        Link {
            record: AtomicU32::new(UNREPORTED),
        }
    }

    /// The policy record tracking this write (see [`UNREPORTED`], [`DETACHED`]). Under the
    /// shard's lock.
    #[inline]
    pub(super) fn record(&self) -> u32 {
        self.record.load(Ordering::Relaxed)
    }

    /// Sets the policy record tracking this write. Under the shard's lock.
    #[inline]
    pub(super) fn set_record(&self, record: u32) {
        self.record.store(record, Ordering::Relaxed)
    }
}

/// The write has not been reported to the policy yet, and nothing displaced it.
pub(crate) const UNREPORTED: u32 = u32::MAX;
/// The policy tracks nothing through this node: it left the table and whoever took it out
/// reported so, or the policy let its record go (an eviction), or it was a load that had no
/// record to carry.
pub(crate) const DETACHED: u32 = u32::MAX - 1;

impl EntryState {
    /// Records a hit. Test before set: an entry already at `MAX_HITS` is only read, so a hot
    /// entry's line stays shared between the cores reading it. Relaxed: a hint, and a lost
    /// increment between racing readers only makes the count a little low.
    #[inline]
    pub(crate) fn on_hit(&self) {
        let h = self.hits.load(Ordering::Relaxed);
        if h < MAX_HITS {
            self.hits.store(h + 1, Ordering::Relaxed);
        }
    }

    /// The state of a write of a key whose policy shard is `shard`, not hit yet, carrying
    /// the entry's `tag`.
    pub(crate) fn new(shard: u8, tag: u8) -> Self {
        EntryState {
            hits: AtomicU8::new(0),
            shard,
            tag,
            link: Link::new(),
        }
    }

    /// The entry's tag, as given to [`EntryState::new`].
    #[inline]
    pub(crate) fn tag(&self) -> u8 {
        self.tag
    }

    /// The policy shard of the entry's key.
    #[inline]
    pub(crate) fn shard(&self) -> u8 {
        self.shard
    }

    /// The hits since the last look, leaving them for the look.
    pub(crate) fn pending_hits(&self) -> u8 {
        self.hits.load(Ordering::Relaxed)
    }

    /// The hits since the last look, resetting them (the policy, under its lock).
    pub(crate) fn take_hits(&self) -> u8 {
        if self.hits.load(Ordering::Relaxed) == 0 {
            return 0;
        }
        self.hits.swap(0, Ordering::Relaxed)
    }
}

/// What the cache needs from an eviction policy. Entries are known by their node's
/// [`Link`] ([`Tracked`]), keys by their policy key (seeded per cache, see [`KeySource`]).
///
/// # Safety
/// The methods that take a `Tracked` are called under the lock of the entry's shard, by a
/// thread pinned since before the entry left the table, if it did: the policy reads and
/// writes the links it is handed and the ones it keeps (see `tinylfu.rs`, "Succession").
/// Every `Tracked` handed to a shard is of an entry of that shard (`EntryState::shard`):
/// its link names a record of this shard, or none.
pub(crate) trait EvictionPolicy: Send {
    /// The table now holds `write`; evictions needed to stay within capacity go to `out`.
    /// `probe` reports (and resets) an entry's hits and whether it expired; expired entries
    /// go first. `served` reads the cache's lookup counters (hits and misses so far).
    ///
    /// # Safety
    /// See the trait: `write.node` and `write.old` are live, and `write.node` was reported
    /// nowhere before.
    unsafe fn write(
        &mut self,
        write: Write,
        out: &mut Vec<Victim>,
        probe: &mut Probe<'_>,
        served: &Served<'_>,
    );
    /// Changes the capacity to `max` weight units, evicting what no longer fits to `out`
    /// (looked at through `probe`, as `write`'s victims are).
    ///
    /// # Safety
    /// As [`write`](Self::write): every node the policy tracks is live while it runs.
    unsafe fn resize(&mut self, max: u64, out: &mut Vec<Victim>, probe: &mut Probe<'_>);
    /// The table holds `write`, reported without admission: its record is settled as by
    /// `write`, with no use counted and no eviction, so the shard may exceed its bound by
    /// the write's weight until its next write. For a write that must be reported while
    /// its thread unwinds, with no victims to take out of the table. (A write heavier than
    /// the whole capacity, which `write` would evict at once, stays too: the next write
    /// evicts from the cold end until the bound holds, it perhaps last.)
    ///
    /// # Safety
    /// As `write`.
    unsafe fn settle(&mut self, write: Write);
    /// `new`, a load in progress for the key with policy key `pkey`, took `old`'s place in
    /// the table: the record that tracked `old`, if any and if of `pkey`, tracks `new` from
    /// now on, with no use counted.
    ///
    /// # Safety
    /// As `write`.
    unsafe fn carry(&mut self, old: Tracked, new: Tracked, pkey: u64);
    /// The table no longer holds `gone`, which the caller removed.
    ///
    /// # Safety
    /// See the trait: `gone` is live.
    unsafe fn remove(&mut self, gone: Tracked);
    /// The first write tracked for the key with policy key `pkey` that `wanted` accepts, if
    /// the policy keeps an index by policy key (the shared tier's broadcasts name keys so).
    /// A key may have several records for a moment, all but one on nodes already out of the
    /// table, while its writes report (see `tinylfu.rs`, "Succession"). Live until the shard's
    /// lock is released.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    fn find(&self, pkey: u64, wanted: &mut dyn FnMut(Tracked) -> bool) -> Option<Tracked>;
}

/// The fewest entries a shard of the policy holds. Each shard runs its own W-TinyLFU over
/// the keys that hash to it, so a shard must be large enough that the hot keys spread evenly
/// (the share of a shard's hot set varies by about `1/sqrt(entries)`: 0.8% here) and that
/// its sketch and window sizing see enough traffic; below two shards' worth, the policy is
/// one shard, as it is for every cache a hit-ratio trace of a few thousand keys measures.
const MIN_SHARD_ENTRIES: u64 = 16_384;

/// Shards per available core, at most: enough that two writers rarely want the same one.
const SHARDS_PER_CORE: usize = 4;

/// Shards at most: an entry names its shard in a byte.
const MAX_SHARDS: usize = 256;

/// Entries the frequency sketches of all shards are sized for together, at most (128 MiB of
/// counters): a cache configured far larger than it will be does not pay for a sketch of
/// its capacity, and one that large counts its keys coarser.
const SKETCH_MAX_ENTRIES: u64 = 1 << 24;

/// The cache's policy: one or more shards, each a W-TinyLFU over the keys whose policy key
/// selects it, under its own lock, with a scratch list of victims reused across writes (an
/// insert at capacity would otherwise allocate one).
///
/// The capacity is split between the shards, so the sum of their bounds is the cache's.
/// With a weigher there is one shard: an entry may weigh up to the whole capacity, which no
/// shard's share could hold.
#[derive(Debug)]
pub(crate) struct Policy {
    shards: Box<[CachePadded<Locked>]>,
    /// `64 - log2(shards)`: the policy key's top bits choose the shard (its low bits place it
    /// in the shard's index, and the sketch remixes it).
    shift: u32,
    /// Seeds derived policy keys (see [`KeySource::derived`]).
    pkey_seed: u64,
}

type Shard = (tinylfu::Core, Vec<Victim>);

/// Where the policy's records get their policy keys: `None`, every write comes with its
/// policy key, which its record keeps, and the policy keeps an index by policy key (the
/// shared tier's keys, hashed from the key alike in every process, which its broadcasts
/// name, see [`EvictionPolicy::find`]); `Some(back)`, a record's policy key is
/// [`Policy::pkey_of_hash`] of its node's table hash, a `u64` `back` bytes before the
/// node's [`Link`] (see [`KeySource::derived`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct KeySource(Option<usize>);

impl KeySource {
    /// Policy keys kept beside the records, and indexed.
    pub(crate) const INDEXED: KeySource = KeySource(None);

    /// Policy keys read from the nodes: the table hash lies `back` bytes before the link.
    ///
    /// # Safety
    /// Every write reported to the policy keeps its table hash there, initialised and
    /// unchanging while the node is live, in the allocation its `Tracked` addresses with
    /// the provenance of the whole node.
    pub(crate) const unsafe fn derived(back: usize) -> KeySource {
        KeySource(Some(back))
    }
}

/// The policy key of a key whose table hash is `hash`, in a cache whose policy keys the
/// shared tier does not fix: a bijection of the hash, seeded per cache, so that a table
/// hasher without a seed of its own does not make the sketch's collisions predictable. Its
/// top bits (which choose the shard) and its low bits (which place it in the sketch and in
/// the sizer's ghost) both depend on every bit of the hash, so even an identity hash of
/// consecutive integers spreads.
#[inline]
pub(crate) fn pkey_of_hash(hash: u64, seed: u64) -> u64 {
    let x = (hash ^ seed).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    x ^ (x >> 32)
}

/// A shard under its lock, beside where its sketch's counters are, which a write prefetches
/// before it takes the lock.
#[derive(Debug)]
struct Locked {
    shard: Mutex<Shard>,
    sketch: sketch::PublishedHint,
}

impl Policy {
    /// A policy for `max_weight` units, seeded for its sketches and its derived policy keys;
    /// `weighted`: a weigher is set; `keys`: where its records' policy keys come from.
    pub(crate) fn new(max_weight: u64, seed: u64, weighted: bool, keys: KeySource) -> Self {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let count = if weighted {
            1
        } else {
            shard_count(max_weight, cores)
        };
        // Apart from the sketches' seeds, which remix the policy keys.
        let pkey_seed = seed.rotate_left(29) ^ 0xa076_1d64_78bd_642f;
        let shards = (0..count as u64)
            .map(|i| {
                let share = Self::share(max_weight, count, i as usize);
                let sketched = share.min(SKETCH_MAX_ENTRIES / count as u64);
                let mut core = tinylfu::Core::with_sketch(share, sketched, seed.wrapping_add(i));
                match keys.0 {
                    None => core.index_by_pkey(),
                    // SAFETY: `KeySource::derived`'s contract.
                    Some(back) => unsafe { core.derive_pkeys(back, pkey_seed) },
                }
                if !weighted {
                    core.reserve(share);
                }
                CachePadded::new(Locked {
                    sketch: sketch::PublishedHint::new(core.sketch_hint()),
                    shard: Mutex::new((core, Vec::new())),
                })
            })
            .collect();
        Policy {
            shards,
            shift: 64 - count.trailing_zeros(),
            pkey_seed,
        }
    }

    /// Shards in use.
    pub(crate) fn shards(&self) -> usize {
        self.shards.len()
    }

    /// The shares of `max_weight` units among `count` shards: the remainder goes to the first
    /// shards, so the bounds sum to `max_weight`.
    fn share(max_weight: u64, count: usize, i: usize) -> u64 {
        max_weight / count as u64 + u64::from((i as u64) < max_weight % count as u64)
    }

    /// Gives the policy a capacity of `max_weight` units, shard by shard: `f` runs on each
    /// locked shard with its new share and its scratch list of victims (see
    /// `EvictionPolicy::resize`).
    pub(crate) fn resize(
        &self,
        max_weight: u64,
        mut f: impl FnMut(&mut dyn EvictionPolicy, u64, &mut Vec<Victim>),
    ) {
        let count = self.shards.len();
        for i in 0..count {
            let share = Self::share(max_weight, count, i);
            self.with_scratch(i as u8, |p, victims| f(p, share, victims));
        }
    }

    /// Total weight held, summed over the shards (each locked in turn).
    pub(crate) fn weight(&self) -> u64 {
        self.shards.iter().map(|s| s.shard.lock().0.weight()).sum()
    }

    /// The `n` entries the policy values most (`hottest`) or least, best first (see
    /// `Core::ranked`), over all shards, each locked in turn for its walk. `look` reads an
    /// entry's hits not yet seen by the policy, as a probe does but without resetting them,
    /// and its table hash.
    /// A listed entry is found again in the table by its hash and address: its `Tracked`
    /// may be read only under its shard's lock.
    pub(crate) fn ranked(
        &self,
        n: usize,
        hottest: bool,
        look: &dyn Fn(Tracked) -> (u64, u64),
    ) -> Vec<Ranked> {
        let mut all: Vec<Ranked> = Vec::new();
        for shard in self.shards.iter() {
            let shard = shard.shard.lock();
            let _quiet = NoUserCode::enter();
            all.extend(shard.0.ranked(n, hottest, look));
        }
        all.sort_unstable_by_key(|r| std::cmp::Reverse(r.pref));
        all.truncate(n);
        all
    }

    /// The policy key of a key whose table hash is `hash`, where policy keys are derived
    /// (see [`KeySource::derived`]).
    #[inline]
    pub(crate) fn pkey_of_hash(&self, hash: u64) -> u64 {
        pkey_of_hash(hash, self.pkey_seed)
    }

    /// The shard that tracks keys with policy key `pkey`.
    #[inline]
    pub(crate) fn shard_of(&self, pkey: u64) -> u8 {
        // `checked_shr`: one shard shifts by 64, which selects shard 0. At most `MAX_SHARDS`.
        pkey.checked_shr(self.shift).unwrap_or(0) as u8
    }

    /// Starts loading the sketch counters that a write of `pkey` will update, before the
    /// write takes its shard's lock (see `prefetch.rs`).
    #[inline]
    pub(crate) fn prefetch(&self, pkey: u64) {
        self.shards[usize::from(self.shard_of(pkey))]
            .sketch
            .prefetch(pkey);
    }

    /// Runs `f` on locked shard `shard` (a write or a removal). No user code runs under the
    /// lock, so a panic there is a broken invariant of the policy, whose records may then
    /// point at nodes about to be freed: the process aborts rather than go on with it (see
    /// `with_scratch`).
    pub(crate) fn with<R>(&self, shard: u8, f: impl FnOnce(&mut dyn EvictionPolicy) -> R) -> R {
        self.with_scratch(shard, |p, _| f(p))
    }

    /// Like `with`, also lending the (empty) scratch list of victims.
    pub(crate) fn with_scratch<R>(
        &self,
        shard: u8,
        f: impl FnOnce(&mut dyn EvictionPolicy, &mut Vec<Victim>) -> R,
    ) -> R {
        let locked = &self.shards[usize::from(shard)];
        let mut guard = locked.shard.lock();
        let _quiet = NoUserCode::enter();
        let (core, scratch) = &mut *guard;
        scratch.clear();
        let unwinding = AbortOnUnwind;
        let r = f(core, scratch);
        std::mem::forget(unwinding);
        // A write may have grown the sketch.
        locked.sketch.renew(core.sketch_hint());
        scratch.clear();
        r
    }
}

/// Aborts the process if dropped while its thread unwinds: a panic under a policy lock left
/// the shard half updated, with records that may point at nodes out of the table (no user
/// code runs there, so only a bug of the crate can panic there).
struct AbortOnUnwind;

impl Drop for AbortOnUnwind {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("herdcache: panic under an eviction policy lock; aborting");
            std::process::abort();
        }
    }
}

/// Shards for an unweighted policy of `max` entries on `cores` cores: a power of two, at
/// most `SHARDS_PER_CORE` per core and `MAX_SHARDS` in all, each holding at least
/// `MIN_SHARD_ENTRIES`.
fn shard_count(max: u64, cores: usize) -> usize {
    let by_size = usize::try_from(max / MIN_SHARD_ENTRIES).unwrap_or(usize::MAX);
    let by_cores = cores.saturating_mul(SHARDS_PER_CORE);
    let n = by_size.min(by_cores).clamp(1, MAX_SHARDS);
    // The largest power of two not above `n`.
    1 << (usize::BITS - 1 - n.leading_zeros())
}

#[cfg(all(test, not(herdcache_loom)))]
mod tests {
    use super::*;

    #[test]
    fn small_caches_have_one_shard_and_large_ones_one_per_share_of_the_cores() {
        assert_eq!(shard_count(0, 2), 1);
        assert_eq!(shard_count(20_000, 16), 1);
        assert_eq!(shard_count(2 * MIN_SHARD_ENTRIES - 1, 16), 1);
        assert_eq!(shard_count(2 * MIN_SHARD_ENTRIES, 16), 2);
        assert_eq!(shard_count(100_000, 2), 4);
        assert_eq!(shard_count(10_000_000, 2), 8);
        assert_eq!(shard_count(10_000_000, 3), 8);
        assert_eq!(shard_count(u64::MAX, usize::MAX), MAX_SHARDS);
    }

    #[test]
    #[cfg_attr(miri, ignore = "sketches for 100,000 entries, no unsafe code")]
    fn shares_sum_to_the_capacity_and_a_weigher_keeps_one_shard() {
        let p = Policy::new(100_003, 1, false, KeySource::INDEXED);
        assert!(
            p.shards() >= 4,
            "100,003 entries on any machine: at least 4 shards"
        );
        let total: u64 = p.shards.iter().map(|s| s.shard.lock().0.max()).sum();
        assert_eq!(total, 100_003);
        let weighted = Policy::new(100_003, 1, true, KeySource::INDEXED);
        assert_eq!(weighted.shards(), 1);
    }
}
