//! loom models of the policy's succession (`policy/tinylfu.rs`): writes, removals and
//! evictions of a key report to the policy after their table write, in any order the
//! interleavings allow, and the policy must still track exactly what the table holds, one
//! record per key, with no record left on a node that left the table.
#![cfg(herdcache_loom)]

mod common;

use herdcache::Cache;
use loom::thread;

use common::{cache, model, Fixed};

type C = Cache<u64, u64, Fixed>;

/// What the policy tracks is what the table holds (nothing is being written now), and a
/// later write of the key is tracked and readable.
fn settled(c: &C, key: u64) {
    assert_eq!(
        c.weighted_size(),
        c.entry_count(),
        "the policy weighs exactly the entries the table holds"
    );
    c.insert(key, 99);
    assert_eq!(c.get(&key), Some(99));
    assert_eq!(c.weighted_size(), c.entry_count());
}

/// Two writes of one key: the one that wrote the table second may report first; the key
/// ends with one record, on the node the table holds.
#[test]
fn racing_writes_of_a_key_leave_it_one_record() {
    model(|| {
        let c: C = cache();
        c.insert(1, 0);
        let other = c.clone();
        let a = thread::spawn(move || other.insert(1, 1));
        c.insert(1, 2);
        a.join().unwrap();
        assert_eq!(c.entry_count(), 1);
        settled(&c, 1);
    });
}

/// A write races an invalidation of its key: the removal may report before the write whose
/// node it took out, which then must not keep the record it inherited.
#[test]
fn a_removal_that_reports_before_the_write_it_removed_leaves_no_record() {
    model(|| {
        let c: C = cache();
        c.insert(1, 0);
        let other = c.clone();
        let a = thread::spawn(move || other.insert(1, 1));
        c.invalidate(&1);
        a.join().unwrap();
        settled(&c, 1);
    });
}

/// In a cache of one entry, writes of two keys evict each other: an eviction may take a
/// record whose node a write of its key has just replaced, and that write then reports as a
/// new key.
#[test]
fn writes_that_evict_each_other_stay_within_capacity() {
    model(|| {
        let c: C = Cache::builder()
            .max_capacity(1)
            .hasher(Fixed::default())
            .build()
            .unwrap();
        c.insert(1, 0);
        let other = c.clone();
        let a = thread::spawn(move || other.insert(2, 2));
        c.insert(1, 1);
        a.join().unwrap();
        assert!(c.entry_count() <= 1, "{} entries", c.entry_count());
        settled(&c, 3);
        assert_eq!(c.entry_count(), 1);
    });
}

/// Two writes and an invalidation of one key, all at once: every order of their three
/// reports leaves the key with one record if the table holds it, and none if not.
#[test]
fn two_writes_and_a_removal_of_a_key_leave_what_the_table_holds() {
    model(|| {
        let c: C = cache();
        c.insert(1, 0);
        let (x, y) = (c.clone(), c.clone());
        let a = thread::spawn(move || x.insert(1, 1));
        let b = thread::spawn(move || y.insert(1, 2));
        c.invalidate(&1);
        a.join().unwrap();
        b.join().unwrap();
        settled(&c, 1);
    });
}
