//! Every load ends (DESIGN.md §10 invariant 7): a loader that hangs holds neither its key,
//! nor its waiters, nor a load permit past the cache's `load_timeout`, and its late result
//! never replaces what came after it.
//!
//! The hung loaders here block on a channel that the test releases only at its end, so no
//! test depends on how long anything takes; the waits that follow a deadline are bounded
//! with a message.

mod common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::{Duration, Instant};

use herdcache::{Cache, LoadError, ManualClock, MAX_WARM_CONCURRENCY};

type C = Cache<u64, u64>;

const LOAD_TIMEOUT: Duration = Duration::from_millis(50);
/// How long a test waits for something that must happen about `LOAD_TIMEOUT` after it
/// started, on a loaded machine.
const BOUND: Duration = Duration::from_secs(20);

fn cache() -> C {
    Cache::builder()
        .max_capacity(100)
        .load_timeout(LOAD_TIMEOUT)
        .build()
        .unwrap()
}

/// A `get_or_load` of `key` on another thread whose loader blocks until the returned sender
/// fires (or is dropped), then returns `value`; returns once the loader runs.
fn hung_load(c: &C, key: u64, value: u64) -> (mpsc::Sender<()>, thread::JoinHandle<()>) {
    let (release, gate) = mpsc::channel::<()>();
    let (started, is_started) = mpsc::channel();
    let c = c.clone();
    let t = thread::spawn(move || {
        let _ = c.get_or_load(&key, |_| {
            started.send(()).unwrap();
            let _ = gate.recv();
            Ok::<_, ()>(value)
        });
    });
    is_started
        .recv_timeout(BOUND)
        .expect("the hung loader did not start");
    (release, t)
}

/// Runs `f` on another thread and returns its result, failing the test if it takes longer
/// than `BOUND`.
fn within_bound<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || tx.send(f()).unwrap());
    rx.recv_timeout(BOUND)
        .unwrap_or_else(|_| panic!("{what}: still blocked after {BOUND:?}"))
}

#[test]
fn a_waiter_of_a_hung_load_gets_a_timeout_error_and_the_next_caller_loads_afresh() {
    let c = cache();
    let (release, leader) = hung_load(&c, 1, 1);
    let waiter = c.clone();
    let r = within_bound("a plain get_or_load waiter", move || {
        waiter.get_or_load(&1, |_| Ok::<_, ()>(99))
    });
    assert_eq!(r, Err(LoadError::LoadTimedOut));
    assert!(c.stats().load_timeouts >= 1);
    // The key is not stuck: the next caller starts its own load.
    let next = c.clone();
    let r = within_bound("the next caller", move || {
        next.get_or_load(&1, |_| Ok::<_, ()>(2))
    });
    assert_eq!(r, Ok(2));
    // The hung loader returns at last: its result is refused.
    release.send(()).unwrap();
    leader.join().unwrap();
    assert_eq!(
        c.get(&1),
        Some(2),
        "a late result must not replace a newer value"
    );
}

#[test]
fn a_caller_with_its_own_deadline_no_longer_times_out_forever() {
    let c = cache();
    let (release, leader) = hung_load(&c, 1, 1);
    let caller = c.clone();
    let r = within_bound("get_or_load_timeout after the load's deadline", move || {
        thread::sleep(LOAD_TIMEOUT * 2);
        caller.get_or_load_timeout(&1, Duration::from_secs(60), |_| Ok::<_, ()>(3))
    });
    assert_eq!(r, Ok(3), "past the load's deadline a new load starts");
    drop(release);
    leader.join().unwrap();
    assert_eq!(c.get(&1), Some(3));
}

#[test]
fn waiters_get_the_replaced_value_only_within_the_staleness_bound() {
    for (expired_ago, stale_served) in [(Duration::from_secs(1), true), (30 * DAY, false)] {
        let clock = ManualClock::new();
        let c: C = Cache::builder()
            .max_capacity(100)
            .time_to_live(Duration::from_secs(10))
            .max_stale(Duration::from_secs(60))
            .load_timeout(LOAD_TIMEOUT)
            .clock(clock.clone())
            .build()
            .unwrap();
        c.insert(1, 7);
        clock.advance(Duration::from_secs(10) + expired_ago);
        let (release, leader) = hung_load(&c, 1, 1);
        // A waiter at its own deadline, and a waiter of the load's deadline.
        let own = c.get_or_load_timeout(&1, Duration::ZERO, |_| Ok::<_, ()>(99));
        let waiter = c.clone();
        let load = within_bound("a waiter of a hung load", move || {
            waiter.get_or_load(&1, |_| Ok::<_, ()>(99))
        });
        if stale_served {
            assert_eq!((own, load), (Ok(7), Ok(7)), "expired {expired_ago:?} ago");
        } else {
            assert_eq!(
                (own, load),
                (Err(LoadError::Timeout), Err(LoadError::LoadTimedOut)),
                "a value expired {expired_ago:?} ago is never served"
            );
        }
        drop(release);
        leader.join().unwrap();
    }
}

