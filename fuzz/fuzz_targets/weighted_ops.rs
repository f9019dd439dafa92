//! Operation sequences on a small weighted `Cache` with an eviction listener: inserts with
//! weights (zero, small, and heavier than the whole capacity), reads, invalidations, loads and
//! clock moves. Checked after every operation: the values held weigh at most the capacity,
//! no value is reported twice or read after it was reported, and a read returns the value
//! last written for that key or nothing.
#![no_main]

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arbitrary::Arbitrary;
use herdcache::{Cache, ManualClock, RemovalCause};
use libfuzzer_sys::fuzz_target;

const CAPACITY: u64 = 64;

#[derive(Arbitrary, Debug)]
enum Op {
    Insert(u8, u8),
    Get(u8),
    Invalidate(u8),
    InvalidateAll,
    Load(u8, u8),
    Advance(u8),
}

type Log = Arc<Mutex<Vec<(u8, u64, RemovalCause)>>>;

fuzz_target!(|ops: Vec<Op>| {
    let clock = ManualClock::new();
    let log: Log = Arc::default();
    let seen = log.clone();
    let cache: Cache<u8, u64> = Cache::builder()
        .max_capacity(CAPACITY)
        .time_to_live(Duration::from_millis(300))
        .clock(clock.clone())
        // The weight rides in the value's low byte, its unique id above it.
        .weigher(|_, v: &u64| *v & 0xff)
        .eviction_listener(move |k: &u8, v: &u64, cause| seen.lock().unwrap().push((*k, *v, cause)))
        .build()
        .unwrap();
    let mut written: HashMap<u64, u8> = HashMap::new();
    let mut last: HashMap<u8, u64> = HashMap::new();
    let mut reported: HashSet<u64> = HashSet::new();
    let mut next_id = 1u64;
    let mut value = |w: u8| {
        let v = (next_id << 8) | u64::from(w % 80);
        next_id += 1;
        v
    };
    for op in ops {
        match op {
            Op::Insert(k, w) => {
                let v = value(w);
                cache.insert(k, v);
                written.insert(v, k);
                last.insert(k, v);
            }
            Op::Get(k) => {
                if let Some(v) = cache.get(&k) {
                    assert!(!reported.contains(&v), "read a value after it was reported");
                    assert_eq!(last.get(&k), Some(&v), "read a value that was overwritten");
                }
            }
            Op::Invalidate(k) => {
                cache.invalidate(&k);
            }
            Op::InvalidateAll => cache.invalidate_all(),
            Op::Load(k, w) => {
                let v = value(w);
                if let Ok(got) = cache.get_or_load(&k, |_| Ok::<_, ()>(v)) {
                    if got == v {
                        written.insert(v, k);
                        last.insert(k, v);
                    }
                }
            }
            Op::Advance(ms) => clock.advance(Duration::from_millis(ms.into())),
        }
        for (k, v, _) in log.lock().unwrap().drain(..) {
            assert!(reported.insert(v), "value {v:#x} reported twice");
            assert_eq!(written.get(&v), Some(&k), "reported under another key");
        }
        let held: u64 = written
            .keys()
            .filter(|v| !reported.contains(v))
            .map(|v| v & 0xff)
            .sum();
        assert!(held <= CAPACITY, "held weight {held} over the capacity");
    }
});
