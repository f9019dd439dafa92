//! Statistics: per-thread counter blocks summed on demand.
//!
//! A hit must not write a cache line that another core writes, so each thread that uses a
//! cache owns one block of counters (claimed on its first use of the cache, released when the
//! thread exits, and reused by a later thread). The owner bumps its counters with a plain
//! load and store, which compiles to an ordinary increment; [`Cache::stats`] sums the blocks.
//! A shared block, bumped with `fetch_add`, serves the rare calls made while a thread's local
//! storage is being torn down.
//!
//! Counters are statistics, not synchronisation: all accesses are Relaxed, and a snapshot
//! taken while other threads run is a sum of slightly different instants.
//!
//! [`Cache::stats`]: crate::Cache::stats

use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crossbeam_utils::CachePadded;

use crate::policy::Requests;

/// What each counter counts; the index into a [`CounterBlock`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(usize)]
pub(crate) enum Counter {
    Hits,
    Misses,
    Inserts,
    Updates,
    Invalidations,
    Evictions,
    Expirations,
    Loads,
    CoalescedWaits,
    LoadErrors,
    LoadPanics,
    Timeouts,
    Refreshes,
    RefreshFailures,
    Throttled,
    LoadsCancelled,
    SharedHits,
    SharedLoads,
    SharedLockWaits,
    SharedWaitTimeouts,
    SharedErrors,
    SharedCodecErrors,
    LoadTimeouts,
    SharedWritesSent,
    SharedWritesHeard,
    SharedBroadcastLagMicros,
    SharedStaleDropped,
    SharedConflicts,
    /// Leaders of loads that ended (finished, failed, panicked or were cancelled): with
    /// `Loads`, the loads in flight.
    LoadsEnded,
    /// Callers served an expired (or, behind a refresh, still valid) value in place of a load
    /// that did not finish for them.
    StaleServed,
    /// Loads led by a future outside a tokio runtime, which skipped the shared tier.
    SharedSkipped,
    /// Removals not told to the listener: past `MAX_LISTENER_CHAIN` in one chain.
    ListenerSkipped,
    /// Writes that could not reach the shared tier and were deferred.
    SharedWritesFailed,
    /// Deferred writes replayed to the shared tier.
    SharedWritesReplayed,
    /// Values kept out of the shared tier for their size.
    SharedTooLarge,
}

const COUNTERS: usize = Counter::SharedTooLarge as usize + 1;
/// Load durations, by power of two: bucket `i` counts loads of less than `2^(i + 10)` ns
/// (bucket 0: under about 1 µs; the last: everything from 2^38 ns, about 4.6 minutes, on).
const LATENCY_BUCKETS: usize = 30;
/// Where the buckets start in a block, and the slot of the longest load (nanoseconds, a
/// maximum rather than a sum).
const LATENCY_FIRST: usize = COUNTERS;
const LATENCY_MAX: usize = COUNTERS + LATENCY_BUCKETS;
const SLOTS: usize = LATENCY_MAX + 1;

/// The bucket of a load that took `nanos`.
fn latency_bucket(nanos: u64) -> usize {
    let above = (u64::BITS - (nanos >> 10).leading_zeros()) as usize;
    above.min(LATENCY_BUCKETS - 1)
}

/// A percentile of the durations in `buckets` (none: zero), as the upper bound of its
/// bucket, at most `max`: within a factor of two above the true value.
fn percentile(buckets: &[u64], max: u64, p: f64) -> Duration {
    let total: u64 = buckets.iter().sum();
    if total == 0 {
        return Duration::ZERO;
    }
    let rank = ((total as f64 * p).ceil() as u64).max(1);
    let mut seen = 0;
    for (i, &n) in buckets.iter().enumerate() {
        seen += n;
        if seen >= rank {
            let upper = 1u64.checked_shl(i as u32 + 10).unwrap_or(u64::MAX);
            return Duration::from_nanos(upper.min(max));
        }
    }
    Duration::from_nanos(max)
}

