//! loom models of the table: publication, insert/remove and replace/get races, and a
//! migration racing readers and writers. Each model is about one interleaving question.
#![cfg(herdcache_loom)]

use std::sync::Arc;

use crossbeam_epoch::{Collector, LocalHandle, Owned};
use herdcache::raw::{Node, Table};
use loom::thread;

/// A value whose two halves must always agree: a reader that sees a half-written value, or
/// another key's value, notices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Pair(u64, u64);

impl Pair {
    fn of(k: u64, gen: u64) -> Self {
        Pair(k * 1000 + gen, !(k * 1000 + gen))
    }
    fn check(self, k: u64) -> u64 {
        assert_eq!(self.1, !self.0, "torn value");
        assert_eq!(self.0 / 1000, k, "another key's value");
        self.0 % 1000
    }
}

/// Spreads keys over home slots, keeping tags distinct.
fn hash(k: u64) -> u64 {
    k.wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

fn put(t: &Table<u64, Pair>, h: &LocalHandle, k: u64, gen: u64) -> Option<u64> {
    let g = h.pin();
    t.insert(
        Owned::new(Node::new(hash(k), k, Pair::of(k, gen))),
        |x| *x == k,
        t.verify(&g),
    )
    .map(|n| n.value.check(k))
}

fn get(t: &Table<u64, Pair>, h: &LocalHandle, k: u64) -> Option<u64> {
    let g = h.pin();
    t.get(hash(k), |x| *x == k, t.verify(&g))
        .map(|n| n.value.check(k))
}

fn remove(t: &Table<u64, Pair>, h: &LocalHandle, k: u64) -> Option<u64> {
    let g = h.pin();
    t.remove(hash(k), |x| *x == k, t.verify(&g))
        .map(|n| n.value.check(k))
}

/// Removes `k`'s node read at `gen` (the address a policy holds for its victim), if still
/// current; panics if `k` is not at `gen` when read.
fn remove_read(t: &Table<u64, Pair>, h: &LocalHandle, k: u64, gen: u64) -> bool {
    let g = h.pin();
    let node = t
        .get(hash(k), |x| *x == k, t.verify(&g))
        .expect("the key was written");
    assert_eq!(node.value.check(k), gen);
    t.remove_node(node, t.verify(&g))
}

fn setup() -> (Arc<Table<u64, Pair>>, Collector) {
    let c = Collector::new();
    (Arc::new(Table::with_capacity(1, &c)), c)
}

/// A reader racing the first insert of a key sees nothing or the fully written value.
#[test]
fn insert_publishes_a_fully_initialised_entry() {
    loom::model(|| {
        let (t, c) = setup();
        let h = c.register();
        let (t2, c2) = (Arc::clone(&t), c.clone());
        let writer = thread::spawn(move || put(&t2, &c2.register(), 1, 1));
        let seen = get(&t, &h, 1);
        assert!(seen.is_none() || seen == Some(1));
        assert_eq!(writer.join().unwrap(), None);
        assert_eq!(get(&t, &h, 1), Some(1));
    });
}

/// Insert and remove of one key linearise: the remove either found the insert's value (and
/// the key is then absent) or found nothing (and the key is then present).
#[test]
fn insert_and_remove_of_one_key_linearise() {
    loom::model(|| {
        let (t, c) = setup();
        let h = c.register();
        let (t2, c2) = (Arc::clone(&t), c.clone());
        let writer = thread::spawn(move || put(&t2, &c2.register(), 7, 1));
        let removed = remove(&t, &h, 7);
        writer.join().unwrap();
        match removed {
            Some(1) => assert_eq!((get(&t, &h, 7), t.len()), (None, 0)),
            None => assert_eq!((get(&t, &h, 7), t.len()), (Some(1), 1)),
            other => panic!("removed {other:?}"),
        }
    });
}

/// A reader racing a replacement sees the old or the new value, never anything else, and
/// once it has seen the new value it never sees the old one again.
#[test]
fn replace_is_atomic_for_readers() {
    loom::model(|| {
        let (t, c) = setup();
        let h = c.register();
        put(&t, &h, 3, 1);
        let (t2, c2) = (Arc::clone(&t), c.clone());
        let writer = thread::spawn(move || put(&t2, &c2.register(), 3, 2));
        let first = get(&t, &h, 3).unwrap();
        let second = get(&t, &h, 3).unwrap();
        assert!(first <= second, "saw {first} after {second}");
        assert_eq!(writer.join().unwrap(), Some(1));
        assert_eq!(get(&t, &h, 3), Some(2));
    });
}

/// Removal by address races a replacement of the same key: it removes the node it read only
/// if that node is still current, so the replacement's value is never lost, and exactly one
/// of them finds the old node.
#[test]
fn removal_by_address_never_removes_a_newer_write() {
    loom::model(|| {
        let (t, c) = setup();
        let h = c.register();
        put(&t, &h, 3, 1);
        let g = h.pin();
        let old = t
            .get(hash(3), |x| *x == 3, t.verify(&g))
            .expect("key 3 was written");
        let (t2, c2) = (Arc::clone(&t), c.clone());
        let writer = thread::spawn(move || put(&t2, &c2.register(), 3, 2));
        let removed = t.remove_node(old, t.verify(&g));
        drop(g);
        let replaced = writer.join().unwrap();
        // Either the removal came first (the write then inserted anew) or the write replaced
        // the node first (and the removal found it gone).
        assert_eq!(
            removed,
            replaced.is_none(),
            "removed {removed}, write saw {replaced:?}"
        );
        assert_eq!(get(&t, &h, 3), Some(2));
    });
}

/// Fills the root array up to its claim limit (3/4 of its slots), so that the next insert
/// of a new key starts a migration.
fn nearly_full() -> (Arc<Table<u64, Pair>>, Collector, u64) {
    let (t, c) = setup();
    let h = c.register();
    let slots = t.slot_count(t.verify(&h.pin()));
    let mut k = 100;
    while t.len() < slots - slots / 4 {
        put(&t, &h, k, 0);
        k += 1;
    }
    (t, c, k)
}

/// A migration started by one writer races a reader of an existing key and a second writer:
/// the reader always finds the key, and both writes survive the copy.
#[test]
fn migration_races_a_reader_and_a_writer() {
    // Setup, copy and teardown of the arrays are long straight-line code under loom.
    let mut builder = loom::model::Builder::new();
    builder.max_branches = 20_000;
    builder.check(|| {
        let (t, c, next_key) = nearly_full();
        let h = c.register();
        let slots_before = t.slot_count(t.verify(&h.pin()));
        let (t1, c1) = (Arc::clone(&t), c.clone());
        let grower = thread::spawn(move || {
            let h = c1.register();
            put(&t1, &h, next_key, 1);
            put(&t1, &h, next_key + 1, 1);
        });
        let (t2, c2) = (Arc::clone(&t), c.clone());
        let writer = thread::spawn(move || put(&t2, &c2.register(), 100, 5));
        // Key 100 exists throughout (generation 0, then 5).
        let seen = get(&t, &h, 100);
        assert!(matches!(seen, Some(0) | Some(5)), "{seen:?}");
        grower.join().unwrap();
        writer.join().unwrap();
        assert_eq!(get(&t, &h, 100), Some(5));
        assert_eq!(get(&t, &h, next_key), Some(1));
        assert_eq!(get(&t, &h, next_key + 1), Some(1));
        assert!(
            t.slot_count(t.verify(&h.pin())) > slots_before,
            "no migration happened"
        );
    });
}

/// A removal by address races a migration: it finds its node in whichever array holds it
/// (helping the copy if it meets a frozen slot), and the copy does not bring it back.
#[test]
fn removal_by_address_races_a_migration() {
    let mut builder = loom::model::Builder::new();
    builder.max_branches = 20_000;
    builder.check(|| {
        let (t, c, next_key) = nearly_full();
        let h = c.register();
        let (t1, c1) = (Arc::clone(&t), c.clone());
        let grower = thread::spawn(move || put(&t1, &c1.register(), next_key, 1));
        assert!(remove_read(&t, &h, 100, 0), "the node was current");
        grower.join().unwrap();
        assert_eq!(get(&t, &h, 100), None, "the copy brought the node back");
        assert_eq!(get(&t, &h, 101), Some(0));
        assert_eq!(get(&t, &h, next_key), Some(1));
    });
}
