//! Random operation sequences against a reference model (a `HashMap` plus a manual clock).

use std::collections::HashMap;
use std::time::Duration;

use herdcache::{Cache, ManualClock};
use proptest::prelude::*;

const TTL_MS: u64 = 1_000;

#[derive(Debug, Clone)]
enum Op {
    Insert(u8, u32),
    InsertWithTtl(u8, u32, u16),
    Get(u8),
    Invalidate(u8),
    Remove(u8),
    Peek(u8),
    /// Keeps the entries whose key plus value is not a multiple of this.
    Retain(u8),
    Iter,
    InvalidateAll,
    Advance(u16),
}

/// The predicate of `Op::Retain(m)`.
fn kept(m: u8, k: u8, v: u32) -> bool {
    (u32::from(k) + v) % u32::from(m.max(1)) != 0
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (any::<u8>(), any::<u32>()).prop_map(|(k, v)| Op::Insert(k, v)),
        2 => (any::<u8>(), any::<u32>(), 0..3_000u16).prop_map(|(k, v, t)| Op::InsertWithTtl(k, v, t)),
        6 => any::<u8>().prop_map(Op::Get),
        2 => any::<u8>().prop_map(Op::Invalidate),
        2 => any::<u8>().prop_map(Op::Remove),
        2 => any::<u8>().prop_map(Op::Peek),
        1 => (2..6u8).prop_map(Op::Retain),
        1 => Just(Op::Iter),
        1 => Just(Op::InvalidateAll),
        2 => (0..1_500u16).prop_map(Op::Advance),
    ]
}

/// The reference: key -> (value, expiry in ms), time in ms.
#[derive(Default)]
struct Model {
    map: HashMap<u8, (u32, u64)>,
    now: u64,
}

impl Model {
    fn live_entries(&self) -> HashMap<u8, u32> {
        (0..=u8::MAX)
            .filter_map(|k| self.live(k).map(|v| (k, v)))
            .collect()
    }

    fn live(&self, k: u8) -> Option<u32> {
        self.map
            .get(&k)
            .filter(|(_, exp)| self.now < *exp)
            .map(|(v, _)| *v)
    }
}

/// The cache's live entries as `iter` yields them; fails on a key yielded twice.
fn iterated(cache: &Cache<u8, u32>) -> Result<HashMap<u8, u32>, TestCaseError> {
    let guard = cache.pin();
    let mut seen = HashMap::new();
    for (k, v) in guard.iter() {
        prop_assert!(seen.insert(*k, *v).is_none(), "key {} yielded twice", k);
    }
    Ok(seen)
}

/// Applies the ops both properties treat alike (writes and clock moves) to the cache and the
/// model; returns false for the others, which each property checks in its own way.
fn apply_write(op: &Op, cache: &Cache<u8, u32>, clock: &ManualClock, model: &mut Model) -> bool {
    match *op {
        Op::Insert(k, v) => {
            cache.insert(k, v);
            model.map.insert(k, (v, model.now + TTL_MS));
        }
        Op::InsertWithTtl(k, v, t) => {
            cache.insert_with_ttl(k, v, Duration::from_millis(t.into()));
            model.map.insert(k, (v, model.now + u64::from(t)));
        }
        Op::Advance(ms) => {
            clock.advance(Duration::from_millis(ms.into()));
            model.now += u64::from(ms);
        }
        _ => return false,
    }
    true
}

