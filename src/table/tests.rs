//! Unit tests of the table, small enough for Miri.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use crossbeam_epoch::{Collector, Owned};

use super::*;

/// Small counts under Miri, which is ~1000x slower.
const fn scaled(n: usize) -> usize {
    if cfg!(miri) {
        n / 20 + 4
    } else {
        n
    }
}

/// A hash that makes every key collide in its top bits and clusters them, to exercise
/// probing and tags.
fn h(k: u64) -> u64 {
    k.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 3
}

fn put(t: &Table<u64, u64>, k: u64, v: u64, g: &VerifiedGuard) -> Option<u64> {
    t.insert(Owned::new(Node::new(h(k), k, v)), |x| *x == k, g)
        .map(|n| n.value)
}

fn get(t: &Table<u64, u64>, k: u64, g: &VerifiedGuard) -> Option<u64> {
    t.get(h(k), |x| *x == k, g).map(|n| n.value)
}

#[test]
fn insert_get_replace_remove() {
    let c = Collector::new();
    let handle = c.register();
    let g = handle.pin();
    let t = Table::with_capacity(4, &c);
    assert_eq!(get(&t, 1, t.verify(&g)), None);
    assert_eq!(put(&t, 1, 10, t.verify(&g)), None);
    assert_eq!(put(&t, 2, 20, t.verify(&g)), None);
    assert_eq!(get(&t, 1, t.verify(&g)), Some(10));
    assert_eq!(put(&t, 1, 11, t.verify(&g)), Some(10));
    assert_eq!(get(&t, 1, t.verify(&g)), Some(11));
    assert_eq!(t.len(), 2);
    assert_eq!(
        t.remove(h(1), |x| *x == 1, t.verify(&g)).map(|n| n.value),
        Some(11)
    );
    assert_eq!(
        t.remove(h(1), |x| *x == 1, t.verify(&g)).map(|n| n.value),
        None
    );
    assert_eq!(get(&t, 1, t.verify(&g)), None);
    assert_eq!(get(&t, 2, t.verify(&g)), Some(20));
    assert_eq!(t.len(), 1);
    // A removed key can come back.
    assert_eq!(put(&t, 1, 12, t.verify(&g)), None);
    assert_eq!(get(&t, 1, t.verify(&g)), Some(12));
}

#[test]
fn grows_through_many_resizes_and_keeps_every_key() {
    let c = Collector::new();
    let handle = c.register();
    let t = Table::with_capacity(1, &c);
    let n = scaled(2_000) as u64;
    for k in 0..n {
        let g = handle.pin();
        assert_eq!(put(&t, k, k * 2, t.verify(&g)), None);
    }
    let g = handle.pin();
    assert_eq!(t.len(), n as usize);
    for k in 0..n {
        assert_eq!(get(&t, k, t.verify(&g)), Some(k * 2), "key {k}");
    }
    assert!(t.slot_count(t.verify(&g)) >= 2 * n as usize / 2);
    let mut seen: Vec<u64> = t.iter(t.verify(&g)).map(|n| n.key).collect();
    seen.sort_unstable();
    assert_eq!(seen, (0..n).collect::<Vec<_>>());
}

/// Writes `writes` distinct keys to `t`, removing each one `live` writes later, so that `t`
/// holds `live` entries from then on; returns the most slots its newest array had.
fn churn(table: impl FnOnce(&Collector) -> Table<u64, u64>, live: u64, writes: u64) -> usize {
    let c = Collector::new();
    let t = &table(&c);
    let handle = c.register();
    let mut max_slots = 0;
    for k in 0..writes {
        let g = handle.pin();
        put(t, k, k, t.verify(&g));
        if k >= live {
            let old = k - live;
            assert!(t.remove(h(old), |x| *x == old, t.verify(&g)).is_some());
        }
        max_slots = max_slots.max(t.slot_count(t.verify(&g)));
        assert!(t.len() <= live as usize + 1);
    }
    max_slots
}

#[test]
fn churn_does_not_grow_the_table() {
    // Insert and remove distinct keys forever at a constant live count: tombstones must be
    // dropped by same-size rehashes, not accumulate into growth.
    let live = 64;
    let max_slots = churn(|c| Table::with_capacity(64, c), live, scaled(20_000) as u64);
    assert!(max_slots <= SlotArray::<u64, u64>::size_for(live as usize + 1, usize::MAX));
}

/// A table that holds as many entries as it may, replacing one per write as a full cache
/// does, keeps at most twice as many slots as entries (with the head room and the rounding
/// to a power of two): its migrations shed tombstones without making room to grow.
#[test]
fn a_full_table_that_churns_keeps_two_slots_per_entry() {
    let live = 800;
    let table = |c: &Collector| Table::with_capacity(live as usize, c).with_bound(live as usize);
    let max_slots = churn(table, live, scaled(20_000) as u64);
    let most = (2 * (live as usize + HEADROOM)).next_power_of_two();
    assert!(
        max_slots <= most,
        "{live} entries churned through {max_slots} slots; at most {most} expected"
    );
}