/// A snapshot of a cache's counters, from [`Cache::stats`](crate::Cache::stats).
/// `Serialize` with the `serde` feature.
///
/// ```
/// let cache = herdcache::Cache::builder().max_capacity(10).build()?;
/// assert_eq!(cache.get_or_load(&1, |_| Ok::<_, ()>(10)), Ok(10)); // a miss, then a load
/// assert_eq!(cache.get(&1), Some(10)); // a hit
/// let stats = cache.stats();
/// assert_eq!((stats.hits, stats.misses, stats.loads), (1, 1, 1));
/// # Ok::<(), herdcache::BuildError>(())
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct Stats {
    /// Lookups that found a live value.
    pub hits: u64,
    /// Lookups that found nothing, or only an expired entry.
    pub misses: u64,
    /// Inserts of a key that had no entry.
    pub inserts: u64,
    /// Inserts that replaced a key's entry.
    pub updates: u64,
    /// Entries removed by `invalidate` or `invalidate_all` (on a fleet cache, also local copies
    /// dropped for another instance's write; those are in `shared_stale_dropped` too).
    pub invalidations: u64,
    /// Entries removed to keep the cache within its capacity.
    pub evictions: u64,
    /// Expired entries removed (when read, replaced by a load, or chosen by the eviction
    /// sweep).
    pub expirations: u64,
    /// Loads run (each by the one caller that led it).
    pub loads: u64,
    /// Callers that joined a load led by another caller instead of loading themselves.
    pub coalesced_waits: u64,
    /// Loads whose loader returned an error.
    pub load_errors: u64,
    /// Loads whose loader panicked.
    pub load_panics: u64,
    /// Waiters that gave up at their deadline (served stale, or a timeout error).
    pub timeouts: u64,
    /// Early refreshes started (XFetch or soft TTL); each is also counted in `loads`.
    pub refreshes: u64,
    /// Refreshes that failed while the old value stayed in place (stale-if-error).
    pub refresh_failures: u64,
    /// Loads held back by `max_concurrent_loads`: the caller served a stale value, skipped a
    /// refresh, waited for a permit, or timed out waiting.
    pub throttled: u64,
    /// Loads whose leader was dropped before the load finished (a cancelled future, or a
    /// refresh job its spawner dropped unrun); their waiters looked at the key again.
    pub loads_cancelled: u64,
    /// Loads that ran past [`load_timeout`](crate::CacheBuilder::load_timeout) and were
    /// detached (their waiters answered, their permit returned, their late result refused).
    pub load_timeouts: u64,
    /// Loads answered by the shared tier (feature `redis`): another instance had loaded the
    /// value. Each is also counted in `loads`, but reached no source.
    pub shared_hits: u64,
    /// Loads run by this instance while holding the shared tier's lock for the key.
    pub shared_loads: u64,
    /// Loads that found the shared lock held by another instance and waited for its value.
    pub shared_lock_waits: u64,
    /// Of those, loads that waited out the tier's wait bound and loaded on their own.
    pub shared_wait_timeouts: u64,
    /// Shared-tier operations that failed (unreachable, slow, or an error reply); each such
    /// load ran locally.
    pub shared_errors: u64,
    /// Values that failed to encode for, or decode from, the shared tier.
    pub shared_codec_errors: u64,
    /// Writes (`invalidate`, `insert`, `invalidate_all`) this instance made through the shared
    /// tier and announced to the others.
    pub shared_writes_sent: u64,
    /// Writes announced by other instances that this instance heard.
    pub shared_writes_heard: u64,
    /// The delays of those, summed, from the writer's call to this instance hearing it, in
    /// microseconds (wall clocks: across machines, their skew is included). Divide by
    /// `shared_writes_heard` for the mean.
    pub shared_broadcast_lag_micros: u64,
    /// Local copies dropped because another instance wrote their key, or because the link to
    /// the shared tier's channel was lost.
    pub shared_stale_dropped: u64,
    /// Loads whose value the shared tier refused because their key was written or invalidated
    /// while they ran (or they outlived their lease): their waiters got the value, no cache
    /// kept it.
    pub shared_conflicts: u64,
    /// Loads led by a future outside a tokio runtime (feature `redis`): the shared tier's
    /// client needs one, so they loaded locally, without the fleet's lock or its value (the
    /// first is also logged, once per tier). Drive such loads with `get_or_load_spawned` and a
    /// `TokioSpawner`, or call from a tokio task, to keep them in the fleet's single flight.
    pub shared_skipped: u64,
    /// Writes (`invalidate`, `insert`, `invalidate_all`) that could not reach the shared tier
    /// (feature `redis`): applied locally and queued, to be replayed (see
    /// `fleet::RedisTierBuilder::outbox_limit`).
    pub shared_writes_failed: u64,
    /// Of those, writes replayed to the shared tier once Redis answered again.
    pub shared_writes_replayed: u64,
    /// Values kept out of the shared tier because, encoded, they were larger than its
    /// `max_value_size` (feature `redis`): they stayed in the instance that had them.
    pub shared_too_large: u64,
    /// Values that left the cache without the eviction listener hearing of it: removals made
    /// by a chain of listener calls (a listener writing to its own cache, whose writes evict)
    /// past [`MAX_LISTENER_CHAIN`](crate::MAX_LISTENER_CHAIN) notifications.
    pub listener_skipped: u64,
    /// Loads running now (a gauge): started and not yet ended, including loads detached past
    /// their `load_timeout` whose loader has not returned.
    pub loads_in_flight: u64,
    /// Callers served a stale value (expired at most `max_stale` ago, or the still-valid
    /// value behind a refresh) in place of a load that did not finish for them: their
    /// deadline passed, the load ran past its `load_timeout`, or `max_concurrent_loads` held
    /// them back. Counted apart from the timeouts themselves.
    pub stale_served: u64,
    /// Median time a load took, from the leader's start to its result (the loader's own time
    /// and the cache's work around it), by the cache's clock. Loads are counted in buckets
    /// by powers of two, so percentiles are upper bounds within a factor of two; zero before
    /// any load ended.
    pub load_latency_p50: Duration,
    /// 99th percentile of the time a load took (as `load_latency_p50`).
    pub load_latency_p99: Duration,
    /// The longest load.
    pub load_latency_max: Duration,
}