const DAY: Duration = Duration::from_secs(86_400);

#[test]
fn hung_loads_give_their_permits_back_at_their_deadline() {
    let c: C = Cache::builder()
        .max_capacity(100)
        .max_concurrent_loads(2)
        .load_timeout(LOAD_TIMEOUT)
        .build()
        .unwrap();
    let (r1, l1) = hung_load(&c, 1, 1);
    let (r2, l2) = hung_load(&c, 2, 2);
    // Every permit is held by a hung load, and nobody touches their keys again: a miss on
    // another key still gets a permit once their deadline has passed.
    let other = c.clone();
    let r = within_bound("a miss on another key", move || {
        other.get_or_load(&3, |_| Ok::<_, ()>(30))
    });
    assert_eq!(r, Ok(30));
    let other = c.clone();
    let r = within_bound("a second miss", move || {
        other.get_or_load(&4, |_| Ok::<_, ()>(40))
    });
    assert_eq!(r, Ok(40));
    drop((r1, r2));
    l1.join().unwrap();
    l2.join().unwrap();
    // The hung loads' late releases did not mint extra permits: still two at once (unless a
    // load of this phase itself outlived its deadline on a loaded machine, which would let
    // its permit be taken back legitimately).
    let running = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let longest = Arc::new(std::sync::Mutex::new(Duration::ZERO));
    thread::scope(|s| {
        for k in 10..16u64 {
            let (c, running, most, longest) = (
                c.clone(),
                Arc::clone(&running),
                Arc::clone(&most),
                Arc::clone(&longest),
            );
            s.spawn(move || {
                c.get_or_load(&k, |k| {
                    let started = Instant::now();
                    let n = running.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(n, Ordering::SeqCst);
                    thread::sleep(Duration::from_millis(5));
                    running.fetch_sub(1, Ordering::SeqCst);
                    let took = started.elapsed();
                    let mut l = longest.lock().unwrap();
                    *l = (*l).max(took);
                    Ok::<_, ()>(*k)
                })
                .unwrap();
            });
        }
    });
    let (most, longest) = (most.load(Ordering::SeqCst), *longest.lock().unwrap());
    assert!(
        most <= 2 || longest >= LOAD_TIMEOUT,
        "{most} loads at once with 2 permits, none past its deadline (longest {longest:?})"
    );
}

#[test]
fn forget_wakes_the_waiters_and_returns_the_permit() {
    // No load timeout here: `forget` alone must free both.
    let c: C = Cache::builder()
        .max_capacity(100)
        .max_concurrent_loads(1)
        .build()
        .unwrap();
    let (release, leader) = common::held_load(&c, 1, 1);
    let waiter = {
        let c = c.clone();
        thread::spawn(move || c.get_or_load(&1, |_| Ok::<_, ()>(5)))
    };
    let bound = Instant::now() + BOUND;
    while c.stats().coalesced_waits < 1 {
        assert!(Instant::now() < bound, "the waiter never joined the load");
        thread::yield_now();
    }
    assert!(c.forget(&1));
    // The permit is back: the woken waiter (or a miss on another key) can load at once.
    let other = c.clone();
    let r = within_bound("a miss after forget", move || {
        other.get_or_load(&2, |_| Ok::<_, ()>(20))
    });
    assert_eq!(r, Ok(20));
    let w = within_bound("the forgotten load's waiter", move || {
        waiter.join().unwrap()
    });
    assert_eq!(w, Ok(5));
    release.send(()).unwrap();
    assert_eq!(leader.join().unwrap(), 1);
    assert_eq!(c.get(&1), Some(5));
}

#[test]
fn warm_returns_despite_a_hung_loader() {
    // A deadline long enough that no quick load is given up on, even on a loaded machine.
    let c: C = Cache::builder()
        .max_capacity(100)
        .load_timeout(Duration::from_millis(500))
        .build()
        .unwrap();
    let (release, gate) = mpsc::channel::<()>();
    let gate = Arc::new(std::sync::Mutex::new(gate));
    let report = within_bound("warm with a hung loader", {
        let c = c.clone();
        move || {
            c.warm(
                0..20u64,
                move |k| {
                    if *k == 3 {
                        let _ = gate.lock().unwrap().recv();
                    }
                    Ok::<_, ()>(*k)
                },
                4,
            )
        }
    });
    assert_eq!((report.loaded, report.failed), (19, 1));
    assert_eq!(c.get(&3), None);
    drop(release);
}