#[test]
fn update_decisions_and_remove_node_identity() {
    let c = Collector::new();
    let handle = c.register();
    let g = handle.pin();
    let t: Table<u64, u64> = Table::with_capacity(4, &c);
    // Keep on absent key hands the node back.
    match t.update(
        h(5),
        |x| *x == 5,
        Some(Owned::new(Node::new(h(5), 5, 50))),
        |_| Decision::Keep,
        t.verify(&g),
    ) {
        Outcome::Kept(None, Some(back)) => assert_eq!(back.value, 50),
        other => panic!("{other:?}"),
    }
    put(&t, 5, 51, t.verify(&g));
    let first = t.get(h(5), |x| *x == 5, t.verify(&g)).unwrap();
    put(&t, 5, 52, t.verify(&g));
    // `first` was replaced: removing it by identity must not remove the new node.
    assert!(!t.remove_node(first, t.verify(&g)));
    assert_eq!(get(&t, 5, t.verify(&g)), Some(52));
    let second = t.get(h(5), |x| *x == 5, t.verify(&g)).unwrap();
    assert!(t.remove_node(second, t.verify(&g)));
    assert_eq!(get(&t, 5, t.verify(&g)), None);
}

/// Removal by address probes past other keys' slots and tombstones on the same probe
/// sequence, finds each node wherever its claim put it, and stops at the first unclaimed
/// slot for a node no longer in the table, even one whose old place lies beyond it.
#[test]
fn remove_node_finds_nodes_along_a_shared_probe_sequence() {
    let c = Collector::new();
    let handle = c.register();
    let g = handle.pin();
    let t: Table<u64, u64> = Table::with_capacity(16, &c);
    let same_home = |k: u64| 7 | (k << 40);
    let node = |k: u64| Owned::new(Node::new(same_home(k), k, k * 10));
    for k in 0..6 {
        assert!(t.insert(node(k), |x| *x == k, t.verify(&g)).is_none());
    }
    let find = |k: u64| {
        t.get(same_home(k), |x| *x == k, t.verify(&g))
            .expect("the key was written")
    };
    let (n1, n3, n5) = (find(1), find(3), find(5));
    assert!(
        t.remove_node(n1, t.verify(&g)),
        "the second claim of the sequence"
    );
    assert!(t.remove_node(n3, t.verify(&g)), "past a tombstone");
    assert!(
        t.remove_node(n5, t.verify(&g)),
        "past two tombstones, at the end"
    );
    assert!(!t.remove_node(n3, t.verify(&g)), "a node removed already");
    for k in [0, 2, 4] {
        assert_eq!(find(k).value, k * 10, "key {k} kept");
    }
    for k in [1, 3, 5] {
        assert!(
            t.get(same_home(k), |x| *x == k, t.verify(&g)).is_none(),
            "key {k} gone"
        );
    }
    assert_eq!(t.len(), 3);
    // A same-size migration drops the tombstones: in the new array the three keys left are
    // the sequence's first three claims, so a probe for the removed `n5` meets an unclaimed
    // slot before the place `n5` had, and stops there.
    t.link_migration(t.verify(&g));
    assert!(
        !t.remove_node(n5, t.verify(&g)),
        "stops at the unclaimed slot"
    );
    for k in [0, 2, 4] {
        assert_eq!(find(k).value, k * 10, "key {k} copied");
    }
    assert_eq!(t.len(), 3);
}

#[test]
fn a_table_that_only_grows_frees_the_arrays_it_outgrew() {
    let c = Collector::new();
    let handle = c.register();
    let before = array::ALIVE.with(|n| n.get());
    let t: Table<u64, u64> = Table::with_capacity(4, &c);
    let n = scaled(4_000) as u64;
    // One pin per write, as the cache pins, and the flush the cache makes once a write is
    // done: nothing but the outgrown arrays is retired.
    for k in 0..n {
        let g = handle.pin();
        put(&t, k, k, t.verify(&g));
        flush_outgrown(t.verify(&g));
    }
    let grown = array::ALIVE.with(|n| n.get()) - before;
    // Later pins (one in 128 collects, and may advance the epoch by one) free what was
    // retired: a retired array is freed two epochs on.
    for _ in 0..8 * 128 {
        drop(handle.pin());
    }
    let alive = array::ALIVE.with(|n| n.get()) - before;
    assert_eq!(
        alive, 1,
        "{n} inserts grew the table through {grown} arrays still allocated after the fill, \
         {alive} after 1,024 more pins: all but the table's own should be freed"
    );
    assert_eq!(t.len(), n as usize);
}

