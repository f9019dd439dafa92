//! Eviction with a weigher and an eviction listener: the cache stays within its capacity (in
//! entries or weight), and every value that leaves it is reported exactly once, with the
//! right cause.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use herdcache::{Cache, ManualClock, RemovalCause};
use proptest::prelude::*;

type Log = Arc<Mutex<Vec<(u32, u64, RemovalCause)>>>;

/// A cache of `u32 -> u64` whose listener appends to the returned log.
fn logged(capacity: u64, clock: &ManualClock) -> (Cache<u32, u64>, Log) {
    let log: Log = Arc::default();
    let seen = log.clone();
    let cache = Cache::builder()
        .max_capacity(capacity)
        .time_to_live(Duration::from_secs(60))
        .clock(clock.clone())
        .eviction_listener(move |k: &u32, v: &u64, cause| {
            seen.lock().unwrap().push((*k, *v, cause))
        })
        .build()
        .unwrap();
    (cache, log)
}

fn causes(log: &Log) -> Vec<(u32, u64, RemovalCause)> {
    log.lock().unwrap().clone()
}

#[test]
fn each_cause_is_reported_for_the_value_that_left() {
    let clock = ManualClock::new();
    let (c, log) = logged(100, &clock);
    c.insert(1, 10);
    c.insert(1, 11);
    c.insert(2, 20);
    assert!(c.invalidate(&2));
    c.insert_with_ttl(3, 30, Duration::from_secs(1));
    clock.advance(Duration::from_secs(2));
    assert_eq!(c.get(&3), None);
    assert_eq!(
        causes(&log),
        [
            (1, 10, RemovalCause::Replaced),
            (2, 20, RemovalCause::Invalidated),
            (3, 30, RemovalCause::Expired),
        ]
    );
    c.invalidate_all();
    assert_eq!(causes(&log)[3], (1, 11, RemovalCause::Invalidated));
    assert_eq!(causes(&log).len(), 4);
}

#[test]
fn a_load_replacing_an_expired_value_reports_it_expired() {
    let clock = ManualClock::new();
    let (c, log) = logged(100, &clock);
    c.insert_with_ttl(1, 10, Duration::from_secs(1));
    clock.advance(Duration::from_secs(2));
    assert_eq!(c.get_or_load(&1, |_| Ok::<_, ()>(11)), Ok(11));
    assert_eq!(causes(&log), [(1, 10, RemovalCause::Expired)]);
}

#[test]
fn evictions_for_size_are_reported_and_keep_the_count_bounded() {
    let clock = ManualClock::new();
    let (c, log) = logged(50, &clock);
    for k in 0..1_000u32 {
        c.insert(k, u64::from(k));
        assert!(c.entry_count() <= 50);
    }
    let log = causes(&log);
    assert!(log.iter().all(|e| e.2 == RemovalCause::Size));
    let reported: HashSet<u32> = log.iter().map(|e| e.0).collect();
    assert_eq!(reported.len(), log.len(), "no value reported twice");
    let present = (0..1_000u32).filter(|k| c.get(k).is_some()).count();
    assert_eq!(
        present + log.len(),
        1_000,
        "every value is present or reported"
    );
    assert_eq!(c.stats().evictions, log.len() as u64);
}

/// A cache large enough to split its policy into shards keeps every promise of one that
/// does not: within its capacity, every value present or reported once, the newest write
/// readable, and frequently read keys kept.
#[test]
#[cfg_attr(miri, ignore = "a hundred thousand inserts, no unsafe code of its own")]
fn a_sharded_cache_keeps_the_bound_and_reports_every_eviction() {
    const CAP: u64 = 40_000;
    let clock = ManualClock::new();
    let (c, log) = logged(CAP, &clock);
    for k in 0..100 {
        c.insert(k, u64::from(k));
    }
    for k in 100..100_000u32 {
        c.insert(k, u64::from(k));
        assert_eq!(
            c.get(&k),
            Some(u64::from(k)),
            "the newest write {k} is readable"
        );
        c.get(&(k % 100));
        if k % 997 == 0 {
            assert!(c.entry_count() <= CAP, "{} entries", c.entry_count());
        }
    }
    assert!(c.entry_count() <= CAP);
    assert!(
        c.entry_count() >= CAP * 99 / 100,
        "the shards hold nearly the whole capacity: {}",
        c.entry_count()
    );
    let log = causes(&log);
    let reported: HashSet<u32> = log.iter().map(|e| e.0).collect();
    assert_eq!(reported.len(), log.len(), "no value reported twice");
    let present = (0..100_000u32).filter(|k| c.get(k).is_some()).count();
    assert_eq!(
        present + log.len(),
        100_000,
        "every value is present or reported"
    );
    let hot = (0..100).filter(|k| c.get(k).is_some()).count();
    assert!(hot >= 95, "{hot} of 100 frequently read keys kept");
}

