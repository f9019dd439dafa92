//! `expire_after`: each value's time to live chosen from the value, for inserts and loads.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Duration;

use herdcache::{Cache, ManualClock};

/// A value that carries its own lifetime in seconds (`None`: the cache's default).
#[derive(Debug, Clone, PartialEq)]
struct Token(Option<u64>);

fn cache(clock: &ManualClock) -> Cache<u32, Token> {
    Cache::builder()
        .max_capacity(100)
        .time_to_live(Duration::from_secs(100))
        .expire_after(|k: &u32, t: &Token| {
            assert!(*k != 666, "user code: expire_after panics");
            t.0.map(Duration::from_secs)
        })
        .clock(clock.clone())
        .build()
        .unwrap()
}

#[test]
fn inserted_and_loaded_values_live_as_long_as_they_say() {
    let clock = ManualClock::new();
    let c = cache(&clock);
    c.insert(1, Token(Some(10)));
    c.insert(2, Token(None));
    let loaded = c.get_or_load(&3, |_| Ok::<_, ()>(Token(Some(30))));
    assert_eq!(loaded, Ok(Token(Some(30))));
    c.insert_with_ttl(4, Token(Some(10)), Duration::from_secs(50));
    clock.advance(Duration::from_secs(11));
    assert_eq!(c.get(&1), None, "its own 10 s");
    assert!(c.get(&3).is_some() && c.get(&4).is_some());
    clock.advance(Duration::from_secs(20));
    assert_eq!(c.get(&3), None, "the loaded value's own 30 s");
    assert!(
        c.get(&4).is_some(),
        "insert_with_ttl's 50 s wins over the value's 10 s"
    );
    clock.advance(Duration::from_secs(70));
    assert_eq!(c.get(&2), None, "the cache's 100 s");
    assert_eq!(c.get(&4), None);
}

#[test]
fn a_panicking_expire_after_fails_only_its_write() {
    let clock = ManualClock::new();
    let c = cache(&clock);
    c.insert(1, Token(None));
    let r = catch_unwind(AssertUnwindSafe(|| c.insert(666, Token(None))));
    assert!(r.is_err());
    assert_eq!(c.peek(&666), None, "the failed insert changed nothing");
    assert_eq!((c.entry_count(), c.weighted_size()), (1, 1));
    // A load whose value's expiry panics: its caller panics, and the key is not left
    // loading (a second try runs again rather than waiting for ever).
    for _ in 0..2 {
        let r = catch_unwind(AssertUnwindSafe(|| {
            c.get_or_load(&666, |_| Ok::<_, ()>(Token(Some(5))))
        }));
        assert!(r.is_err());
    }
    let s = c.stats();
    assert_eq!((s.loads, s.load_panics, s.loads_in_flight), (2, 2, 0));
    assert_eq!(
        c.get_or_load(&2, |_| Ok::<_, ()>(Token(None))),
        Ok(Token(None))
    );
}
