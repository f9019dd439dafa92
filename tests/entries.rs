//! The cache as a collection: `iter`, `retain`, `peek`, `remove` and `weighted_size` as a
//! user walking, filtering or inspecting it relies on them. (Their agreement with a
//! reference model over random operation sequences is in model.rs.)

use std::collections::HashSet;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use herdcache::{Cache, ManualClock, RemovalCause};

type Heard = Arc<Mutex<Vec<(u32, u32, RemovalCause)>>>;

fn listened(cap: u64) -> (Cache<u32, u32>, Heard) {
    let heard: Heard = Arc::default();
    let h = Arc::clone(&heard);
    let cache = Cache::builder()
        .max_capacity(cap)
        .eviction_listener(move |k: &u32, v: &u32, cause| h.lock().unwrap().push((*k, *v, cause)))
        .build()
        .unwrap();
    (cache, heard)
}

#[test]
fn remove_returns_the_value_and_tells_the_listener() {
    let (cache, heard) = listened(10);
    cache.insert(1, 10);
    assert_eq!(cache.remove(&1), Some(10));
    assert_eq!(cache.get(&1), None);
    assert_eq!(cache.remove(&1), None, "a second remove finds nothing");
    assert_eq!(*heard.lock().unwrap(), [(1, 10, RemovalCause::Invalidated)]);
    assert_eq!(cache.stats().invalidations, 1);
    assert_eq!(cache.weighted_size(), 0);
}

#[test]
fn remove_of_an_expired_entry_drops_it_and_returns_nothing() {
    let clock = ManualClock::new();
    let cache: Cache<u32, u32> = Cache::builder()
        .max_capacity(10)
        .time_to_live(Duration::from_secs(1))
        .clock(clock.clone())
        .build()
        .unwrap();
    cache.insert(1, 10);
    clock.advance(Duration::from_secs(2));
    assert_eq!(cache.remove(&1), None);
    assert_eq!(cache.entry_count(), 0, "the expired entry stayed");
}

#[test]
fn peek_neither_counts_nor_removes_but_never_returns_an_expired_value() {
    let clock = ManualClock::new();
    let cache: Cache<String, u32> = Cache::builder()
        .max_capacity(10)
        .time_to_live(Duration::from_secs(1))
        .clock(clock.clone())
        .build()
        .unwrap();
    cache.insert("k".to_owned(), 7);
    assert_eq!(cache.peek("k"), Some(7), "lookups by &str");
    assert_eq!(cache.peek("other"), None);
    clock.advance(Duration::from_secs(2));
    assert_eq!(cache.peek("k"), None);
    assert_eq!(cache.stats().requests(), 0, "peek counted a lookup");
    assert_eq!(cache.entry_count(), 1, "peek removed the expired entry");
}

#[test]
fn iter_skips_expired_values() {
    let clock = ManualClock::new();
    let cache: Cache<u32, u32> = Cache::builder()
        .max_capacity(10)
        .clock(clock.clone())
        .build()
        .unwrap();
    cache.insert(1, 1);
    cache.insert_with_ttl(2, 2, Duration::from_secs(1));
    clock.advance(Duration::from_secs(2));
    let seen: Vec<_> = cache.pin().iter().map(|(k, v)| (*k, *v)).collect();
    assert_eq!(seen, [(1, 1)]);
}

#[test]
fn retain_removes_what_it_rejects_and_tells_the_listener() {
    let (cache, heard) = listened(100);
    for i in 0..10 {
        cache.insert(i, i * 10);
    }
    cache.retain(|k, _| k % 3 != 0);
    let mut left: Vec<_> = cache.pin().iter().map(|(k, _)| *k).collect();
    left.sort_unstable();
    assert_eq!(left, [1, 2, 4, 5, 7, 8]);
    let mut gone = heard.lock().unwrap().clone();
    gone.sort_unstable_by_key(|g| g.0);
    assert_eq!(
        gone,
        [0, 3, 6, 9].map(|k| (k, k * 10, RemovalCause::Invalidated))
    );
    assert_eq!(cache.weighted_size(), 6);
}

#[test]
fn retain_may_use_the_cache_from_its_predicate() {
    let cache: Cache<u32, u32> = Cache::builder().max_capacity(100).build().unwrap();
    for i in 0..20 {
        cache.insert(i, i);
    }
    // Reads and writes from inside the predicate: no lock is held while it runs.
    // (The walk may or may not reach the keys written during it; it keeps them.)
    cache.retain(|k, _| {
        let _ = cache.get(&(k + 1));
        if *k >= 1_000 {
            return true;
        }
        cache.insert(1_000 + k, 0);
        k % 2 == 0
    });
    assert_eq!(cache.get(&2), Some(2));
    assert_eq!(cache.get(&3), None);
    assert_eq!(cache.get(&1_003), Some(0));
}

