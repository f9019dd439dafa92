//! Behaviour of the public `Cache` API, one promise per test.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use herdcache::{BuildError, Cache, ManualClock};

fn cache(cap: u64) -> Cache<u64, u64> {
    Cache::builder().max_capacity(cap).build().unwrap()
}

fn ttl_cache(cap: u64, ttl: Duration) -> (Cache<u64, u64>, ManualClock) {
    let clock = ManualClock::new();
    let c = Cache::builder()
        .max_capacity(cap)
        .time_to_live(ttl)
        .clock(clock.clone())
        .build()
        .unwrap();
    (c, clock)
}

#[test]
fn insert_then_get_returns_the_latest_value() {
    let c = cache(100);
    assert_eq!(c.get(&1), None);
    c.insert(1, 10);
    assert_eq!(c.get(&1), Some(10));
    c.insert(1, 11);
    assert_eq!(c.get(&1), Some(11));
    assert_eq!(c.entry_count(), 1);
    assert!(c.contains_key(&1));
    assert!(!c.contains_key(&2));
}

#[test]
fn lookups_borrow_the_key() {
    let c: Cache<String, u32> = Cache::builder().max_capacity(10).build().unwrap();
    c.insert("alpha".to_owned(), 1);
    assert_eq!(c.get("alpha"), Some(1));
    assert!(c.invalidate("alpha"));
    assert_eq!(c.get("alpha"), None);
}

#[test]
fn invalidate_reports_whether_a_value_was_there() {
    let c = cache(10);
    c.insert(1, 1);
    assert!(c.invalidate(&1));
    assert!(!c.invalidate(&1));
    assert_eq!(c.get(&1), None);
    assert_eq!(c.entry_count(), 0);
}

#[test]
fn invalidate_all_empties_the_cache() {
    let c = cache(1000);
    for k in 0..500 {
        c.insert(k, k);
    }
    c.invalidate_all();
    assert_eq!(c.entry_count(), 0);
    assert!((0..500).all(|k| c.get(&k).is_none()));
    assert_eq!(c.stats().invalidations, 500);
    // And it is usable afterwards.
    c.insert(7, 7);
    assert_eq!(c.get(&7), Some(7));
}

#[test]
fn clones_are_the_same_cache_and_handles_are_send_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Cache<String, Arc<Vec<u8>>>>();
    let a = cache(10);
    let b = a.clone();
    a.insert(1, 1);
    assert_eq!(b.get(&1), Some(1));
}

#[test]
fn pinned_reads_borrow_without_cloning() {
    let c: Cache<u64, Arc<String>> = Cache::builder().max_capacity(10).build().unwrap();
    let v = Arc::new("one".to_owned());
    c.insert(1, Arc::clone(&v));
    let g = c.pin();
    for _ in 0..100 {
        assert_eq!(g.get(&1).map(|s| s.as_str()), Some("one"));
    }
    assert!(g.contains_key(&1));
    // No refcount was bumped by the reads: ours plus the cache's.
    assert_eq!(Arc::strong_count(&v), 2);
    drop(g);
}

#[test]
fn entries_expire_at_their_ttl_and_never_after() {
    let (c, clock) = ttl_cache(10, Duration::from_secs(10));
    c.insert(1, 1);
    clock.advance(Duration::from_millis(9_999));
    assert_eq!(c.get(&1), Some(1));
    clock.advance(Duration::from_millis(1));
    assert_eq!(c.get(&1), None);
    assert!(!c.contains_key(&1));
    // The expired entry was removed when read.
    assert_eq!(c.entry_count(), 0);
    assert_eq!(c.stats().expirations, 1);
}

#[test]
fn per_entry_ttl_overrides_the_cache_ttl() {
    let (c, clock) = ttl_cache(10, Duration::from_secs(10));
    c.insert_with_ttl(1, 1, Duration::from_secs(1));
    c.insert_with_ttl(2, 2, Duration::from_secs(100));
    c.insert(3, 3);
    clock.advance(Duration::from_secs(1));
    assert_eq!(c.get(&1), None);
    clock.advance(Duration::from_secs(50));
    assert_eq!(c.get(&2), Some(2));
    assert_eq!(c.get(&3), None);
}

/// A cache built without expiry reads no entry's expiry on a hit until some write gives one:
/// from then on, every read looks.
#[test]
fn a_per_entry_ttl_in_a_cache_without_one_expires() {
    let clock = ManualClock::new();
    let c: Cache<u64, u64> = Cache::builder()
        .max_capacity(10)
        .clock(clock.clone())
        .build()
        .unwrap();
    c.insert(1, 1);
    assert_eq!(c.get(&1), Some(1));
    c.insert_with_ttl(2, 2, Duration::from_secs(1));
    clock.advance(Duration::from_secs(1));
    assert_eq!(c.get(&2), None, "expired after its own TTL");
    assert_eq!(c.pin().get(&2), None);
    assert_eq!(c.get(&1), Some(1), "an entry without a TTL never expires");
    c.insert_with_ttl(1, 3, Duration::from_secs(5));
    clock.advance(Duration::from_secs(5));
    assert_eq!(c.get(&1), None);
}

