//! The caches and maps under test, behind one small trait so that every workload runs the
//! same code against each (monomorphised: no dynamic dispatch in the timed loops).
//!
//! Every adapter uses the same hasher, foldhash's seeded `fast::RandomState`, which is
//! herdcache's default; every crate compared here accepts a custom `BuildHasher`.

use std::collections::HashMap;
use std::num::NonZeroUsize;
use std::sync::Mutex;

use parking_lot::RwLock;

/// The hasher given to every cache and map.
pub type Hasher = foldhash::fast::RandomState;

/// A concurrent cache (or map) of `u64` to `u64`, as the benchmarks use it.
pub trait BenchCache: Send + Sync + Sized + 'static {
    /// Name in tables and plots.
    const NAME: &'static str;
    /// Whether the cache bounds its size; unbounded maps are left out of eviction workloads.
    const BOUNDED: bool;
    /// A cache holding at most `capacity` entries (unbounded maps: sized for it).
    fn with_capacity(capacity: usize) -> Self;
    /// Looks `key` up.
    fn get(&self, key: u64) -> Option<u64>;
    /// Inserts or replaces `key`.
    fn insert(&self, key: u64, value: u64);
    /// Finishes any deferred maintenance (moka applies writes to its policy in batches), so
    /// that a timed run after preloading does not pay for the preload.
    fn settle(&self) {}
    /// The value for `key`, computed with `load` and inserted on a miss, through the cache's
    /// own loading call where it has one (else `get`, then `insert`).
    #[inline]
    fn get_or_load(&self, key: u64, load: fn(u64) -> u64) -> u64 {
        self.get(key).unwrap_or_else(|| {
            let v = load(key);
            self.insert(key, v);
            v
        })
    }
    /// Reads every key of `keys`, returning how many were found. Adapters whose cache offers a
    /// cheaper batched read (one epoch pin for the batch) override this.
    #[inline]
    fn read_batch(&self, keys: &[u64]) -> u64 {
        read_each(self, keys)
    }
}

/// Reads `keys` one `get` at a time: how many were found.
#[inline]
pub fn read_each<C: BenchCache>(cache: &C, keys: &[u64]) -> u64 {
    keys.iter().filter(|&&k| cache.get(k).is_some()).count() as u64
}

/// herdcache. `PIN_BATCH = false`: every read is a `Cache::get`, one epoch pin each;
/// `true`: a batch of reads goes through one `Cache::pin` (`CacheGuard::get`).
pub struct HerdcacheReads<const PIN_BATCH: bool>(pub herdcache::Cache<u64, u64, Hasher>);

/// herdcache sized for `capacity` entries, with the shared hasher and `ttl` if any.
fn herdcache_for(
    capacity: usize,
    ttl: Option<std::time::Duration>,
) -> herdcache::Cache<u64, u64, Hasher> {
    let builder = herdcache::Cache::builder()
        .max_capacity(capacity as u64)
        .initial_capacity(capacity)
        .hasher(Hasher::default());
    match ttl {
        Some(ttl) => builder.time_to_live(ttl),
        None => builder,
    }
    .build()
    .expect("valid settings")
}

/// herdcache's `Cache::get`: one epoch pin per read.
pub type Herdcache = HerdcacheReads<false>;

/// herdcache read through `Cache::pin`, one pin per batch of reads.
pub type HerdcachePinned = HerdcacheReads<true>;