impl Stats {
    /// Lookups in total (`hits + misses`).
    ///
    /// ```
    /// let cache = herdcache::Cache::builder().max_capacity(10).build()?;
    /// cache.insert(1, 1);
    /// let _ = (cache.get(&1), cache.get(&2), cache.contains_key(&3));
    /// assert_eq!(cache.stats().requests(), 3);
    /// # Ok::<(), herdcache::BuildError>(())
    /// ```
    pub fn requests(&self) -> u64 {
        self.hits.saturating_add(self.misses)
    }

    /// Callers per load that waited for it instead of loading (`coalesced_waits / loads`):
    /// how much single flight saves. 0.0 before any load.
    ///
    /// ```
    /// let mut stats = herdcache::Stats::default();
    /// assert_eq!(stats.waiters_per_load(), 0.0);
    /// stats.loads = 4;
    /// stats.coalesced_waits = 36;
    /// assert_eq!(stats.waiters_per_load(), 9.0); // each load spared its source 9 calls
    /// ```
    pub fn waiters_per_load(&self) -> f64 {
        match self.loads {
            0 => 0.0,
            n => self.coalesced_waits as f64 / n as f64,
        }
    }

    /// `hits / requests`, or 0.0 when there was no request (an idle cache has served
    /// nothing from memory, so it does not report a perfect ratio).
    ///
    /// ```
    /// let cache: herdcache::Cache<u32, u32> = herdcache::Cache::builder().max_capacity(10).build()?;
    /// assert_eq!(cache.stats().hit_ratio(), 0.0);
    /// cache.insert(1, 1);
    /// let _ = (cache.get(&1), cache.get(&2));
    /// assert_eq!(cache.stats().hit_ratio(), 0.5);
    /// # Ok::<(), herdcache::BuildError>(())
    /// ```
    pub fn hit_ratio(&self) -> f64 {
        match self.requests() {
            0 => 0.0,
            n => self.hits as f64 / n as f64,
        }
    }
}