#[test]
fn a_panicking_retain_predicate_keeps_what_it_removed_removed() {
    let (cache, heard) = listened(100);
    for i in 0..50 {
        cache.insert(i, i);
    }
    let calls = std::cell::Cell::new(0);
    let r = catch_unwind(AssertUnwindSafe(|| {
        cache.retain(|_, _| {
            calls.set(calls.get() + 1);
            assert!(calls.get() < 20, "user code: predicate panics");
            false
        })
    }));
    assert!(r.is_err());
    let removed = heard.lock().unwrap().len();
    assert_eq!(
        removed, 19,
        "each rejected entry before the panic was removed"
    );
    assert_eq!(cache.entry_count(), 31);
    assert_eq!(
        cache.weighted_size(),
        31,
        "the policy lost track of a removal"
    );
    cache.retain(|_, _| false);
    assert_eq!(cache.entry_count(), 0);
}

#[test]
fn weighted_size_is_the_sum_of_the_weights_and_stays_within_the_capacity() {
    let cache: Cache<u32, Vec<u8>> = Cache::builder()
        .max_capacity(1_000)
        .weigher(|_, v: &Vec<u8>| v.len() as u64)
        .build()
        .unwrap();
    cache.insert(1, vec![0; 300]);
    cache.insert(2, vec![0; 200]);
    assert_eq!(cache.weighted_size(), 500);
    cache.insert(1, vec![0; 100]);
    assert_eq!(
        cache.weighted_size(),
        300,
        "a replaced value's weight stayed"
    );
    for i in 10..40 {
        cache.insert(i, vec![0; 90]);
        assert!(cache.weighted_size() <= 1_000, "{}", cache.weighted_size());
    }
}

#[test]
fn iter_yields_each_stable_entry_once_while_others_churn() {
    // Keys 0..500 stay; another thread inserts and removes keys above them meanwhile, growing
    // the table through migrations (at most 60,000 keys: nothing is evicted).
    let cache: Cache<u32, u32> = Cache::builder().max_capacity(100_000).build().unwrap();
    for k in 0..500 {
        cache.insert(k, k);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (cache, stop) = (cache.clone(), Arc::clone(&stop));
        thread::spawn(move || {
            let mut k = 1_000;
            while !stop.load(Ordering::Relaxed) && k < 60_000 {
                cache.insert(k, k);
                if k % 3 == 0 {
                    cache.invalidate(&(k - 1));
                }
                k += 1;
            }
        })
    };
    for round in 0..20 {
        let guard = cache.pin();
        let mut stable = HashSet::new();
        for (k, v) in guard.iter() {
            assert_eq!(k, v, "key {k} yielded with another key's value");
            if *k < 500 {
                assert!(stable.insert(*k), "round {round}: key {k} yielded twice");
            }
        }
        assert_eq!(stable.len(), 500, "round {round}: stable keys missed");
    }
    stop.store(true, Ordering::Relaxed);
    writer.join().unwrap();
}

/// A cache of `cap` entries holding keys 0..1000, where keys below 10 are read often, keys
/// 10..100 once, and the rest never.
fn read_skewed(cap: u64) -> Cache<u32, u32> {
    let cache: Cache<u32, u32> = Cache::builder().max_capacity(cap).build().unwrap();
    for k in 0..1_000 {
        cache.insert(k, k);
    }
    for round in 0..20 {
        for k in 0..10 {
            cache.get(&k);
        }
        if round == 0 {
            for k in 10..100 {
                cache.get(&k);
            }
        }
    }
    cache
}

#[test]
fn hottest_and_coldest_follow_how_often_keys_are_read() {
    // One policy shard, and several (a capacity of 100,000 splits the policy).
    for cap in [2_000, 100_000] {
        let cache = read_skewed(cap);
        let mut hot = cache.hottest(10);
        hot.sort_unstable();
        assert_eq!(hot, (0..10).collect::<Vec<_>>(), "capacity {cap}");
        let cold = cache.coldest(500);
        assert_eq!(cold.len(), 500);
        assert!(cold.iter().all(|k| *k >= 100), "capacity {cap}: {cold:?}");
        assert_eq!(
            cache.hottest(5_000).len(),
            1_000,
            "more than held: all of them"
        );
        assert!(cache.hottest(0).is_empty());
    }
}