impl<const PIN_BATCH: bool> BenchCache for HerdcacheReads<PIN_BATCH> {
    const NAME: &'static str = if PIN_BATCH {
        "herdcache (pin per batch)"
    } else {
        "herdcache"
    };
    const BOUNDED: bool = true;
    fn with_capacity(capacity: usize) -> Self {
        HerdcacheReads(herdcache_for(capacity, None))
    }
    #[inline]
    fn get(&self, key: u64) -> Option<u64> {
        self.0.get(&key)
    }
    #[inline]
    fn insert(&self, key: u64, value: u64) {
        self.0.insert(key, value)
    }
    #[inline]
    fn get_or_load(&self, key: u64, load: fn(u64) -> u64) -> u64 {
        self.0.get_with(&key, |k| load(*k))
    }
    #[inline]
    fn read_batch(&self, keys: &[u64]) -> u64 {
        if !PIN_BATCH {
            return read_each(self, keys);
        }
        let guard = self.0.pin();
        keys.iter().filter(|k| guard.get(*k).is_some()).count() as u64
    }
}

/// herdcache with a time to live (an hour: nothing expires in a run), so that every write
/// computes an expiry and takes its share of the expiry sweep.
pub struct HerdcacheTtl(pub herdcache::Cache<u64, u64, Hasher>);

impl BenchCache for HerdcacheTtl {
    const NAME: &'static str = "herdcache (TTL)";
    const BOUNDED: bool = true;
    fn with_capacity(capacity: usize) -> Self {
        HerdcacheTtl(herdcache_for(
            capacity,
            Some(std::time::Duration::from_secs(3_600)),
        ))
    }
    #[inline]
    fn get(&self, key: u64) -> Option<u64> {
        self.0.get(&key)
    }
    #[inline]
    fn insert(&self, key: u64, value: u64) {
        self.0.insert(key, value)
    }
}

/// `moka::sync::Cache` (TinyLFU admission, LRU eviction).
pub struct Moka(pub moka::sync::Cache<u64, u64, Hasher>);

impl BenchCache for Moka {
    const NAME: &'static str = "moka";
    const BOUNDED: bool = true;
    fn with_capacity(capacity: usize) -> Self {
        Moka(
            moka::sync::Cache::builder()
                .max_capacity(capacity as u64)
                .initial_capacity(capacity)
                .build_with_hasher(Hasher::default()),
        )
    }
    #[inline]
    fn get(&self, key: u64) -> Option<u64> {
        self.0.get(&key)
    }
    #[inline]
    fn insert(&self, key: u64, value: u64) {
        self.0.insert(key, value)
    }
    fn settle(&self) {
        self.0.run_pending_tasks();
    }
    #[inline]
    fn get_or_load(&self, key: u64, load: fn(u64) -> u64) -> u64 {
        self.0.get_with(key, || load(key))
    }
}

/// `quick_cache::sync::Cache` (sharded, S3-FIFO-like CLOCK-Pro).
pub struct QuickCache(pub QuickCacheInner);

/// The quick_cache type used here.
pub type QuickCacheInner = quick_cache::sync::Cache<
    u64,
    u64,
    quick_cache::UnitWeighter,
    Hasher,
    quick_cache::sync::DefaultLifecycle<u64, u64>,
>;

/// A quick_cache cache of `capacity` entries with the shared hasher.
pub fn quick_cache_with_capacity(capacity: usize) -> QuickCacheInner {
    quick_cache::sync::Cache::with(
        capacity,
        capacity as u64,
        quick_cache::UnitWeighter,
        Hasher::default(),
        Default::default(),
    )
}

impl BenchCache for QuickCache {
    const NAME: &'static str = "quick_cache";
    const BOUNDED: bool = true;
    fn with_capacity(capacity: usize) -> Self {
        QuickCache(quick_cache_with_capacity(capacity))
    }
    #[inline]
    fn get(&self, key: u64) -> Option<u64> {
        self.0.get(&key)
    }
    #[inline]
    fn insert(&self, key: u64, value: u64) {
        self.0.insert(key, value)
    }
    #[inline]
    fn get_or_load(&self, key: u64, load: fn(u64) -> u64) -> u64 {
        self.0
            .get_or_insert_with(&key, || Ok::<_, std::convert::Infallible>(load(key)))
            .unwrap_or_else(|never| match never {})
    }
}