/// One thread's counters, on cache lines of their own.
#[derive(Debug)]
pub(crate) struct CounterBlock {
    counts: CachePadded<[AtomicU64; SLOTS]>,
    in_use: AtomicBool,
}

impl Default for CounterBlock {
    fn default() -> Self {
        CounterBlock {
            counts: CachePadded::new(std::array::from_fn(|_| AtomicU64::new(0))),
            in_use: AtomicBool::new(false),
        }
    }
}

impl CounterBlock {
    /// Adds one; only the block's owning thread may call this (no other thread writes it).
    #[inline]
    pub(crate) fn bump_owned(&self, c: Counter) {
        self.bump_slot_owned(c as usize);
    }

    /// Adds one from any thread.
    #[inline]
    pub(crate) fn bump_shared(&self, c: Counter) {
        self.counts[c as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Records a load that took `nanos`; only the owning thread may call this.
    pub(crate) fn latency_owned(&self, nanos: u64) {
        self.bump_slot_owned(LATENCY_FIRST + latency_bucket(nanos));
        let max = &self.counts[LATENCY_MAX];
        if nanos > max.load(Ordering::Relaxed) {
            max.store(nanos, Ordering::Relaxed);
        }
    }

    /// Records a load that took `nanos`, from any thread.
    pub(crate) fn latency_shared(&self, nanos: u64) {
        self.counts[LATENCY_FIRST + latency_bucket(nanos)].fetch_add(1, Ordering::Relaxed);
        self.counts[LATENCY_MAX].fetch_max(nanos, Ordering::Relaxed);
    }

    #[inline]
    fn bump_slot_owned(&self, slot: usize) {
        let a = &self.counts[slot];
        a.store(a.load(Ordering::Relaxed).wrapping_add(1), Ordering::Relaxed);
    }

    /// Adds `n` from any thread.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn add_shared(&self, c: Counter, n: u64) {
        self.counts[c as usize].fetch_add(n, Ordering::Relaxed);
    }

    /// Gives the block back for a later thread to claim. Release: the next owner's Acquire
    /// claim sees our last counts, so its plain increments continue from them.
    pub(crate) fn release(&self) {
        self.in_use.store(false, Ordering::Release);
    }

    fn try_claim(&self) -> bool {
        // Acquire pairs with the Release store in `release`: we see the last owner's counts.
        self.in_use
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
    }
}

struct Link {
    block: Arc<CounterBlock>,
    next: *mut Link,
}

/// All counter blocks of one cache: an append-only lock-free list (blocks are reused, never
/// unlinked, so there is no ABA and no reclamation until the registry drops).
pub(crate) struct CounterRegistry {
    head: AtomicPtr<Link>,
    shared: CounterBlock,
}

// SAFETY: links are only appended (published with Release, read with Acquire) and freed in
// `drop`, which has exclusive access; blocks themselves are made of atomics.
unsafe impl Send for CounterRegistry {}
// SAFETY: as above.
unsafe impl Sync for CounterRegistry {}

impl std::fmt::Debug for CounterRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CounterRegistry").finish_non_exhaustive()
    }
}

impl CounterRegistry {
    pub(crate) fn new() -> Self {
        CounterRegistry {
            head: AtomicPtr::new(ptr::null_mut()),
            shared: CounterBlock::default(),
        }
    }

    /// The block for calls that cannot use a thread's own (see the module docs).
    pub(crate) fn shared(&self) -> &CounterBlock {
        &self.shared
    }