#[test]
fn frequently_read_keys_survive_a_stream_of_one_off_inserts() {
    let c: Cache<u32, u32> = Cache::builder().max_capacity(100).build().unwrap();
    for k in 0..50 {
        c.insert(k, k);
    }
    for (i, k) in (1_000..21_000u32).enumerate() {
        c.insert(k, k);
        c.get(&(i as u32 % 50));
    }
    let survivors = (0..50).filter(|k| c.get(k).is_some()).count();
    assert!(survivors >= 45, "{survivors} of 50 read keys survived");
}

#[test]
fn a_weigher_bounds_the_total_weight() {
    let log: Arc<Mutex<Vec<(u32, RemovalCause)>>> = Arc::default();
    let seen = log.clone();
    let c: Cache<u32, String> = Cache::builder()
        .max_capacity(1_000)
        .weigher(|_, v: &String| v.len() as u64)
        .eviction_listener(move |k: &u32, _: &String, cause| seen.lock().unwrap().push((*k, cause)))
        .build()
        .unwrap();
    let mut live: HashMap<u32, usize> = HashMap::new();
    for k in 0..500u32 {
        let len = (k as usize * 37) % 200;
        c.insert(k, "x".repeat(len));
        live.insert(k, len);
        for (gone, _) in log.lock().unwrap().drain(..) {
            live.remove(&gone);
        }
        let total: usize = live.values().sum();
        assert!(total <= 1_000, "total weight {total} over the capacity");
    }
    // The weights are real: far fewer than 500 entries fit in 1,000 bytes.
    assert!(c.entry_count() < 20);
}

/// A weighted cache fills to its capacity exactly: nothing is evicted while the entries,
/// the new one included, weigh at most `max_capacity`. (A cache of 1 MiB used to hold 15
/// entries of 65,535 bytes, evicting the first for size as the 16th came, though the 16
/// weigh 1,048,560 bytes: the main space's share was too small for it, and the window's
/// unused.) Weights are `u64`: entries of several GiB count as they weigh.
#[test]
fn a_weighted_cache_fills_to_its_capacity_exactly() {
    let log: Arc<Mutex<Vec<(u32, RemovalCause)>>> = Arc::default();
    let seen = log.clone();
    let c: Cache<u32, u64> = Cache::builder()
        .max_capacity(1 << 20)
        .weigher(|_, v: &u64| *v)
        .eviction_listener(move |k: &u32, _: &u64, cause| seen.lock().unwrap().push((*k, cause)))
        .build()
        .unwrap();
    for k in 0..16 {
        c.insert(k, 65_535);
    }
    assert_eq!(*log.lock().unwrap(), [], "evicted below the capacity");
    assert_eq!((c.entry_count(), c.weighted_size()), (16, 16 * 65_535));
    c.insert(16, 65_535);
    assert_eq!(log.lock().unwrap().len(), 1, "over the capacity: one goes");
    assert!(c.weighted_size() <= 1 << 20);

    // Weights beyond u32: two entries of 5 GiB in a cache of 10 GiB, and no third.
    const GIB: u64 = 1 << 30;
    let big: Cache<u32, u64> = Cache::builder()
        .max_capacity(10 * GIB)
        .weigher(|_, v: &u64| *v)
        .build()
        .unwrap();
    big.insert(1, 5 * GIB);
    big.insert(2, 5 * GIB);
    assert_eq!((big.entry_count(), big.weighted_size()), (2, 10 * GIB));
    big.insert(3, 5 * GIB);
    assert_eq!(big.weighted_size(), 10 * GIB, "one of three went");
}

