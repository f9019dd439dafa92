//! `time_to_idle`: a value not read for that long expires; reads renew it, `peek` and
//! iteration do not; the time to live still bounds it; unread values are freed by the
//! writes' sweep without a read of their key.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::Tracked;
use herdcache::{Cache, ManualClock};
use proptest::prelude::*;

/// The granularity of idle deadlines (2^24 ns); the model advances the clock in whole units
/// so that its arithmetic is exact.
const UNIT: Duration = Duration::from_nanos(1 << 24);
const TTI_UNITS: u64 = 64;

fn cache(clock: &ManualClock) -> Cache<u8, u32> {
    Cache::builder()
        .max_capacity(1_024)
        .time_to_idle(UNIT * TTI_UNITS as u32)
        .clock(clock.clone())
        .build()
        .unwrap()
}

#[derive(Debug, Clone)]
enum Op {
    Insert(u8, u32),
    Get(u8),
    GetOrLoad(u8, u32),
    Peek(u8),
    Iter,
    Advance(u8),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..32u8, any::<u32>()).prop_map(|(k, v)| Op::Insert(k, v)),
        4 => (0..32u8).prop_map(Op::Get),
        2 => (0..32u8, any::<u32>()).prop_map(|(k, v)| Op::GetOrLoad(k, v)),
        2 => (0..32u8).prop_map(Op::Peek),
        1 => Just(Op::Iter),
        3 => (0..80u8).prop_map(Op::Advance),
    ]
}

/// The reference: key -> (value, unit of its last use), and the time in units.
#[derive(Default)]
struct Model {
    map: HashMap<u8, (u32, u64)>,
    now: u64,
}

impl Model {
    fn live(&self, k: u8) -> Option<u32> {
        self.map
            .get(&k)
            // A deadline is one unit past `units` after the unit of its use (it must not
            // come early for a use late in its unit), so on unit boundaries it is one late.
            .filter(|(_, used)| self.now - used < TTI_UNITS + 1)
            .map(|(v, _)| *v)
    }

    fn read(&mut self, k: u8) -> Option<u32> {
        let v = self.live(k)?;
        self.map.insert(k, (v, self.now));
        Some(v)
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn matches_a_model_of_last_use(ops in prop::collection::vec(op(), 1..300)) {
        let clock = ManualClock::new();
        let cache = cache(&clock);
        let mut model = Model::default();
        for op in ops {
            match op {
                Op::Insert(k, v) => {
                    cache.insert(k, v);
                    model.map.insert(k, (v, model.now));
                }
                Op::Get(k) => prop_assert_eq!(cache.get(&k), model.read(k), "get {}", k),
                Op::GetOrLoad(k, v) => {
                    let expected = model.read(k).unwrap_or_else(|| {
                        model.map.insert(k, (v, model.now));
                        v
                    });
                    prop_assert_eq!(cache.get_or_load(&k, |_| Ok::<_, ()>(v)), Ok(expected));
                }
                Op::Peek(k) => prop_assert_eq!(cache.peek(&k), model.live(k), "peek {}", k),
                Op::Iter => {
                    let seen: HashMap<u8, u32> =
                        cache.pin().iter().map(|(k, v)| (*k, *v)).collect();
                    let live: HashMap<u8, u32> =
                        (0..32).filter_map(|k| model.live(k).map(|v| (k, v))).collect();
                    prop_assert_eq!(seen, live);
                }
                Op::Advance(units) => {
                    clock.advance(UNIT * u32::from(units));
                    model.now += u64::from(units);
                }
            }
        }
    }
}

#[test]
fn a_value_gone_idle_is_not_served_while_its_reload_runs() {
    // The reload of an idle-expired value kept that value as the load's stale fallback,
    // valid for ever (no TTL): readers got it again as a hit while the load ran.
    let clock = ManualClock::new();
    let c: Cache<u64, u64> = Cache::builder()
        .max_capacity(10)
        .time_to_idle(Duration::from_secs(1))
        .max_stale(Duration::from_millis(500))
        .clock(clock.clone())
        .build()
        .unwrap();
    c.insert(1, 10);
    // Idle for about a second past its idle time: more than max_stale.
    clock.advance(Duration::from_secs(2));
    let (release, leader) = common::held_load(&c, 1, 20);
    assert_eq!(
        c.get(&1),
        None,
        "the idle value served while its reload ran"
    );
    let waited = c.get_or_load_timeout(&1, Duration::from_millis(10), |_| Ok::<_, ()>(30));
    assert!(
        waited.is_err(),
        "the idle value served as a fallback: {waited:?}"
    );
    release.send(()).unwrap();
    assert_eq!(leader.join().unwrap(), 20);
    assert_eq!(c.get(&1), Some(20));
}

#[test]
fn an_idle_time_never_ends_early() {
    // A write late in a deadline unit must still live its whole idle time.
    let clock = ManualClock::new();
    let c: Cache<u64, u64> = Cache::builder()
        .max_capacity(10)
        .time_to_idle(UNIT * 4)
        .clock(clock.clone())
        .build()
        .unwrap();
    clock.advance(UNIT - Duration::from_nanos(1));
    c.insert(1, 1);
    clock.advance(UNIT * 4 - Duration::from_nanos(1));
    assert_eq!(c.get(&1), Some(1), "expired before its idle time");
}

#[test]
fn the_time_to_live_still_bounds_a_value_that_is_read() {
    let clock = ManualClock::new();
    let cache: Cache<u8, u8> = Cache::builder()
        .max_capacity(10)
        .time_to_live(Duration::from_secs(10))
        .time_to_idle(Duration::from_secs(3))
        .clock(clock.clone())
        .build()
        .unwrap();
    cache.insert(1, 1);
    for _ in 0..4 {
        clock.advance(Duration::from_secs(2));
        assert_eq!(cache.get(&1), Some(1), "read every 2 s: not idle");
    }
    clock.advance(Duration::from_secs(2));
    assert_eq!(cache.get(&1), None, "10 s after the insert");
}

#[test]
fn unread_values_are_freed_by_other_keys_writes() {
    let clock = ManualClock::new();
    let drops = Arc::new(AtomicUsize::new(0));
    let cache: Cache<u64, Tracked> = Cache::builder()
        .max_capacity(1_000)
        .time_to_idle(Duration::from_secs(60))
        .clock(clock.clone())
        .build()
        .unwrap();
    for k in 0..100 {
        cache.insert(k, Tracked::new(k, &drops));
    }
    clock.advance(Duration::from_secs(30));
    // Keys 0..10 are read; the others idle.
    for k in 0..10 {
        assert!(cache.pin().get(&k).is_some());
    }
    clock.advance(Duration::from_secs(31));
    let churn = Arc::new(AtomicUsize::new(0));
    for i in 0..1_000u64 {
        cache.insert(10_000 + i % 10, Tracked::new(i, &churn));
    }
    assert_eq!(cache.stats().expirations, 90);
    assert_eq!(cache.entry_count(), 20, "10 read keys and 10 written ones");
    common::spin_until("the idle values freed", || {
        drop(cache.pin());
        drops.load(Ordering::Relaxed) >= 90
    });
}
