//! Operation sequences in which user code panics: the key's `Hash`, `Eq` or `Clone`, the value's
//! `Clone` or `Drop`, the weigher, the eviction listener or the loader, switched on for one
//! operation at a time. Checked: the process never aborts; a panic reaches only the
//! operation that ran the panicking code; the cache never holds more entries than its
//! capacity; an insert made with every switch off is read back at once; and once the cache
//! is dropped, as many values have been dropped as were made.
#![no_main]

use std::cell::Cell;
use std::hash::{Hash, Hasher};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Duration;

use arbitrary::Arbitrary;
use herdcache::{Cache, ManualClock};
use libfuzzer_sys::fuzz_target;

const CAPACITY: u64 = 16;

thread_local! {
    /// Where user code panics during the current operation.
    static SPOT: Cell<Spot> = const { Cell::new(Spot::Nowhere) };
    /// Values alive: made (new or cloned) minus dropped.
    static LIVE: Cell<i64> = const { Cell::new(0) };
}

#[derive(Arbitrary, Debug, Clone, Copy, PartialEq, Eq)]
enum Spot {
    Nowhere,
    Hash,
    Eq,
    KeyClone,
    Clone,
    Weigher,
    Listener,
}

fn armed(spot: Spot) -> bool {
    SPOT.with(Cell::get) == spot
}

#[derive(Debug)]
struct Key(u8);

impl Clone for Key {
    fn clone(&self) -> Self {
        if armed(Spot::KeyClone) {
            panic!("key Clone");
        }
        Key(self.0)
    }
}

impl Hash for Key {
    fn hash<H: Hasher>(&self, state: &mut H) {
        if armed(Spot::Hash) {
            panic!("Hash");
        }
        self.0.hash(state);
    }
}
impl PartialEq for Key {
    fn eq(&self, other: &Self) -> bool {
        if armed(Spot::Eq) {
            panic!("Eq");
        }
        self.0 == other.0
    }
}
impl Eq for Key {}

#[derive(Debug)]
struct Val {
    n: u16,
    /// Panics when the cache drops it (never set on a value the fuzzer itself drops).
    bomb: bool,
}

impl Val {
    fn new(n: u16, bomb: bool) -> Self {
        LIVE.with(|l| l.set(l.get() + 1));
        Val { n, bomb }
    }
}

impl Clone for Val {
    fn clone(&self) -> Self {
        if armed(Spot::Clone) {
            panic!("Clone");
        }
        Val::new(self.n, false)
    }
}

impl Drop for Val {
    fn drop(&mut self) {
        LIVE.with(|l| l.set(l.get() - 1));
        // Not while unwinding (the fuzzer's own drop of a value an insert failed to store).
        if self.bomb && !std::thread::panicking() {
            panic!("Drop");
        }
    }
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Loaded {
    Ok(u16),
    Err,
    Panic,
}

#[derive(Arbitrary, Debug)]
enum Op {
    Insert(u8, u16, bool, Spot),
    Get(u8, Spot),
    Invalidate(u8, Spot),
    Load(u8, Loaded, Spot),
    Advance(u16),
    /// An insert with every switch off, read back at once.
    Check(u8, u16),
}

fuzz_target!(|ops: Vec<Op>| {
    std::panic::set_hook(Box::new(|_| {}));
    LIVE.with(|l| l.set(0));
    let clock = ManualClock::new();
    let cache: Cache<Key, Val> = Cache::builder()
        .max_capacity(CAPACITY)
        .time_to_live(Duration::from_millis(1_000))
        .refresh_after(Duration::from_millis(500))
        .stale_if_error(true)
        .clock(clock.clone())
        .weigher(|_, v: &Val| {
            if armed(Spot::Weigher) {
                panic!("weigher");
            }
            u64::from(v.n % 4)
        })
        .eviction_listener(|_, _, _| {
            if armed(Spot::Listener) {
                panic!("listener");
            }
        })
        .build()
        .unwrap();
    for op in ops {
        let spot = match op {
            Op::Insert(.., s) | Op::Get(_, s) | Op::Invalidate(_, s) | Op::Load(_, _, s) => s,
            Op::Advance(_) | Op::Check(..) => Spot::Nowhere,
        };
        SPOT.with(|c| c.set(spot));
        let _ = catch_unwind(AssertUnwindSafe(|| match op {
            Op::Insert(k, v, bomb, _) => cache.insert(Key(k), Val::new(v, bomb)),
            Op::Get(k, _) => drop(cache.get(&Key(k))),
            Op::Invalidate(k, _) => drop(cache.invalidate(&Key(k))),
            Op::Load(k, loaded, _) => {
                let _ = cache.get_or_load(&Key(k), |_| match loaded {
                    Loaded::Ok(v) => Ok(Val::new(v, false)),
                    Loaded::Err => Err("down"),
                    Loaded::Panic => panic!("loader"),
                });
            }
            Op::Advance(ms) => clock.advance(Duration::from_millis(ms.into())),
            Op::Check(k, v) => {
                cache.insert(Key(k), Val::new(v, false));
                let got = cache.get(&Key(k)).map(|v| v.n);
                assert_eq!(got, Some(v), "an insert is read back at once");
            }
        }))
        .map_err(|p| {
            // A panic may only come from the operation's own armed user code.
            assert!(
                spot != Spot::Nowhere || matches!(op, Op::Load(_, Loaded::Panic, _)),
                "{op:?} panicked with no user code armed: {:?}",
                p.downcast_ref::<String>()
                    .map(String::as_str)
                    .or_else(|| p.downcast_ref::<&str>().copied())
            );
        });
        SPOT.with(|c| c.set(Spot::Nowhere));
        assert!(
            cache.entry_count() <= CAPACITY,
            "{} entries at capacity {CAPACITY}",
            cache.entry_count()
        );
    }
    drop(cache);
    assert_eq!(LIVE.with(Cell::get), 0, "values leaked or dropped twice");
});