#[test]
fn warm_never_runs_more_loads_at_once_than_its_bounds() {
    for limit in [None, Some(3)] {
        let mut b = Cache::builder().max_capacity(10_000);
        if let Some(n) = limit {
            b = b.max_concurrent_loads(n);
        }
        let c: C = b.build().unwrap();
        let running = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let (r, m) = (Arc::clone(&running), Arc::clone(&most));
        let report = c.warm(
            0..2_000u64,
            move |k| {
                let n = r.fetch_add(1, Ordering::SeqCst) + 1;
                m.fetch_max(n, Ordering::SeqCst);
                thread::yield_now();
                r.fetch_sub(1, Ordering::SeqCst);
                Ok::<_, ()>(*k)
            },
            usize::MAX,
        );
        assert_eq!(report.loaded, 2_000);
        let bound = limit.unwrap_or(MAX_WARM_CONCURRENCY);
        assert!(
            most.load(Ordering::SeqCst) <= bound,
            "{} loads at once, bound {bound}",
            most.load(Ordering::SeqCst)
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_inline_loader_future_is_dropped_at_its_deadline() {
    let c = cache();
    let dropped = Arc::new(AtomicBool::new(false));
    struct OnDrop(Arc<AtomicBool>);
    impl Drop for OnDrop {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }
    let guard = OnDrop(Arc::clone(&dropped));
    let leader = c.get_or_load_async(&1, move |_| async move {
        let _guard = guard;
        std::future::pending::<Result<u64, ()>>().await
    });
    let r = tokio::time::timeout(BOUND, leader)
        .await
        .expect("the leading future did not end at its load's deadline");
    assert_eq!(r, Err(LoadError::LoadTimedOut));
    assert!(
        dropped.load(Ordering::SeqCst),
        "the loader future was not dropped"
    );
    assert_eq!(
        c.get_or_load_async(&1, |_| async { Ok::<_, ()>(2) }).await,
        Ok(2)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_async_waiter_of_a_hung_thread_load_wakes_at_its_deadline() {
    let c = cache();
    let (release, leader) = hung_load(&c, 1, 1);
    let r = tokio::time::timeout(BOUND, c.get_or_load_async(&1, |_| async { Ok::<_, ()>(9) }))
        .await
        .expect("the waiting future did not wake at the load's deadline");
    assert_eq!(r, Err(LoadError::LoadTimedOut));
    drop(release);
    leader.join().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spawned_loader_is_cancelled_at_its_deadline() {
    let c: C = Cache::builder()
        .max_capacity(100)
        .load_timeout(LOAD_TIMEOUT)
        .spawner(herdcache::TokioSpawner::current().unwrap())
        .build()
        .unwrap();
    let dropped = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&dropped);
    let r = tokio::time::timeout(
        BOUND,
        c.get_or_load_spawned(&1, move |_| async move {
            struct OnDrop(Arc<AtomicBool>);
            impl Drop for OnDrop {
                fn drop(&mut self) {
                    self.0.store(true, Ordering::SeqCst);
                }
            }
            let _guard = OnDrop(flag);
            std::future::pending::<Result<u64, ()>>().await
        }),
    )
    .await
    .expect("the spawned load did not end at its deadline");
    assert_eq!(r, Err(LoadError::LoadTimedOut));
    let bound = Instant::now() + BOUND;
    while !dropped.load(Ordering::SeqCst) {
        assert!(
            Instant::now() < bound,
            "the spawned loader future was never dropped"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[test]
fn a_refresh_job_run_after_its_deadline_does_not_load() {
    let clock = ManualClock::new();
    let spawner = common::Queued::default();
    let jobs = Arc::clone(&spawner.0);
    let c: C = Cache::builder()
        .max_capacity(100)
        .time_to_live(Duration::from_secs(60))
        .refresh_after(Duration::from_secs(10))
        .load_timeout(LOAD_TIMEOUT)
        .clock(clock.clone())
        .spawner(spawner)
        .build()
        .unwrap();
    c.insert(1, 1);
    clock.advance(Duration::from_secs(11));
    let loads = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&loads);
    let r = c.get_or_load_background(&1, move |_| {
        counted.fetch_add(1, Ordering::SeqCst);
        Ok::<_, ()>(2)
    });
    assert_eq!(r, Ok(1), "the refresh went to the spawner");
    // The spawner sits on the job past the load's deadline; a reader detaches the load.
    thread::sleep(LOAD_TIMEOUT * 2);
    assert_eq!(
        c.get_or_load(&1, |_| Ok::<_, ()>(3)),
        Ok(1),
        "the value is still valid"
    );
    let job = jobs.lock().unwrap().pop().expect("a queued refresh");
    job.run();
    assert_eq!(
        loads.load(Ordering::SeqCst),
        0,
        "a detached refresh must not load"
    );
}

/// No caller waits for a permit past its load's deadline (DESIGN.md §10 invariant 7): with
/// every permit held by hung loads and other callers queued ahead of it, a caller gives up
/// `load_timeout` after it began to wait, without running its loader. (It used to wait for
/// its turn however long the queue, and could park for ever when the permit it waited for
/// was leased after it parked: `pacing.rs`'s test of that case.)
#[test]
fn a_caller_queued_for_a_permit_gives_up_at_its_load_deadline() {
    // Long enough that the callers queued ahead of the last one are served in order.
    const LONG: Duration = Duration::from_secs(1);
    let c: C = Cache::builder()
        .max_capacity(100)
        .max_concurrent_loads(1)
        .load_timeout(LONG)
        .build()
        .unwrap();
    let (release, gate) = mpsc::channel::<()>();
    let gate = Arc::new(std::sync::Mutex::new(gate));
    let (r1, l1) = hung_load(&c, 1, 1);
    // Four more callers queue for the permit; each hangs in its loader if it gets one.
    let queued: Vec<_> = (2..6u64)
        .map(|k| {
            let (c, gate) = (c.clone(), Arc::clone(&gate));
            thread::spawn(move || {
                let _ = c.get_or_load(&k, |_| {
                    let _ = gate.lock().unwrap().recv();
                    Ok::<_, ()>(k)
                });
            })
        })
        .collect();
    common::spin_until("four callers queued for the permit", || {
        c.stats().throttled >= 4
    });
    let ran = Arc::new(AtomicBool::new(false));
    let (c2, ran2) = (c.clone(), Arc::clone(&ran));
    let r = within_bound("a caller queued for a permit", move || {
        c2.get_or_load(&9, |_| {
            ran2.store(true, Ordering::SeqCst);
            Ok::<_, ()>(90)
        })
    });
    assert_eq!(r, Err(LoadError::LoadTimedOut));
    assert!(!ran.load(Ordering::SeqCst), "the caller's loader ran");
    drop((r1, release));
    l1.join().unwrap();
    for t in queued {
        t.join().unwrap();
    }
}

/// A refresh that hangs is detached at its `load_timeout` by the next caller of its key, as
/// any load is, though its value is still valid (DESIGN.md §10 invariant 7): the value stays,
/// and a new refresh follows after the failure's backoff. (The readers used to be served
/// the value without looking at the refresh's deadline, so the hung refresh held the key
/// until the hard expiry: no new refresh, no load timed out.)
#[test]
fn a_hung_refresh_is_detached_at_its_deadline_while_its_value_is_still_valid() {
    let clock = ManualClock::new();
    let c: C = Cache::builder()
        .max_capacity(100)
        .time_to_live(Duration::from_secs(4))
        .refresh_after(Duration::from_millis(100))
        .load_timeout(LOAD_TIMEOUT)
        .clock(clock.clone())
        .build()
        .unwrap();
    c.insert(1, 1);
    clock.advance(Duration::from_millis(150));
    // Due: this caller wins the refresh, and its loader hangs.
    let (release, leader) = hung_load(&c, 1, 2);
    let reader = c.clone();
    let detached = within_bound("a reader detaching the hung refresh", move || {
        while reader.stats().load_timeouts == 0 {
            assert_eq!(reader.get_or_load(&1, |_| Ok::<_, ()>(9)), Ok(1));
            thread::sleep(LOAD_TIMEOUT / 5);
        }
        reader.stats().load_timeouts
    });
    assert_eq!(detached, 1);
    assert_eq!(c.get(&1), Some(1), "the still-valid value stays");
    // The next refresh waits for the failure's backoff, then loads.
    clock.advance(Duration::from_millis(250));
    assert_eq!(c.get_or_load(&1, |_| Ok::<_, ()>(3)), Ok(3));
    drop(release);
    leader.join().unwrap();
    assert_eq!(c.get(&1), Some(3), "the late refresh is refused");
}