/// `Mutex<lru::LruCache>`: the classic mutex-based LRU (a hit moves the entry, so it takes
/// the lock).
pub struct MutexLru(pub Mutex<lru::LruCache<u64, u64, Hasher>>);

impl BenchCache for MutexLru {
    const NAME: &'static str = "Mutex<LruCache>";
    const BOUNDED: bool = true;
    fn with_capacity(capacity: usize) -> Self {
        let cap = NonZeroUsize::new(capacity.max(1)).expect("at least one");
        MutexLru(Mutex::new(lru::LruCache::with_hasher(
            cap,
            Hasher::default(),
        )))
    }
    #[inline]
    fn get(&self, key: u64) -> Option<u64> {
        self.0.lock().unwrap().get(&key).copied()
    }
    #[inline]
    fn insert(&self, key: u64, value: u64) {
        self.0.lock().unwrap().put(key, value);
    }
}

/// `parking_lot::RwLock<HashMap>`: a read-locked map, unbounded (no eviction).
pub struct RwLockMap(pub RwLock<HashMap<u64, u64, Hasher>>);

impl BenchCache for RwLockMap {
    const NAME: &'static str = "RwLock<HashMap>";
    const BOUNDED: bool = false;
    fn with_capacity(capacity: usize) -> Self {
        RwLockMap(RwLock::new(HashMap::with_capacity_and_hasher(
            capacity,
            Hasher::default(),
        )))
    }
    #[inline]
    fn get(&self, key: u64) -> Option<u64> {
        self.0.read().get(&key).copied()
    }
    #[inline]
    fn insert(&self, key: u64, value: u64) {
        self.0.write().insert(key, value);
    }
}

/// `dashmap::DashMap`: a sharded read-write-locked map, unbounded.
pub struct DashMap(pub dashmap::DashMap<u64, u64, Hasher>);

impl BenchCache for DashMap {
    const NAME: &'static str = "dashmap";
    const BOUNDED: bool = false;
    fn with_capacity(capacity: usize) -> Self {
        DashMap(dashmap::DashMap::with_capacity_and_hasher(
            capacity,
            Hasher::default(),
        ))
    }
    #[inline]
    fn get(&self, key: u64) -> Option<u64> {
        self.0.get(&key).map(|r| *r)
    }
    #[inline]
    fn insert(&self, key: u64, value: u64) {
        self.0.insert(key, value);
    }
}

/// `papaya::HashMap`, a lock-free map with no cache features, unbounded. `PIN_BATCH = false`:
/// one `pin()` per read; `true`: one `pin()` per batch of reads.
pub struct PapayaReads<const PIN_BATCH: bool>(pub papaya::HashMap<u64, u64, Hasher>);

/// papaya with one pin per read.
pub type Papaya = PapayaReads<false>;

/// papaya with one pin per batch of reads.
pub type PapayaPinned = PapayaReads<true>;

impl<const PIN_BATCH: bool> BenchCache for PapayaReads<PIN_BATCH> {
    const NAME: &'static str = if PIN_BATCH {
        "papaya (pin per batch)"
    } else {
        "papaya"
    };
    const BOUNDED: bool = false;
    fn with_capacity(capacity: usize) -> Self {
        PapayaReads(
            papaya::HashMap::builder()
                .capacity(capacity)
                .hasher(Hasher::default())
                .build(),
        )
    }
    #[inline]
    fn get(&self, key: u64) -> Option<u64> {
        self.0.pin().get(&key).copied()
    }
    #[inline]
    fn insert(&self, key: u64, value: u64) {
        self.0.pin().insert(key, value);
    }
    #[inline]
    fn read_batch(&self, keys: &[u64]) -> u64 {
        if !PIN_BATCH {
            return read_each(self, keys);
        }
        let guard = self.0.pin();
        keys.iter().filter(|k| guard.get(*k).is_some()).count() as u64
    }
}
