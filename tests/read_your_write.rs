//! Read-your-write (DESIGN.md §10 invariant 6): a value just written, by `insert` or by a
//! load, is never the victim of the admission it triggers. The next read finds it, whatever
//! the capacity and whatever the entries around it have been through.

use std::cell::Cell;
use std::sync::{Arc, Mutex};

use herdcache::{Cache, RemovalCause};

const CAPACITIES: [u64; 6] = [1, 2, 10, 50, 1_000, 100_000];
const PAIRS: u64 = 10_000;

/// A cache of `capacity` holding keys `0..capacity`, each read three times when `reads`
/// (so the window and the main space are full of entries with second chances to give).
fn filled(capacity: u64, reads: bool) -> Cache<u64, u64> {
    let cache = Cache::builder().max_capacity(capacity).build().unwrap();
    for k in 0..capacity {
        cache.insert(k, k);
    }
    if reads {
        for _ in 0..3 {
            for k in 0..capacity {
                let _ = cache.get(&k);
            }
        }
    }
    cache
}

/// Reads a few keys written before `fresh`, so that entries keep being hit between writes.
fn read_around(cache: &Cache<u64, u64>, fresh: u64) {
    for back in [1, 2, 3, 7] {
        let _ = cache.get(&fresh.saturating_sub(back));
    }
}

#[test]
fn a_fresh_insert_is_readable_at_once_at_every_capacity() {
    for capacity in CAPACITIES {
        for reads in [false, true] {
            let cache = filled(capacity, reads);
            let mut misses = 0;
            for i in 0..PAIRS {
                let fresh = 1_000_000 + i;
                cache.insert(fresh, i);
                if cache.get(&fresh) != Some(i) {
                    misses += 1;
                }
                if reads {
                    read_around(&cache, fresh);
                }
            }
            assert_eq!(
                misses, 0,
                "capacity {capacity}, reads {reads}: fresh inserts missed at once"
            );
            assert!(cache.entry_count() <= capacity);
        }
    }
}

#[test]
fn a_loaded_value_is_not_loaded_again_by_the_next_caller() {
    for capacity in CAPACITIES {
        for reads in [false, true] {
            let cache = filled(capacity, reads);
            let loads = Cell::new(0u64);
            for i in 0..PAIRS {
                let fresh = 1_000_000 + i;
                for _ in 0..2 {
                    let v = cache.get_or_load(&fresh, |k| {
                        loads.set(loads.get() + 1);
                        Ok::<_, ()>(*k)
                    });
                    assert_eq!(v, Ok(fresh));
                }
                if reads {
                    read_around(&cache, fresh);
                }
            }
            assert_eq!(
                loads.get(),
                PAIRS,
                "capacity {capacity}, reads {reads}: a key was loaded more than once"
            );
        }
    }
}

#[test]
fn the_listener_never_hears_of_a_write_evicted_by_itself() {
    for capacity in [1, 2, 10, 50] {
        let log: Arc<Mutex<Vec<(u64, RemovalCause)>>> = Arc::default();
        let seen = Arc::clone(&log);
        let cache: Cache<u64, u64> = Cache::builder()
            .max_capacity(capacity)
            .eviction_listener(move |k: &u64, _: &u64, cause| {
                seen.lock().unwrap().push((*k, cause))
            })
            .build()
            .unwrap();
        for k in 0..capacity {
            cache.insert(k, k);
            let _ = cache.get(&k);
        }
        for fresh in capacity..capacity + 1_000 {
            let before = log.lock().unwrap().len();
            cache.insert(fresh, fresh);
            let evicted_by_this_insert = log.lock().unwrap()[before..].to_vec();
            assert!(
                !evicted_by_this_insert.iter().any(|&(k, _)| k == fresh),
                "capacity {capacity}: key {fresh} evicted by its own insert: {evicted_by_this_insert:?}"
            );
            let _ = cache.get(&(fresh - 1));
        }
    }
}

#[test]
fn only_an_entry_heavier_than_the_capacity_leaves_at_its_own_write() {
    let log: Arc<Mutex<Vec<(u64, RemovalCause)>>> = Arc::default();
    let seen = Arc::clone(&log);
    let cache: Cache<u64, u64> = Cache::builder()
        .max_capacity(100)
        .weigher(|_, v: &u64| *v)
        .eviction_listener(move |k: &u64, _: &u64, cause| seen.lock().unwrap().push((*k, cause)))
        .build()
        .unwrap();
    for k in 0..10 {
        cache.insert(k, 10);
        let _ = cache.get(&k);
    }
    // Exactly the capacity fits, alone.
    cache.insert(100, 100);
    assert_eq!(cache.get(&100), Some(100));
    // One unit more does not: it is reported as such, and the rest is untouched.
    cache.insert(101, 101);
    assert_eq!(cache.get(&101), None);
    assert_eq!(cache.get(&100), Some(100));
    assert_eq!(
        log.lock().unwrap().last(),
        Some(&(101, RemovalCause::Oversized))
    );
}