    /// A block for the calling thread: a released one if any, else a new one.
    pub(crate) fn claim(&self) -> Arc<CounterBlock> {
        for block in self.blocks() {
            if block.try_claim() {
                return Arc::clone(block);
            }
        }
        let block = Arc::new(CounterBlock::default());
        block.in_use.store(true, Ordering::Relaxed);
        let link = Box::into_raw(Box::new(Link {
            block: Arc::clone(&block),
            next: ptr::null_mut(),
        }));
        let mut head = self.head.load(Ordering::Relaxed);
        loop {
            // SAFETY: `link` is ours until the CAS below publishes it.
            unsafe { (*link).next = head };
            // Release publishes the link's fields to `blocks()` readers (Acquire).
            match self
                .head
                .compare_exchange_weak(head, link, Ordering::Release, Ordering::Relaxed)
            {
                Ok(_) => return block,
                Err(h) => head = h,
            }
        }
    }

    fn blocks(&self) -> impl Iterator<Item = &Arc<CounterBlock>> {
        // Acquire pairs with the Release CAS in `claim` that published each link.
        let mut p = self.head.load(Ordering::Acquire);
        std::iter::from_fn(move || {
            // SAFETY: published links are never freed before the registry drops, and their
            // fields were written before publication (Release/Acquire on `head`).
            let link = unsafe { p.as_ref() }?;
            p = link.next;
            Some(&link.block)
        })
    }

    /// The hits and misses of lookups so far, summed over every block: what the eviction
    /// policy's window sizer watches for a collapse (a cheaper `snapshot`).
    pub(crate) fn requests(&self) -> Requests {
        let mut r = Requests::default();
        for block in self
            .blocks()
            .map(|b| &**b)
            .chain(std::iter::once(&self.shared))
        {
            let count = |c: Counter| block.counts[c as usize].load(Ordering::Relaxed);
            r.hits = r.hits.wrapping_add(count(Counter::Hits));
            r.misses = r.misses.wrapping_add(count(Counter::Misses));
        }
        r
    }

    /// Sums every block.
    pub(crate) fn snapshot(&self) -> Stats {
        let mut sum = [0u64; SLOTS];
        for block in self
            .blocks()
            .map(|b| &**b)
            .chain(std::iter::once(&self.shared))
        {
            for (s, c) in sum[..LATENCY_MAX].iter_mut().zip(block.counts.iter()) {
                *s = s.wrapping_add(c.load(Ordering::Relaxed));
            }
            sum[LATENCY_MAX] =
                sum[LATENCY_MAX].max(block.counts[LATENCY_MAX].load(Ordering::Relaxed));
        }
        let get = |c: Counter| sum[c as usize];
        let buckets = &sum[LATENCY_FIRST..LATENCY_MAX];
        let max = sum[LATENCY_MAX];
        Stats {
            hits: get(Counter::Hits),
            misses: get(Counter::Misses),
            inserts: get(Counter::Inserts),
            updates: get(Counter::Updates),
            invalidations: get(Counter::Invalidations),
            evictions: get(Counter::Evictions),
            expirations: get(Counter::Expirations),
            loads: get(Counter::Loads),
            coalesced_waits: get(Counter::CoalescedWaits),
            load_errors: get(Counter::LoadErrors),
            load_panics: get(Counter::LoadPanics),
            loads_cancelled: get(Counter::LoadsCancelled),
            shared_hits: get(Counter::SharedHits),
            shared_loads: get(Counter::SharedLoads),
            shared_lock_waits: get(Counter::SharedLockWaits),
            shared_wait_timeouts: get(Counter::SharedWaitTimeouts),
            shared_errors: get(Counter::SharedErrors),
            shared_codec_errors: get(Counter::SharedCodecErrors),
            timeouts: get(Counter::Timeouts),
            refreshes: get(Counter::Refreshes),
            refresh_failures: get(Counter::RefreshFailures),
            throttled: get(Counter::Throttled),
            load_timeouts: get(Counter::LoadTimeouts),
            shared_writes_sent: get(Counter::SharedWritesSent),
            shared_writes_heard: get(Counter::SharedWritesHeard),
            shared_broadcast_lag_micros: get(Counter::SharedBroadcastLagMicros),
            shared_stale_dropped: get(Counter::SharedStaleDropped),
            shared_conflicts: get(Counter::SharedConflicts),
            shared_skipped: get(Counter::SharedSkipped),
            listener_skipped: get(Counter::ListenerSkipped),
            shared_writes_failed: get(Counter::SharedWritesFailed),
            shared_writes_replayed: get(Counter::SharedWritesReplayed),
            shared_too_large: get(Counter::SharedTooLarge),
            // Both sums are read at slightly different instants: never below zero.
            loads_in_flight: get(Counter::Loads).saturating_sub(get(Counter::LoadsEnded)),
            stale_served: get(Counter::StaleServed),
            load_latency_p50: percentile(buckets, max, 0.5),
            load_latency_p99: percentile(buckets, max, 0.99),
            load_latency_max: Duration::from_nanos(max),
        }
    }
}