fn build(cap: u64, clock: &ManualClock) -> Cache<u8, u32> {
    Cache::builder()
        .max_capacity(cap)
        .time_to_live(Duration::from_millis(TTL_MS))
        .clock(clock.clone())
        .build()
        .unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Without eviction the cache is exactly the model.
    #[test]
    fn matches_the_model_when_nothing_is_evicted(ops in prop::collection::vec(op(), 1..300)) {
        let clock = ManualClock::new();
        let cache = build(1024, &clock);
        let mut model = Model::default();
        for op in ops {
            if apply_write(&op, &cache, &clock, &mut model) {
                continue;
            }
            match op {
                Op::Get(k) => prop_assert_eq!(cache.get(&k), model.live(k), "get {}", k),
                Op::Invalidate(k) => {
                    let expected = model.live(k).is_some();
                    model.map.remove(&k);
                    prop_assert_eq!(cache.invalidate(&k), expected, "invalidate {}", k);
                }
                Op::Remove(k) => {
                    let expected = model.live(k);
                    model.map.remove(&k);
                    prop_assert_eq!(cache.remove(&k), expected, "remove {}", k);
                }
                Op::Peek(k) => {
                    let requests = cache.stats().requests();
                    prop_assert_eq!(cache.peek(&k), model.live(k), "peek {}", k);
                    prop_assert_eq!(cache.stats().requests(), requests, "peek counted");
                }
                Op::Retain(m) => {
                    let now = model.now;
                    model.map.retain(|&k, &mut (v, exp)| now >= exp || kept(m, k, v));
                    cache.retain(|&k, &v| kept(m, k, v));
                }
                Op::Iter => prop_assert_eq!(iterated(&cache)?, model.live_entries()),
                Op::InvalidateAll => {
                    cache.invalidate_all();
                    model.map.clear();
                }
                _ => unreachable!("applied by apply_write"),
            }
            prop_assert_eq!(cache.weighted_size(), cache.entry_count());
        }
        prop_assert_eq!(iterated(&cache)?, model.live_entries());
        for k in 0..=u8::MAX {
            prop_assert_eq!(cache.get(&k), model.live(k), "final get {}", k);
        }
    }

    /// With eviction, only the safe invariants hold: anything returned is the key's latest
    /// value and unexpired, and the count stays within capacity.
    #[test]
    fn never_returns_stale_or_expired_values_under_eviction(
        cap in 1..40u64,
        ops in prop::collection::vec(op(), 1..400),
    ) {
        let clock = ManualClock::new();
        let cache = build(cap, &clock);
        let mut model = Model::default();
        for op in ops {
            if !apply_write(&op, &cache, &clock, &mut model) {
                match op {
                    Op::Get(k) => {
                        if let Some(v) = cache.get(&k) {
                            prop_assert_eq!(Some(v), model.live(k), "get {}", k);
                        }
                    }
                    Op::Invalidate(k) => {
                        model.map.remove(&k);
                        cache.invalidate(&k);
                        prop_assert_eq!(cache.get(&k), None);
                    }
                    Op::Remove(k) => {
                        let removed = cache.remove(&k);
                        if removed.is_some() {
                            prop_assert_eq!(removed, model.live(k), "remove {}", k);
                        }
                        model.map.remove(&k);
                        prop_assert_eq!(cache.get(&k), None);
                    }
                    Op::Peek(k) => {
                        if let Some(v) = cache.peek(&k) {
                            prop_assert_eq!(Some(v), model.live(k), "peek {}", k);
                        }
                    }
                    Op::Retain(m) => {
                        cache.retain(|&k, &v| kept(m, k, v));
                        for (k, v) in iterated(&cache)? {
                            prop_assert!(kept(m, k, v), "{} -> {} kept", k, v);
                        }
                    }
                    Op::Iter => {
                        for (k, v) in iterated(&cache)? {
                            prop_assert_eq!(Some(v), model.live(k), "iter {}", k);
                        }
                    }
                    Op::InvalidateAll => {
                        cache.invalidate_all();
                        model.map.clear();
                        prop_assert_eq!(cache.entry_count(), 0);
                    }
                    _ => unreachable!("applied by apply_write"),
                }
            }
            prop_assert!(cache.entry_count() <= cap, "{} > {}", cache.entry_count(), cap);
            prop_assert!(cache.weighted_size() <= cap, "{} > {}", cache.weighted_size(), cap);
        }
    }
}
