//! loom models of single flight and early refresh: one winner among concurrent misses, no
//! lost wake-up between a waiter's registration and the completion, a panicking leader, a
//! waiter abandoning at its deadline, and a refresh racing an invalidation.
#![cfg(herdcache_loom)]

mod common;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::Duration;

use herdcache::{Cache, LoadError, ManualClock};
use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::thread;

use common::{cache, model, Fixed};

/// A value whose halves must agree: a waiter that sees a half-published value notices.
type Pair = (u64, u64);

fn pair(v: u64) -> Pair {
    (v, !v)
}

fn check(p: Pair) -> u64 {
    assert_eq!(p.1, !p.0, "torn value");
    p.0
}

type C = Cache<u64, Pair, Fixed>;

fn quiet_panics() {
    std::panic::set_hook(Box::new(|_| {}));
}

/// Two concurrent misses: the loader runs once, and both callers (the waiter included, woken
/// or arriving late) see the fully published value.
#[test]
fn concurrent_misses_elect_one_loader() {
    model(|| {
        let c: C = cache();
        let calls = Arc::new(AtomicUsize::new(0));
        let spawn = |c: C, calls: Arc<AtomicUsize>| {
            thread::spawn(move || {
                c.get_or_load(&1, |_| {
                    calls.fetch_add(1, Ordering::Relaxed);
                    Ok::<_, ()>(pair(7))
                })
                .map(check)
            })
        };
        let a = spawn(c.clone(), Arc::clone(&calls));
        let b = spawn(c.clone(), Arc::clone(&calls));
        assert_eq!(a.join().unwrap(), Ok(7));
        assert_eq!(b.join().unwrap(), Ok(7));
        assert_eq!(calls.load(Ordering::Relaxed), 1);
        assert_eq!(c.get(&1).map(check), Some(7));
    });
}

/// A leader that panics wakes its waiter with `Panicked` (or the waiter loads afresh after
/// the cleanup); nobody is left parked (loom reports a deadlock otherwise), the panic reaches
/// the leader's caller, and a later caller can load.
#[test]
fn a_panicking_leader_strands_nobody() {
    quiet_panics();
    model(|| {
        let c: C = cache();
        let c1 = c.clone();
        let leader = thread::spawn(move || {
            catch_unwind(AssertUnwindSafe(|| {
                let _ = c1.get_or_load(&1, |_| -> Result<Pair, ()> { panic!("loader bug") });
            }))
            .is_err()
        });
        let c2 = c.clone();
        let other = thread::spawn(move || c2.get_or_load(&1, |_| Ok::<_, ()>(pair(9))));
        let other = other.join().unwrap();
        let panicked = leader.join().unwrap();
        match other {
            // Waited on the panicking load.
            Err(LoadError::Panicked) => assert!(panicked),
            // Loaded itself: first (the other thread then hit and never ran its loader) or
            // after the panicking load was cleaned up.
            Ok(v) => assert_eq!(check(v), 9),
            Err(e) => panic!("unexpected {e:?}"),
        }
        let again = c.get_or_load(&1, |_| Ok::<_, ()>(pair(9))).map(check);
        assert_eq!(again, Ok(9));
    });
}

/// A waiter whose deadline passes at any point relative to the completion either gets the
/// value or gives up with `Timeout`, and the load completes and is cached either way.
#[test]
fn an_abandoning_waiter_races_the_completion() {
    model(|| {
        let c: C = cache();
        let c1 = c.clone();
        let leader = thread::spawn(move || c1.get_or_load(&1, |_| Ok::<_, ()>(pair(3))));
        let r = c.get_or_load_timeout(&1, Duration::ZERO, |_| Ok::<_, ()>(pair(3)));
        assert!(
            matches!(r, Err(LoadError::Timeout)) || r.map(check) == Ok(3),
            "unexpected result"
        );
        assert_eq!(leader.join().unwrap().map(check), Ok(3));
        assert_eq!(c.get(&1).map(check), Some(3));
    });
}

/// A load's deadline racing its completion: a second caller meets a load in flight whose
/// deadline has passed (loom makes every deadline check find it passed, at every point
/// relative to the leader's completion). Either the leader claims the flight first and its
/// value is what both get, or the second caller detaches it and loads its own value: the
/// cache then holds that one, never the detached load's late result, and nobody is stranded.
#[test]
fn a_load_deadline_races_the_completion() {
    model(|| {
        let c: C = Cache::builder()
            .max_capacity(8)
            .hasher(Fixed::default())
            .load_timeout(Duration::from_nanos(1))
            .build()
            .unwrap();
        let started = Arc::new(AtomicUsize::new(0));
        let (c1, s1) = (c.clone(), Arc::clone(&started));
        let a = thread::spawn(move || {
            c1.get_or_load(&1, |_| {
                s1.store(1, Ordering::Release);
                Ok::<_, ()>(pair(1))
            })
        });
        while started.load(Ordering::Acquire) == 0 {
            thread::yield_now();
        }
        let rb = c.get_or_load(&1, |_| Ok::<_, ()>(pair(2))).map(check);
        let ra = a.join().unwrap().map(check);
        assert_eq!(ra, Ok(1), "the leader's caller gets its own value");
        let left = c.get(&1).map(check);
        match rb {
            Ok(v) => assert_eq!(left, Some(v), "the cache holds what the last caller got"),
            other => panic!("the second caller got {other:?}"),
        }
    });
}

