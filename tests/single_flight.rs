//! Single flight: one load per missing key, shared results, errors, panics, deadlines,
//! forget, invalidation and inserts racing a load. No test sleeps: a leader's loader is held
//! until the test has seen the waiters join (through `coalesced_waits`).

mod common;

use common::{await_waiters, held_load};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::Duration;

use herdcache::{Cache, LoadError, ManualClock};

type C = Cache<u64, u64>;

/// How long a test waits for another thread before it fails instead of hanging.
const BOUND: Duration = Duration::from_secs(30);

#[test]
fn concurrent_misses_run_the_loader_once_and_share_its_value() {
    let c = common::bounded(1_000);
    let calls = AtomicUsize::new(0);
    let n = 8;
    let barrier = Barrier::new(n);
    let results: Vec<u64> = thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|_| {
                s.spawn(|| {
                    barrier.wait();
                    c.get_or_load(&1, |k| {
                        calls.fetch_add(1, Ordering::SeqCst);
                        await_waiters(&c, n as u64 - 1);
                        Ok::<_, ()>(k + 100)
                    })
                    .unwrap()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert!(results.iter().all(|v| *v == 101));
    let s = c.stats();
    assert_eq!((s.loads, s.coalesced_waits), (1, n as u64 - 1));
    // Published before the waiters woke: a plain get hits.
    assert_eq!(c.get(&1), Some(101));
}

#[test]
fn an_error_reaches_every_waiter_and_is_not_cached() {
    let c = common::bounded(1_000);
    let n = 4;
    let barrier = Barrier::new(n);
    let errors: Vec<Arc<String>> = thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|_| {
                s.spawn(|| {
                    barrier.wait();
                    match c.get_or_load(&1, |_| {
                        await_waiters(&c, n as u64 - 1);
                        Err::<u64, _>("source down".to_owned())
                    }) {
                        Err(LoadError::Failed(e)) => e,
                        other => panic!("{other:?}"),
                    }
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(errors.windows(2).all(|w| Arc::ptr_eq(&w[0], &w[1])));
    assert_eq!(*errors[0], "source down");
    assert_eq!(c.stats().load_errors, 1);
    assert_eq!(c.get(&1), None);
    assert_eq!(c.get_or_load(&1, |_| Ok::<_, String>(5)).unwrap(), 5);
}

#[test]
fn a_panicking_loader_wakes_every_waiter_and_the_next_caller_loads_afresh() {
    let c = common::bounded(1_000);
    let waiters = 3;
    let leader = {
        let c = c.clone();
        thread::spawn(move || {
            c.get_or_load(&1, |_| -> Result<u64, ()> {
                await_waiters(&c, waiters);
                panic!("loader bug");
            })
        })
    };
    // Wait until the load is in flight, then join it.
    common::spin_until("the load started", || c.stats().loads > 0);
    let results: Vec<_> = (0..waiters)
        .map(|_| {
            let c = c.clone();
            thread::spawn(move || c.get_or_load(&1, |_| Ok::<_, ()>(9)))
        })
        .collect();
    // The panic continued in the leader.
    assert!(leader.join().is_err());
    // The leader panicked only after all of them had joined its flight.
    for r in results {
        assert!(matches!(r.join().unwrap(), Err(LoadError::Panicked)));
    }
    assert_eq!(c.stats().load_panics, 1);
    // Nothing is left in flight: the next caller loads afresh.
    assert_eq!(c.get_or_load(&1, |_| Ok::<_, ()>(10)).unwrap(), 10);
    assert_eq!(c.get(&1), Some(10));
}

#[test]
fn a_waiter_past_its_deadline_gets_the_stale_value_and_the_load_carries_on() {
    let clock = ManualClock::new();
    let c: C = Cache::builder()
        .max_capacity(10)
        .time_to_live(Duration::from_secs(10))
        .clock(clock.clone())
        .build()
        .unwrap();
    c.insert(1, 1);
    clock.advance(Duration::from_secs(11));
    let (release, leader) = held_load(&c, 1, 2);
    let r = c.get_or_load_timeout(&1, Duration::from_millis(20), |_| Ok::<_, ()>(99));
    assert_eq!(r.unwrap(), 1, "stale value");
    assert_eq!(c.stats().timeouts, 1);
    release.send(()).unwrap();
    assert_eq!(leader.join().unwrap(), 2);
    assert_eq!(c.get(&1), Some(2));
}

#[test]
fn a_waiter_past_its_deadline_without_a_stale_value_times_out() {
    let c = common::bounded(1_000);
    let (release, leader) = held_load(&c, 1, 2);
    let r = c.get_or_load_timeout(&1, Duration::ZERO, |_| Ok::<_, ()>(99));
    assert!(matches!(r, Err(LoadError::Timeout)), "{r:?}");
    release.send(()).unwrap();
    assert_eq!(leader.join().unwrap(), 2);
    assert_eq!(c.get(&1), Some(2));
}

#[test]
fn forget_detaches_a_load_and_wakes_its_waiters_to_look_again() {
    let c = common::bounded(1_000);
    let (release, leader) = held_load(&c, 1, 1);
    let (sent, waited) = mpsc::channel();
    {
        let c = c.clone();
        thread::spawn(move || sent.send(c.get_or_load(&1, |_| Ok::<_, ()>(99))));
    }
    await_waiters(&c, 1);
    assert!(c.forget(&1));
    assert!(!c.forget(&1));
    // The waiter is not left parked on the detached load: it looks again and, finding no
    // load in progress, leads a new one.
    let got = waited
        .recv_timeout(BOUND)
        .expect("the waiter of a forgotten load is still parked");
    assert_eq!(got, Ok(99));
    assert_eq!(c.get(&1), Some(99));
    release.send(()).unwrap();
    assert_eq!(leader.join().unwrap(), 1);
    assert_eq!(c.get(&1), Some(99), "the detached load must not overwrite");
    assert_eq!(c.stats().loads, 2);
}

#[test]
fn invalidate_during_a_load_keeps_its_result_out_of_the_cache() {
    let c = common::bounded(1_000);
    let (release, leader) = held_load(&c, 1, 1);
    assert!(!c.invalidate(&1), "a load in progress is not a value");
    release.send(()).unwrap();
    assert_eq!(leader.join().unwrap(), 1);
    assert_eq!(c.get(&1), None);
}

#[test]
fn insert_during_a_load_wins() {
    let c = common::bounded(1_000);
    let (release, leader) = held_load(&c, 1, 1);
    c.insert(1, 5);
    release.send(()).unwrap();
    assert_eq!(leader.join().unwrap(), 1);
    assert_eq!(c.get(&1), Some(5));
}

#[test]
fn a_loader_that_reenters_for_its_own_key_gets_an_error_not_a_deadlock() {
    let c = common::bounded(1_000);
    let inner = c.get_or_load(&1, |_| {
        let again = c.get_or_load(&1, |_| Ok::<_, ()>(0));
        assert!(matches!(again, Err(LoadError::Recursive)));
        // Other keys work from inside a loader.
        assert_eq!(c.get_or_load(&2, |_| Ok::<_, ()>(20)).unwrap(), 20);
        Ok::<_, ()>(10)
    });
    assert_eq!(inner.unwrap(), 10);
}

#[test]
fn negative_caching_keeps_an_error_for_its_ttl() {
    let clock = ManualClock::new();
    let c: C = Cache::builder()
        .max_capacity(10)
        .negative_ttl(Duration::from_secs(5))
        .clock(clock.clone())
        .build()
        .unwrap();
    let calls = AtomicUsize::new(0);
    let failing = |_: &u64| {
        calls.fetch_add(1, Ordering::SeqCst);
        Err::<u64, _>("nope")
    };
    assert!(matches!(
        c.get_or_load(&1, failing),
        Err(LoadError::Failed(_))
    ));
    assert!(matches!(
        c.get_or_load(&1, failing),
        Err(LoadError::Failed(_))
    ));
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(c.get(&1), None, "a cached error is not a value");
    clock.advance(Duration::from_secs(5));
    assert_eq!(c.get_or_load(&1, |_| Ok::<_, &str>(3)).unwrap(), 3);
}

#[test]
fn a_waiter_with_another_error_type_loads_itself_after_a_failure() {
    let c = common::bounded(1_000);
    let (release, gate) = mpsc::channel::<()>();
    let leader = {
        let c = c.clone();
        thread::spawn(move || {
            c.get_or_load(&1, |_| {
                gate.recv().unwrap();
                Err::<u64, _>(7u8)
            })
        })
    };
    common::spin_until("the load started", || c.stats().loads > 0);
    let waiter = {
        let c = c.clone();
        thread::spawn(move || c.get_or_load(&1, |_| Ok::<_, String>(4)))
    };
    await_waiters(&c, 1);
    release.send(()).unwrap();
    assert!(matches!(leader.join().unwrap(), Err(LoadError::Failed(_))));
    assert_eq!(waiter.join().unwrap().unwrap(), 4);
}

#[test]
fn a_load_error_converts_with_question_mark_and_reports_its_cause_once() {
    fn chain(e: &(dyn std::error::Error + 'static)) -> String {
        let mut out = e.to_string();
        let mut cur = e.source();
        while let Some(s) = cur {
            out += ": ";
            out += &s.to_string();
            cur = s.source();
        }
        out
    }
    let c = common::bounded(1_000);
    // Loader errors that are not `std::error::Error` themselves convert too.
    let boxed = || -> Result<u64, Box<dyn std::error::Error + Send + Sync>> {
        Ok(c.get_or_load(&1, |_| Err::<u64, _>("db down".to_owned()))?)
    };
    let e = boxed().unwrap_err();
    assert_eq!(
        chain(&*e),
        "loader failed: db down",
        "the cause appears once"
    );
    let io = || -> Result<u64, Box<dyn std::error::Error>> {
        Ok(c.get_or_load(&2, |_| {
            Err::<u64, _>(std::io::Error::other("connection reset"))
        })?)
    };
    assert_eq!(
        chain(&*io().unwrap_err()),
        "loader failed: connection reset"
    );
}

#[test]
fn an_idle_cache_reports_no_hit_ratio() {
    let c: C = common::bounded(1_000);
    assert_eq!(c.stats().hit_ratio(), 0.0);
}

/// A database error behind an anyhow context, as a service's loader returns it.
#[derive(Debug)]
struct DbDown;

impl std::fmt::Display for DbDown {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("connection refused")
    }
}

impl std::error::Error for DbDown {}

/// The loader's error is the `source()` of the cache's error, not part of its message, and
/// a chain reaches the loader's root cause: anyhow's `{:#}` shows every link once, and a
/// search of `chain()` finds the database's error. (The message used to carry the loader's
/// error and `source()` was `None`: `{:#}` printed "loader failed: loading user 1", and the
/// database's error could not be found.)
#[test]
fn a_loader_error_is_the_source_and_its_chain_reaches_the_root_cause() {
    use anyhow::Context;
    let c = common::bounded(1_000);
    let lookup = |id: u64| -> anyhow::Result<u64> {
        Ok(c.get_or_load(&id, |id| {
            Err::<u64, _>(DbDown).with_context(|| format!("loading user {id}"))
        })?)
    };
    let e = lookup(1).unwrap_err();
    assert_eq!(e.to_string(), "loader failed");
    assert_eq!(
        format!("{e:#}"),
        "loader failed: loading user 1: connection refused"
    );
    assert!(
        e.chain().any(|c| c.downcast_ref::<DbDown>().is_some()),
        "the chain reaches the database's error: {:?}",
        e.chain().map(|c| c.to_string()).collect::<Vec<_>>()
    );
    // A typed loader error is the source as itself shows, and is matched as itself.
    let typed = c.get_or_load(&2, |_| Err::<u64, _>(DbDown)).unwrap_err();
    let source = std::error::Error::source(&typed).expect("the loader's error");
    assert_eq!(source.to_string(), "connection refused");
    assert!(matches!(typed.failed(), Some(DbDown)));
}
