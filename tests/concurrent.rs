//! Concurrent behaviour: capacity bounds under contention, invalidation racing reads.

use std::sync::atomic::{AtomicBool, Ordering};

use herdcache::Cache;

mod common;

const THREADS: u64 = 4;

#[test]
fn capacity_overshoot_is_bounded_by_the_inserting_threads() {
    let cap = 64;
    let c: Cache<u64, u64> = Cache::builder().max_capacity(cap).build().unwrap();
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let c = &c;
            s.spawn(move || {
                for i in 0..20_000u64 {
                    c.insert(t << 32 | i, i);
                    // Every other thread may be between its insert and its eviction.
                    assert!(c.entry_count() <= cap + THREADS, "{}", c.entry_count());
                }
            });
        }
    });
    assert!(c.entry_count() <= cap);
}

#[test]
fn invalidated_values_are_not_read_after_invalidate_returns() {
    let c: Cache<u64, u64> = Cache::builder().max_capacity(10_000).build().unwrap();
    for round in 0..200u64 {
        for k in 0..50 {
            c.insert(k, round);
        }
        let stop = AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| {
                while !stop.load(Ordering::Relaxed) {
                    for k in 0..50 {
                        if let Some(v) = c.get(&k) {
                            assert_eq!(v, round);
                        }
                    }
                }
            });
            // Stops the reader however this ends: a failed assertion too.
            let _stop = common::StopOnDrop(&stop);
            for k in 0..50 {
                assert!(c.invalidate(&k));
                assert_eq!(c.get(&k), None);
            }
        });
        assert_eq!(c.entry_count(), 0);
    }
}

#[test]
fn readers_see_only_values_written_for_their_key_during_resizes() {
    // Values encode their key: a reader that ever sees another key's value, or a torn entry,
    // fails. The table starts tiny so that writers resize it many times under the readers.
    let c: Cache<u64, (u64, u64)> = Cache::builder()
        .max_capacity(1 << 20)
        .initial_capacity(1)
        .build()
        .unwrap();
    let done = AtomicBool::new(false);
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| {
                while !done.load(Ordering::Relaxed) {
                    for k in (0..50_000u64).step_by(97) {
                        if let Some((key, _)) = c.get(&k) {
                            assert_eq!(key, k);
                        }
                    }
                }
            });
        }
        for k in 0..50_000u64 {
            c.insert(k, (k, k * 3));
        }
        done.store(true, Ordering::Relaxed);
    });
    for k in 0..50_000u64 {
        assert_eq!(c.get(&k), Some((k, k * 3)));
    }
}
