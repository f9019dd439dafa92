//! Operation sequences on a `Cache` with single flight, checked against a model (a `HashMap`
//! of values with expiries, plus a manual clock).
//!
//! Loads run on the fuzzing thread, so a "load during which X happens" is a loader that does
//! X from inside (invalidate, insert, forget, advance the clock) before it returns: the load
//! then has to respect invariant 4 (an insert or invalidation during a load wins, and the
//! late result is not cached) exactly as the model says.
#![no_main]

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Duration;

use arbitrary::Arbitrary;
use herdcache::{Cache, LoadError, ManualClock};
use libfuzzer_sys::fuzz_target;

const TTL_MS: u64 = 1_000;
const NEG_TTL_MS: u64 = 300;

#[derive(Arbitrary, Debug, Clone, Copy)]
enum During {
    Nothing,
    Invalidate,
    Insert(u16),
    Forget,
    Advance(u16),
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Result_ {
    Ok(u16),
    Err,
    Panic,
}

#[derive(Arbitrary, Debug)]
enum Op {
    Insert(u8, u16),
    Get(u8),
    Invalidate(u8),
    Forget(u8),
    Load(u8, Result_, During),
    Advance(u16),
}

#[derive(Default)]
struct Model {
    /// key -> (value or cached error, expiry in ms)
    map: HashMap<u8, (Option<u16>, u64)>,
    now: u64,
}

impl Model {
    fn live(&self, k: u8) -> Option<u16> {
        match self.map.get(&k) {
            Some((Some(v), exp)) if self.now < *exp => Some(*v),
            _ => None,
        }
    }
    fn cached_error(&self, k: u8) -> bool {
        matches!(self.map.get(&k), Some((None, exp)) if self.now < *exp)
    }
}

fuzz_target!(|ops: Vec<Op>| {
    std::panic::set_hook(Box::new(|_| {}));
    let clock = ManualClock::new();
    let cache: Cache<u8, u16> = Cache::builder()
        .max_capacity(1024)
        .time_to_live(Duration::from_millis(TTL_MS))
        .negative_ttl(Duration::from_millis(NEG_TTL_MS))
        .clock(clock.clone())
        .build()
        .unwrap();
    let mut m = Model::default();
    for op in ops {
        match op {
            Op::Insert(k, v) => {
                cache.insert(k, v);
                m.map.insert(k, (Some(v), m.now + TTL_MS));
            }
            Op::Get(k) => assert_eq!(cache.get(&k), m.live(k), "get {k}"),
            Op::Invalidate(k) => {
                assert_eq!(cache.invalidate(&k), m.live(k).is_some(), "invalidate {k}");
                m.map.remove(&k);
            }
            Op::Forget(k) => assert!(!cache.forget(&k), "no load is in flight between ops"),
            Op::Advance(ms) => {
                clock.advance(Duration::from_millis(ms.into()));
                m.now += u64::from(ms);
            }
            Op::Load(k, result, during) => {
                let hit = m.live(k);
                let cached_err = m.cached_error(k);
                let mut ran = false;
                let mut interfered = false;
                let r = catch_unwind(AssertUnwindSafe(|| {
                    cache.get_or_load(&k, |_| {
                        ran = true;
                        match during {
                            During::Nothing => {}
                            During::Invalidate => {
                                assert!(!cache.invalidate(&k), "a load is not a value");
                                interfered = true;
                            }
                            During::Insert(v) => {
                                cache.insert(k, v);
                                interfered = true;
                            }
                            During::Forget => {
                                assert!(cache.forget(&k), "our load is in flight");
                                interfered = true;
                            }
                            During::Advance(ms) => clock.advance(Duration::from_millis(ms.into())),
                        }
                        match result {
                            Result_::Ok(v) => Ok(v),
                            Result_::Err => Err("down"),
                            Result_::Panic => panic!("loader panic"),
                        }
                    })
                }));
                if let During::Advance(ms) = during {
                    if ran {
                        m.now += u64::from(ms);
                    }
                }
                if let Some(v) = hit {
                    assert!(!ran, "hit must not load");
                    assert_eq!(r.ok(), Some(Ok(v)));
                    continue;
                }
                if cached_err {
                    assert!(!ran, "a cached error must not load");
                    assert!(matches!(r, Ok(Err(LoadError::Failed(_)))));
                    continue;
                }
                assert!(ran, "a miss must load");
                // What the cache holds afterwards.
                if let During::Insert(v) = during {
                    m.map.insert(k, (Some(v), m.now + TTL_MS));
                } else {
                    m.map.remove(&k);
                }
                match result {
                    Result_::Ok(v) => {
                        assert_eq!(
                            r.ok(),
                            Some(Ok(v)),
                            "the loader's own caller gets its value"
                        );
                        if !interfered {
                            m.map.insert(k, (Some(v), m.now + TTL_MS));
                        }
                    }
                    Result_::Err => {
                        assert!(matches!(r, Ok(Err(LoadError::Failed(_)))));
                        if !interfered {
                            m.map.insert(k, (None, m.now + NEG_TTL_MS));
                        }
                    }
                    Result_::Panic => assert!(r.is_err(), "the panic reaches the caller"),
                }
            }
        }
    }
    for k in 0..=u8::MAX {
        assert_eq!(cache.get(&k), m.live(k), "final get {k}");
    }
});
