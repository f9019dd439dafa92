//! Operation sequences run against herdcache's table and a `HashMap`, comparing every answer
//! and, at the end, the whole contents.
//!
//! The fuzzer also chooses the hash function's quality, so that it drives the table through
//! heavy collisions (shared home slots and tag bytes), long probe runs, growth, shrinking and
//! tombstone rehashes.
#![no_main]

use std::collections::HashMap;

use arbitrary::Arbitrary;
use crossbeam_epoch::{Collector, Owned};
use herdcache::raw::{Decision, Node, Outcome, Table, VerifiedGuard};
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
enum Op {
    Insert(u16, u32),
    Get(u16),
    Remove(u16),
    /// Remove the node read under the same guard, by identity.
    RemoveNode(u16),
    /// Insert only if absent (a `Keep` decision for present keys).
    InsertIfAbsent(u16, u32),
    /// Insert many consecutive keys: forces resizes.
    Fill(u16, u8),
    /// Remove many consecutive keys: leaves tombstones, forces rehashes.
    Drain(u16, u8),
    /// Drop the current guard and pin anew (lets the collector free retired nodes).
    Repin,
}

#[derive(Arbitrary, Debug)]
struct Input {
    /// Bits of the hash kept: few bits means many collisions.
    hash_bits: u8,
    initial_capacity: u8,
    ops: Vec<Op>,
}

fuzz_target!(|input: Input| {
    let bits = u32::from(input.hash_bits % 65);
    let hash = move |k: u16| -> u64 {
        let h = u64::from(k).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        // With fewer than 64 bits the top bits (the tag byte) are all zero and home slots
        // collide; with none, every key shares one probe sequence.
        h.checked_shr(64 - bits).unwrap_or(0)
    };
    let collector = Collector::new();
    let handle = collector.register();
    let table: Table<u16, u32> = Table::with_capacity(input.initial_capacity.into(), &collector);
    let mut model: HashMap<u16, u32> = HashMap::new();
    let mut guard = handle.pin();

    let insert = |table: &Table<u16, u32>, guard: &VerifiedGuard, k: u16, v: u32| {
        table
            .insert(Owned::new(Node::new(hash(k), k, v)), |x| *x == k, guard)
            .map(|n| n.value)
    };

    for op in input.ops {
        match op {
            Op::Insert(k, v) => {
                assert_eq!(
                    insert(&table, table.verify(&guard), k, v),
                    model.insert(k, v),
                    "insert {k}"
                );
            }
            Op::Get(k) => {
                let got = table
                    .get(hash(k), |x| *x == k, table.verify(&guard))
                    .map(|n| n.value);
                assert_eq!(got, model.get(&k).copied(), "get {k}");
            }
            Op::Remove(k) => {
                let got = table
                    .remove(hash(k), |x| *x == k, table.verify(&guard))
                    .map(|n| n.value);
                assert_eq!(got, model.remove(&k), "remove {k}");
            }
            Op::RemoveNode(k) => {
                if let Some(node) = table.get(hash(k), |x| *x == k, table.verify(&guard)) {
                    assert!(
                        table.remove_node(node, table.verify(&guard)),
                        "remove_node {k}"
                    );
                    assert!(model.remove(&k).is_some());
                } else {
                    assert!(!model.contains_key(&k));
                }
            }
            Op::InsertIfAbsent(k, v) => {
                let new = Owned::new(Node::new(hash(k), k, v));
                let decide = |cur: Option<&Node<u16, u32>>| match cur {
                    Some(_) => Decision::Keep,
                    None => Decision::Put,
                };
                match table.update(
                    hash(k),
                    |x| *x == k,
                    Some(new),
                    decide,
                    table.verify(&guard),
                ) {
                    Outcome::Inserted(n) => {
                        assert_eq!(n.value, v);
                        assert!(model.insert(k, v).is_none(), "inserted over {k}");
                    }
                    Outcome::Kept(Some(cur), Some(_unused)) => {
                        assert_eq!(Some(&cur.value), model.get(&k), "kept {k}");
                    }
                    other => panic!("insert-if-absent {k}: {other:?}"),
                }
            }
            Op::Fill(start, n) => {
                for k in start..start.saturating_add(n.into()) {
                    let v = u32::from(k) ^ 0xA5A5;
                    assert_eq!(
                        insert(&table, table.verify(&guard), k, v),
                        model.insert(k, v),
                        "fill {k}"
                    );
                }
            }
            Op::Drain(start, n) => {
                for k in start..start.saturating_add(n.into()) {
                    let got = table
                        .remove(hash(k), |x| *x == k, table.verify(&guard))
                        .map(|n| n.value);
                    assert_eq!(got, model.remove(&k), "drain {k}");
                }
            }
            Op::Repin => {
                drop(guard);
                guard = handle.pin();
            }
        }
        assert_eq!(table.len(), model.len());
    }

    // Final full comparison, both ways.
    let mut seen: HashMap<u16, u32> = HashMap::new();
    for node in table.iter(table.verify(&guard)) {
        assert!(
            seen.insert(node.key, node.value).is_none(),
            "key {} twice",
            node.key
        );
    }
    assert_eq!(seen, model);
    for (k, v) in &model {
        assert_eq!(
            table
                .get(hash(*k), |x| x == k, table.verify(&guard))
                .map(|n| n.value),
            Some(*v)
        );
    }
});