#[test]
fn zero_and_huge_per_entry_ttls_do_not_panic() {
    let (c, clock) = ttl_cache(10, Duration::from_secs(10));
    c.insert_with_ttl(1, 1, Duration::ZERO);
    assert_eq!(c.get(&1), None);
    c.insert_with_ttl(2, 2, Duration::MAX);
    // A TTL past the clock's range lasts until the clock's end (584 years of nanoseconds).
    clock.advance(Duration::from_secs(500 * 365 * 86_400));
    assert_eq!(c.get(&2), Some(2));
}

#[test]
fn reinserting_an_expired_key_revives_it() {
    let (c, clock) = ttl_cache(10, Duration::from_secs(1));
    c.insert(1, 1);
    clock.advance(Duration::from_secs(2));
    c.insert(1, 2);
    assert_eq!(c.get(&1), Some(2));
}

#[test]
fn invalidate_of_an_expired_entry_returns_false() {
    let (c, clock) = ttl_cache(10, Duration::from_secs(1));
    c.insert(1, 1);
    clock.advance(Duration::from_secs(1));
    assert!(!c.invalidate(&1));
    assert_eq!(c.entry_count(), 0);
}

#[test]
fn single_thread_never_exceeds_capacity() {
    for cap in [1u64, 2, 7, 100] {
        let c = cache(cap);
        for k in 0..(cap * 20 + 50) {
            c.insert(k, k);
            assert!(
                c.entry_count() <= cap,
                "cap {cap} count {}",
                c.entry_count()
            );
        }
        assert_eq!(c.entry_count(), cap);
        let s = c.stats();
        assert_eq!(s.inserts, cap * 20 + 50);
        assert_eq!(s.evictions, cap * 20 + 50 - cap);
    }
}

#[test]
fn frequently_read_entries_survive_a_stream_of_one_off_inserts() {
    let c = cache(100);
    c.insert(u64::MAX, 0);
    for k in 0..10_000 {
        c.insert(k, k);
        assert_eq!(
            c.get(&u64::MAX),
            Some(0),
            "hot key evicted after {k} inserts"
        );
    }
}

#[test]
fn expired_entries_are_evicted_before_live_ones_within_the_lookahead() {
    // The table of a 4-entry cache is smaller than the policy's look-ahead window.
    let (c, clock) = ttl_cache(4, Duration::from_secs(100));
    for k in 0..3 {
        c.insert_with_ttl(k, k, Duration::from_secs(1));
    }
    c.insert(3, 3);
    clock.advance(Duration::from_secs(2));
    c.insert(4, 4); // over capacity: an expired entry must go, not 3
    assert_eq!(c.get(&3), Some(3));
    assert_eq!(c.get(&4), Some(4));
    assert_eq!(c.stats().expirations, 1);
}

#[test]
fn stats_count_hits_misses_inserts_and_updates() {
    let c = cache(10);
    c.insert(1, 1);
    c.insert(1, 2);
    c.get(&1);
    c.get(&1);
    c.get(&2);
    let s = c.stats();
    assert_eq!((s.hits, s.misses, s.inserts, s.updates), (2, 1, 1, 1));
    assert_eq!(s.requests(), 3);
}

#[test]
fn stats_sum_over_threads() {
    let c = cache(10);
    c.insert(1, 1);
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                for _ in 0..1000 {
                    assert_eq!(c.get(&1), Some(1));
                }
            });
        }
    });
    assert_eq!(c.stats().hits, 4000);
}

#[test]
fn a_missing_capacity_is_an_error_not_a_panic() {
    let r: Result<Cache<u8, u8>, _> = Cache::builder().build();
    assert_eq!(
        r.unwrap_err(),
        BuildError::Missing {
            setting: "max_capacity"
        }
    );
}

#[test]
fn dropping_the_cache_drops_every_value_exactly_once() {
    let drops = Arc::new(AtomicUsize::new(0));
    let made = 20_000u64;
    {
        let c: Cache<u64, common::Tracked> = Cache::builder().max_capacity(500).build().unwrap();
        for i in 0..made {
            // Replacements, evictions, invalidations and several resizes.
            c.insert(i % 2_000, common::Tracked::new(i, &drops));
            if i % 7 == 0 {
                c.invalidate(&(i % 1_000));
            }
        }
        assert!(c.entry_count() <= 500);
    }
    assert_eq!(drops.load(Ordering::Relaxed), made as usize);
}