/// A write that finishes a migration another thread started, as an evicting writer's removal
/// may under a policy lock, leaves the flush of the outgrown array to its caller: the
/// collection a flush starts runs retired values' destructors, which are user code (debug
/// builds check that none can run in the section below).
#[test]
fn a_write_that_finishes_a_migration_leaves_the_flush_to_its_caller() {
    let c = Collector::new();
    let handle = c.register();
    let g = handle.pin();
    let t: Table<u64, u64> = Table::with_capacity(64, &c);
    for k in 0..32 {
        put(&t, k, k, t.verify(&g));
    }
    let victim = t
        .get(h(5), |x| *x == 5, t.verify(&g))
        .expect("key 5 was written");
    t.link_migration(t.verify(&g));
    {
        let _locked = crate::sync::NoUserCode::enter();
        assert!(
            t.remove_node(victim, t.verify(&g)),
            "the write did not remove its node"
        );
    }
    let outgrew = || OUTGREW.with(Cell::get);
    assert!(outgrew(), "the promotion left no flush for its caller");
    flush_outgrown(t.verify(&g));
    assert!(!outgrew(), "the caller's flush left the flag set");
    for k in 0..32 {
        assert_eq!(
            get(&t, k, t.verify(&g)),
            (k != 5).then_some(k),
            "key {k} after the migration"
        );
    }
}

/// Counts drops of a value so that tests can check each is dropped exactly once.
#[derive(Debug)]
struct Tracked(Arc<AtomicUsize>);
impl Drop for Tracked {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
}

#[test]
fn every_node_is_dropped_exactly_once() {
    let drops = Arc::new(AtomicUsize::new(0));
    let made = scaled(3_000);
    {
        let c = Collector::new();
        let handle = c.register();
        let t: Table<u64, Tracked> = Table::with_capacity(2, &c);
        for i in 0..made as u64 {
            let g = handle.pin();
            let k = i % 300; // replacements, growth, removals and rehashes
            let node = Owned::new(Node::new(h(k), k, Tracked(drops.clone())));
            t.insert(node, |x| *x == k, t.verify(&g));
            if i % 3 == 0 {
                t.remove(h(k / 2), |x| *x == k / 2, t.verify(&g));
            }
        }
        drop(t);
        drop(handle);
        drop(c);
    }
    assert_eq!(drops.load(Ordering::Relaxed), made);
}

#[test]
fn concurrent_writers_and_readers_agree_with_a_model() {
    let c = Collector::new();
    let t: Table<u64, u64> = Table::with_capacity(1, &c);
    let per = scaled(2_000) as u64;
    std::thread::scope(|s| {
        for w in 0..2u64 {
            let (t, c) = (&t, &c);
            s.spawn(move || {
                let handle = c.register();
                for i in 0..per {
                    let g = handle.pin();
                    let k = w * per + i;
                    put(t, k, k + 1, t.verify(&g));
                    // Readers of our own writes see them, across resizes.
                    assert_eq!(get(t, k, t.verify(&g)), Some(k + 1));
                    if i % 4 == 0 {
                        assert!(t.remove(h(k), |x| *x == k, t.verify(&g)).is_some());
                    }
                }
            });
        }
        let (t, c) = (&t, &c);
        s.spawn(move || {
            let handle = c.register();
            for i in 0..per {
                let g = handle.pin();
                if let Some(v) = get(t, i, t.verify(&g)) {
                    assert_eq!(v, i + 1);
                }
            }
        });
    });
    let handle = c.register();
    let g = handle.pin();
    let model: HashMap<u64, u64> = (0..2 * per)
        .filter(|k| (k % per) % 4 != 0)
        .map(|k| (k, k + 1))
        .collect();
    assert_eq!(t.len(), model.len());
    for (k, v) in &model {
        assert_eq!(get(&t, *k, t.verify(&g)), Some(*v));
    }
}

/// The table takes only guards of the collector it retires its nodes on: one of another
/// collector would let a node be freed while a reader still holds it.
#[test]
#[should_panic(expected = "a guard of another collector")]
fn a_guard_of_another_collector_is_refused() {
    let c = Collector::new();
    let t: Table<u64, u64> = Table::with_capacity(4, &c);
    let other = Collector::new();
    let handle = other.register();
    let _ = t.verify(&handle.pin());
}

/// An unprotected guard protects nothing, so the table refuses it too.
#[test]
#[should_panic(expected = "a guard of another collector")]
fn an_unprotected_guard_is_refused() {
    let c = Collector::new();
    let t: Table<u64, u64> = Table::with_capacity(4, &c);
    // SAFETY: nothing is read or retired through it: `verify` refuses it first.
    let _ = t.verify(unsafe { crossbeam_epoch::unprotected() });
}

/// A guard verified for one table and handed to another is caught, in debug builds, by the
/// lookup itself: every operation checks the guard where it starts, at the root array.
#[test]
#[cfg(debug_assertions)]
#[should_panic(expected = "a guard of another collector")]
fn a_guard_verified_for_another_table_is_caught_by_a_lookup() {
    let (c1, c2) = (Collector::new(), Collector::new());
    let t1: Table<u64, u64> = Table::with_capacity(4, &c1);
    let t2: Table<u64, u64> = Table::with_capacity(4, &c2);
    let handle = c1.register();
    let g = handle.pin();
    let _ = get(&t2, 1, t1.verify(&g));
}