#[test]
fn a_recorded_hot_set_warms_a_new_cache() {
    let before = read_skewed(2_000);
    let recorded = before.hottest(50);
    let after: Cache<u32, u32> = Cache::builder().max_capacity(2_000).build().unwrap();
    let report = after.warm(recorded.clone(), |k| Ok::<_, ()>(*k), 2);
    assert_eq!(report.loaded, 50);
    assert!(recorded.iter().all(|k| after.peek(k) == Some(*k)));
    assert!(
        (0..10).all(|k| after.peek(&k).is_some()),
        "a hot key was not recorded"
    );
}

#[test]
fn hottest_skips_removed_and_expired_entries() {
    let clock = ManualClock::new();
    let cache: Cache<u32, u32> = Cache::builder()
        .max_capacity(100)
        .clock(clock.clone())
        .build()
        .unwrap();
    cache.insert(1, 1);
    cache.insert_with_ttl(2, 2, Duration::from_secs(1));
    cache.insert(3, 3);
    cache.invalidate(&3);
    clock.advance(Duration::from_secs(2));
    assert_eq!(cache.hottest(10), [1]);
    assert_eq!(cache.coldest(10), [1]);
}

/// The capacity changes while the cache runs: shrinking evicts at once what no longer fits
/// (told to the listener), growing takes more; bad capacities are errors that change
/// nothing.
#[test]
fn set_capacity_shrinks_and_grows_a_running_cache() {
    use herdcache::RemovalCause;
    use std::sync::{Arc, Mutex};
    let heard: Arc<Mutex<Vec<RemovalCause>>> = Arc::default();
    let log = Arc::clone(&heard);
    let c: Cache<u32, u32> = Cache::builder()
        .max_capacity(100)
        .eviction_listener(move |_: &u32, _: &u32, cause| log.lock().unwrap().push(cause))
        .build()
        .unwrap();
    for k in 0..100 {
        c.insert(k, k);
    }
    assert_eq!(c.entry_count(), 100);
    c.set_capacity(10).unwrap();
    assert_eq!((c.max_capacity(), c.policy().max_capacity), (10, 10));
    assert!(
        c.entry_count() <= 10 && c.weighted_size() <= 10,
        "{}",
        c.entry_count()
    );
    assert_eq!(heard.lock().unwrap().len(), 90);
    assert!(heard
        .lock()
        .unwrap()
        .iter()
        .all(|c| *c == RemovalCause::Size));
    // The new bound holds for later writes, and a fresh write is still read back.
    for k in 100..200 {
        c.insert(k, k);
        assert_eq!(c.get(&k), Some(k));
    }
    assert!(c.entry_count() <= 10);
    c.set_capacity(1_000).unwrap();
    for k in 1_000..1_500 {
        c.insert(k, k);
    }
    assert_eq!(c.entry_count(), 510, "room for all");
    assert!(c.set_capacity(0).is_err());
    assert!(c.set_capacity(u64::MAX).is_err());
    assert_eq!(
        c.max_capacity(),
        1_000,
        "an invalid capacity changes nothing"
    );
}

#[test]
fn policy_reports_the_settings_and_iter_clones_every_live_entry() {
    use std::time::Duration;
    let c: Cache<u32, String> = Cache::builder()
        .max_capacity(100)
        .time_to_live(Duration::from_secs(60))
        .time_to_idle(Duration::from_secs(30))
        .refresh_after(Duration::from_secs(20))
        .load_timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    let p = c.policy();
    assert_eq!(p.max_capacity, 100);
    assert!(!p.weighted);
    assert_eq!(p.time_to_live, Some(Duration::from_secs(60)));
    assert_eq!(p.time_to_idle, Some(Duration::from_secs(30)));
    assert_eq!(p.refresh_after, Some(Duration::from_secs(20)));
    assert_eq!(p.load_timeout, Some(Duration::from_secs(2)));
    assert_eq!(
        (p.xfetch_beta, p.negative_ttl, p.max_concurrent_loads),
        (None, None, None)
    );
    for k in 0..10 {
        c.insert(k, k.to_string());
    }
    let mut all: Vec<(u32, String)> = c.iter().collect();
    all.sort();
    assert_eq!(all, (0..10).map(|k| (k, k.to_string())).collect::<Vec<_>>());
}

#[test]
fn set_capacity_keeps_the_bound_of_a_sharded_cache() {
    let c: Cache<u64, u64> = Cache::builder().max_capacity(100_000).build().unwrap();
    for k in 0..100_000 {
        c.insert(k, k);
    }
    c.set_capacity(40_000).unwrap();
    assert!(c.entry_count() <= 40_000, "{}", c.entry_count());
    for k in 100_000..150_000 {
        c.insert(k, k);
    }
    assert!(c.entry_count() <= 40_000, "{}", c.entry_count());
    assert!(
        c.set_capacity(1).is_err(),
        "fewer entries than the policy's shards"
    );
}