#[test]
fn values_dropped_exactly_once_with_many_threads() {
    let drops = Arc::new(AtomicUsize::new(0));
    let per_thread = 5_000u64;
    {
        let c: Cache<u64, common::Tracked> = Cache::builder().max_capacity(256).build().unwrap();
        // Joined threads (not scoped ones): `join` returns after the thread's locals, which
        // hold its epoch handle for this cache, are destroyed.
        let threads: Vec<_> = (0..3u64)
            .map(|t| {
                let (c, drops) = (c.clone(), Arc::clone(&drops));
                std::thread::spawn(move || {
                    for i in 0..per_thread {
                        let k = (t * 7919 + i) % 1_000;
                        c.insert(k, common::Tracked::new(i, &drops));
                        let g = c.pin();
                        if let Some(v) = g.get(&((k + 1) % 1_000)) {
                            assert!(v.id < per_thread);
                        }
                        drop(g);
                        if i % 5 == 0 {
                            c.invalidate(&k);
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
    }
    assert_eq!(drops.load(Ordering::Relaxed), 3 * per_thread as usize);
}

/// A clock that counts its readings.
#[derive(Debug, Default, Clone)]
struct CountingClock {
    time: ManualClock,
    reads: Arc<AtomicUsize>,
}

impl herdcache::Clock for CountingClock {
    fn now(&self) -> Duration {
        self.reads.fetch_add(1, Ordering::Relaxed);
        herdcache::Clock::now(&self.time)
    }
}

#[test]
fn a_write_reads_the_clock_at_most_once_and_never_when_nothing_expires() {
    const CAP: u64 = 100;
    const WRITES: u64 = 1_000;
    // Every setting that needs the time on a write: an expiry, a refresh plan, victims with
    // expiries to look at, and the sweep that expiring entries start.
    let clock = CountingClock::default();
    let timed: Cache<u64, u64> = Cache::builder()
        .max_capacity(CAP)
        .time_to_live(Duration::from_secs(3600))
        .refresh_after(Duration::from_secs(1800))
        .clock(clock.clone())
        .build()
        .unwrap();
    for k in 0..CAP {
        timed.insert(k, k);
    }
    let before = clock.reads.load(Ordering::Relaxed);
    // New keys (each evicts one), then rewrites of resident ones.
    for k in CAP..CAP + WRITES {
        timed.insert(k, k);
        timed.insert(k, k + 1);
    }
    let reads = clock.reads.load(Ordering::Relaxed) - before;
    assert!(
        reads <= 2 * WRITES as usize,
        "{reads} clock reads for {} writes",
        2 * WRITES
    );

    let clock = CountingClock::default();
    let plain: Cache<u64, u64> = Cache::builder()
        .max_capacity(CAP)
        .clock(clock.clone())
        .build()
        .unwrap();
    for k in 0..CAP + WRITES {
        plain.insert(k, k);
    }
    assert_eq!(
        clock.reads.load(Ordering::Relaxed),
        0,
        "no entry can expire"
    );
}

#[test]
fn an_eviction_made_after_a_listener_ran_judges_expiry_by_the_time_after_it() {
    // A full cache (100 entries weighing 1); rewriting one of them heavier evicts another.
    // The listener hears the old value replaced first, and takes 11 s (a manual clock moved
    // on), past every entry's time to live: the victim leaves as expired, not for size.
    let clock = ManualClock::new();
    let causes = Arc::new(std::sync::Mutex::new(Vec::new()));
    let (heard, moved) = (Arc::clone(&causes), clock.clone());
    let c: Cache<u32, u32> = Cache::builder()
        .max_capacity(100)
        .time_to_live(Duration::from_secs(10))
        .weigher(|_k: &u32, v: &u32| u64::from(*v))
        .clock(clock.clone())
        .eviction_listener(move |_k: &u32, _v: &u32, cause| {
            if cause == herdcache::RemovalCause::Replaced {
                moved.advance(Duration::from_secs(11));
            }
            heard.lock().unwrap().push(cause);
        })
        .build()
        .unwrap();
    for k in 0..100 {
        c.insert(k, 1);
    }
    assert!(
        causes.lock().unwrap().is_empty(),
        "the fill evicted nothing"
    );
    c.insert(0, 2);
    use herdcache::RemovalCause::{Expired, Replaced};
    assert_eq!(*causes.lock().unwrap(), [Replaced, Expired]);
}

#[test]
fn a_loaded_value_idles_from_when_it_is_written_not_from_when_its_load_returned() {
    // The weigher runs between the load's return and the write, and here it takes 2 s of a
    // 1 s time to idle: the value written must still be fresh for the next read.
    let clock = ManualClock::new();
    let slow = clock.clone();
    let c: Cache<u32, u32> = Cache::builder()
        .max_capacity(10)
        .time_to_idle(Duration::from_secs(1))
        .weigher(move |_k: &u32, _v: &u32| {
            slow.advance(Duration::from_secs(2));
            1
        })
        .clock(clock.clone())
        .build()
        .unwrap();
    assert_eq!(c.get_with(&1, |_| 10), 10);
    assert_eq!(
        c.get(&1),
        Some(10),
        "the value idled out before anyone could read it"
    );
}