impl Drop for CounterRegistry {
    fn drop(&mut self) {
        let mut p = *self.head.get_mut();
        while !p.is_null() {
            // SAFETY: exclusive access; each link was made by `Box::into_raw` and is freed once.
            let link = unsafe { Box::from_raw(p) };
            p = link.next;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn released_blocks_are_reused_and_keep_their_counts() {
        let reg = CounterRegistry::new();
        let a = reg.claim();
        a.bump_owned(Counter::Hits);
        a.release();
        let b = reg.claim();
        assert!(Arc::ptr_eq(&a, &b));
        b.bump_owned(Counter::Hits);
        let c = reg.claim();
        assert!(!Arc::ptr_eq(&b, &c));
        reg.shared().bump_shared(Counter::Misses);
        let s = reg.snapshot();
        assert_eq!((s.hits, s.misses), (2, 1));
        assert!((s.hit_ratio() - 2.0 / 3.0).abs() < 1e-12);
    }

    #[test]
    fn load_latency_percentiles_are_bucket_bounds_within_the_maximum() {
        let reg = CounterRegistry::new();
        let a = reg.claim();
        // 90 loads of 1.5 ms, 9 of 40 ms, one of 3 s (from another thread's shared path).
        for _ in 0..90 {
            a.latency_owned(1_500_000);
        }
        for _ in 0..9 {
            a.latency_owned(40_000_000);
        }
        reg.shared().latency_shared(3_000_000_000);
        let s = reg.snapshot();
        // 1.5 ms is in the bucket below 2^21 ns (2.1 ms); 40 ms below 2^26 ns (67 ms).
        assert_eq!(s.load_latency_p50, Duration::from_nanos(1 << 21));
        assert_eq!(s.load_latency_p99, Duration::from_nanos(1 << 26));
        assert_eq!(s.load_latency_max, Duration::from_secs(3));
        assert_eq!(
            CounterRegistry::new().snapshot().load_latency_p99,
            Duration::ZERO
        );
    }

    #[test]
    fn latency_buckets_cover_every_duration() {
        assert_eq!(latency_bucket(0), 0);
        assert_eq!(latency_bucket(1_023), 0);
        assert_eq!(latency_bucket(1_024), 1);
        assert_eq!(latency_bucket(u64::MAX), LATENCY_BUCKETS - 1);
        assert_eq!(
            percentile(&[0, 0, 1], u64::MAX, 0.5),
            Duration::from_nanos(1 << 12)
        );
    }

    #[test]
    fn requests_sum_the_lookups_of_every_thread_and_nothing_else() {
        let reg = CounterRegistry::new();
        let (a, b) = (reg.claim(), reg.claim());
        for _ in 0..3 {
            a.bump_owned(Counter::Hits);
        }
        b.bump_owned(Counter::Hits);
        b.bump_owned(Counter::Misses);
        b.bump_owned(Counter::Inserts);
        reg.shared().bump_shared(Counter::Misses);
        assert_eq!(reg.requests(), Requests { hits: 4, misses: 2 });
    }
}