/// With a weigher, `initial_capacity` counts entries and `max_capacity` weighs them: they do
/// not compare, so quick_cache's mapping (`with_weighter(items, weight, ..)`) builds.
#[test]
fn a_weighted_cache_takes_an_initial_capacity_above_its_weight() {
    let c: Cache<u32, Vec<u8>> = Cache::builder()
        .initial_capacity(1_000)
        .max_capacity(500)
        .weigher(|_, v: &Vec<u8>| v.len() as u64)
        .build()
        .expect("a count of entries and a weight do not compare");
    c.insert(1, vec![0; 400]);
    assert_eq!(c.weighted_size(), 400);
}

#[test]
fn a_value_heavier_than_the_capacity_is_evicted_at_once() {
    let log: Arc<Mutex<Vec<(u32, RemovalCause)>>> = Arc::default();
    let seen = log.clone();
    let c: Cache<u32, Vec<u8>> = Cache::builder()
        .max_capacity(100)
        .weigher(|_, v: &Vec<u8>| v.len() as u64)
        .eviction_listener(move |k: &u32, _: &Vec<u8>, cause| {
            seen.lock().unwrap().push((*k, cause))
        })
        .build()
        .unwrap();
    c.insert(1, vec![0; 10]);
    c.insert(2, vec![0; 101]);
    assert_eq!(c.get(&2), None);
    assert_eq!(c.get(&1).map(|v| v.len()), Some(10));
    assert_eq!(*log.lock().unwrap(), [(2, RemovalCause::Oversized)]);
}

#[test]
fn a_panicking_listener_leaves_the_cache_consistent() {
    let c: Cache<u32, u32> = Cache::builder()
        .max_capacity(2)
        .eviction_listener(|_, _, _| panic!("listener bug"))
        .build()
        .unwrap();
    for k in 0..10 {
        c.insert(k, k);
    }
    assert!(c.entry_count() <= 2);
    c.insert(100, 1);
    c.invalidate(&100);
    assert_eq!(c.get(&100), None);
}

#[derive(Debug, Clone)]
enum Op {
    Insert(u8, u8),
    Get(u8),
    Invalidate(u8),
    Advance(u8),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..40u8, 0..30u8).prop_map(|(k, w)| Op::Insert(k, w)),
        4 => (0..40u8).prop_map(Op::Get),
        1 => (0..40u8).prop_map(Op::Invalidate),
        1 => (0..200u8).prop_map(Op::Advance),
    ]
}

proptest! {
    /// Against a simple reference of which values were written: at every step the values
    /// present weigh at most the capacity, a value once reported is never read again, and at
    /// the end every written value is either present or was reported exactly once.
    #[test]
    fn weights_and_reports_match_a_reference(ops in prop::collection::vec(op(), 1..300)) {
        let clock = ManualClock::new();
        let log: Arc<Mutex<Vec<(u8, u64, RemovalCause)>>> = Arc::default();
        let seen = log.clone();
        let c: Cache<u8, u64> = Cache::builder()
            .max_capacity(100)
            .time_to_live(Duration::from_millis(500))
            .clock(clock.clone())
            // A value's weight rides in its low byte; its id (unique) above.
            .weigher(|_, v: &u64| *v & 0xff)
            .eviction_listener(move |k: &u8, v: &u64, cause| seen.lock().unwrap().push((*k, *v, cause)))
            .build()
            .unwrap();
        let mut written: HashMap<u64, u8> = HashMap::new(); // value -> key
        let mut reported: HashSet<u64> = HashSet::new();
        let mut next_id = 1u64;
        for op in ops {
            match op {
                Op::Insert(k, w) => {
                    let v = (next_id << 8) | u64::from(w);
                    next_id += 1;
                    c.insert(k, v);
                    written.insert(v, k);
                }
                Op::Get(k) => {
                    if let Some(v) = c.get(&k) {
                        prop_assert!(!reported.contains(&v), "read a value after it was reported");
                        prop_assert_eq!(written.get(&v), Some(&k));
                    }
                }
                Op::Invalidate(k) => {
                    c.invalidate(&k);
                }
                Op::Advance(ms) => clock.advance(Duration::from_millis(ms.into())),
            }
            for (k, v, _) in log.lock().unwrap().drain(..) {
                prop_assert!(reported.insert(v), "value reported twice");
                prop_assert_eq!(written.get(&v), Some(&k));
            }
            // The values still held (live or expired but not yet removed) weigh at most the
            // capacity.
            let held: u64 = written
                .keys()
                .filter(|v| !reported.contains(v))
                .map(|v| v & 0xff)
                .sum();
            prop_assert!(held <= 100, "held weight {} over the capacity", held);
        }
    }
}