fn refreshing_cache(clock: &ManualClock) -> C {
    let c = Cache::builder()
        .max_capacity(8)
        .hasher(Fixed::default())
        .time_to_live(Duration::from_secs(60))
        .refresh_after(Duration::from_secs(10))
        .clock(clock.clone())
        .build()
        .unwrap();
    c.get_or_load(&1, |_| Ok::<_, ()>(pair(1))).unwrap();
    clock.advance(Duration::from_secs(11));
    c
}

/// A refresh racing an invalidation never puts a value back after the invalidation removed
/// it: afterwards the key holds nothing, or the refresh's value if the refresh started after
/// the invalidation (then it was an ordinary load), never the old value.
#[test]
fn a_refresh_never_repopulates_after_an_invalidation() {
    model(|| {
        let clock = ManualClock::new();
        let c = refreshing_cache(&clock);
        let c1 = c.clone();
        let refresher = thread::spawn(move || c1.get_or_load(&1, |_| Ok::<_, ()>(pair(2))));
        c.invalidate(&1);
        let got = refresher.join().unwrap().map(check);
        assert!(got == Ok(1) || got == Ok(2), "refresher saw {got:?}");
        let left = c.get(&1).map(check);
        assert_ne!(left, Some(1), "the old value came back");
    });
}

/// Two readers of a key due for refresh: one refresh runs; the other reader is served the
/// current value (or the new one), without waiting.
#[test]
fn one_refresh_per_entry() {
    model(|| {
        let clock = ManualClock::new();
        let c = refreshing_cache(&clock);
        let calls = Arc::new(AtomicUsize::new(0));
        let spawn = |c: C, calls: Arc<AtomicUsize>| {
            thread::spawn(move || {
                c.get_or_load(&1, |_| {
                    calls.fetch_add(1, Ordering::Relaxed);
                    Ok::<_, ()>(pair(2))
                })
                .map(check)
            })
        };
        let a = spawn(c.clone(), Arc::clone(&calls));
        let b = spawn(c.clone(), Arc::clone(&calls));
        for r in [a.join().unwrap(), b.join().unwrap()] {
            assert!(r == Ok(1) || r == Ok(2), "{r:?}");
        }
        assert_eq!(calls.load(Ordering::Relaxed), 1);
        assert_eq!(c.get(&1).map(check), Some(2));
    });
}

/// A refresh past its deadline is detached by a reader who meets it, though the value it
/// refreshes is still valid (DESIGN.md §10 invariant 7): loom finds every deadline passed, so
/// the reader detaches the refresh its loader is still running, whatever the interleaving
/// of the detach with the refresh's install and the reader's own looks. The value stays, the
/// reader gets it, and the refresh's late result is refused.
#[test]
fn a_reader_detaches_a_refresh_past_its_deadline() {
    model(|| {
        let clock = ManualClock::new();
        let c: C = Cache::builder()
            .max_capacity(8)
            .hasher(Fixed::default())
            .time_to_live(Duration::from_secs(60))
            .refresh_after(Duration::from_secs(10))
            .load_timeout(Duration::from_secs(1))
            .clock(clock.clone())
            .build()
            .unwrap();
        c.insert(1, pair(1));
        clock.advance(Duration::from_secs(11));
        // 0: not started; 1: the refresh's loader runs; 2: the reader is done.
        let stage = Arc::new(AtomicUsize::new(0));
        let (c1, s1) = (c.clone(), Arc::clone(&stage));
        let refresher = thread::spawn(move || {
            c1.get_or_load(&1, |_| {
                s1.store(1, Ordering::Release);
                // Hung until the reader is done.
                while s1.load(Ordering::Acquire) != 2 {
                    thread::yield_now();
                }
                Ok::<_, ()>(pair(2))
            })
            .map(check)
        });
        while stage.load(Ordering::Acquire) == 0 {
            thread::yield_now();
        }
        let read = c.get_or_load(&1, |_| Ok::<_, ()>(pair(3))).map(check);
        stage.store(2, Ordering::Release);
        assert_eq!(read, Ok(1), "the still-valid value is served");
        assert_eq!(refresher.join().unwrap(), Ok(2), "its own caller gets it");
        assert_eq!(
            c.stats().load_timeouts,
            1,
            "the reader detached the refresh"
        );
        assert_eq!(c.get(&1).map(check), Some(1), "the late refresh is refused");
    });
}
