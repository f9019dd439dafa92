//! Admission control (`max_concurrent_loads`) and warming.

mod common;

use common::held_load;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use herdcache::{Cache, LoadError, ManualClock};

type C = Cache<u64, u64>;
const SEC: Duration = Duration::from_secs(1);

/// Tracks the most loader calls running at once.
#[derive(Default)]
struct Concurrency {
    now: AtomicUsize,
    max: AtomicUsize,
}
impl Concurrency {
    fn run<T>(&self, f: impl FnOnce() -> T) -> T {
        let n = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.max.fetch_max(n, Ordering::SeqCst);
        for _ in 0..200 {
            thread::yield_now();
        }
        let r = f();
        self.now.fetch_sub(1, Ordering::SeqCst);
        r
    }
}

#[test]
fn a_load_over_the_bound_without_a_stale_value_waits_until_its_deadline() {
    let c: C = Cache::builder()
        .max_capacity(10)
        .max_concurrent_loads(1)
        .build()
        .unwrap();
    let (release, holder) = held_load(&c, 1, 1);
    let r = c.get_or_load_timeout(&2, Duration::ZERO, |_| Ok::<_, ()>(2));
    assert_eq!(r, Err(LoadError::Timeout));
    assert!(c.stats().throttled >= 1);
    // A caller without a deadline gets the permit once it is freed.
    let waiter = {
        let c = c.clone();
        thread::spawn(move || c.get_or_load(&2, |_| Ok::<_, ()>(2)))
    };
    release.send(()).unwrap();
    holder.join().unwrap();
    assert_eq!(waiter.join().unwrap(), Ok(2));
}

#[test]
fn a_load_over_the_bound_serves_the_stale_value() {
    let clock = ManualClock::new();
    let c: C = Cache::builder()
        .max_capacity(10)
        .time_to_live(10 * SEC)
        .max_concurrent_loads(1)
        .clock(clock.clone())
        .build()
        .unwrap();
    c.insert(2, 20);
    clock.advance(11 * SEC);
    let (release, holder) = held_load(&c, 1, 1);
    let r = c.get_or_load(&2, |_| -> Result<u64, ()> { panic!("must not load") });
    assert_eq!(
        r,
        Ok(20),
        "the expired value, rather than a load over the bound"
    );
    release.send(()).unwrap();
    holder.join().unwrap();
    assert_eq!(c.get_or_load(&2, |_| Ok::<_, ()>(21)), Ok(21));
}

#[test]
fn a_due_refresh_without_a_permit_is_skipped_and_retried_later() {
    let clock = ManualClock::new();
    let c: C = Cache::builder()
        .max_capacity(10)
        .time_to_live(60 * SEC)
        .refresh_after(10 * SEC)
        .max_concurrent_loads(1)
        .clock(clock.clone())
        .build()
        .unwrap();
    c.get_or_load(&2, |_| Ok::<_, ()>(1)).unwrap();
    clock.advance(11 * SEC);
    let (release, holder) = held_load(&c, 1, 1);
    let r = c.get_or_load(&2, |_| -> Result<u64, ()> {
        panic!("no permit: no refresh")
    });
    assert_eq!(r, Ok(1));
    release.send(()).unwrap();
    holder.join().unwrap();
    assert_eq!(
        c.get_or_load(&2, |_| Ok::<_, ()>(2)),
        Ok(2),
        "refreshed once a permit is free"
    );
}

#[test]
fn loads_of_many_keys_never_exceed_the_bound() {
    let c: C = Cache::builder()
        .max_capacity(100)
        .max_concurrent_loads(2)
        .build()
        .unwrap();
    let conc = Concurrency::default();
    thread::scope(|s| {
        for k in 0..8u64 {
            let (c, conc) = (&c, &conc);
            s.spawn(move || {
                assert_eq!(c.get_or_load(&k, |k| conc.run(|| Ok::<_, ()>(*k))), Ok(k));
            });
        }
    });
    assert!(conc.max.load(Ordering::SeqCst) <= 2);
}

#[test]
fn warm_loads_missing_keys_skips_present_ones_and_counts_failures() {
    let c: C = Cache::builder().max_capacity(1_000).build().unwrap();
    c.insert(0, 0);
    let conc = Arc::new(Concurrency::default());
    let seen = Mutex::new(Vec::new());
    std::panic::set_hook(Box::new(|_| {}));
    let in_loader = Arc::clone(&conc);
    let report = c.warm_with_progress(
        0..100u64,
        move |k| {
            in_loader.run(|| match k % 10 {
                7 => Err("down"),
                9 if *k == 99 => panic!("loader bug"),
                _ => Ok(k * 2),
            })
        },
        3,
        |p| seen.lock().unwrap().push(p.done),
    );
    let _ = std::panic::take_hook();
    // 99 keys to load: 10 errors (k % 10 == 7) and one panic (99).
    assert_eq!((report.loaded, report.skipped, report.failed), (88, 1, 11));
    assert!(conc.max.load(Ordering::SeqCst) <= 3);
    let mut seen = seen.into_inner().unwrap();
    seen.sort_unstable();
    assert_eq!(seen, (1..=100).collect::<Vec<_>>());
    assert_eq!(c.get(&42), Some(84));
    assert_eq!(c.get(&17), None);
}

#[test]
fn warm_with_no_keys_or_zero_concurrency_does_not_panic() {
    let c: C = Cache::builder().max_capacity(10).build().unwrap();
    assert_eq!(c.warm(Vec::new(), |k| Ok::<_, ()>(*k), 0).loaded, 0);
    assert_eq!(c.warm(0..3u64, |k| Ok::<_, ()>(*k), 0).loaded, 3);
}
