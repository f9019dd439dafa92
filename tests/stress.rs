//! Stress: many threads and keys, loaders that randomly fail, panic or stall, expiries, and
//! (in the second phase) concurrent invalidations and inserts. Asserts that no caller hangs
//! (every worker finishes within a generous bound), that a key never has two loads at once
//! when nothing detaches them, and that every value is dropped exactly once.

mod common;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::Duration;

use common::Tracked;
use herdcache::{Cache, LoadError, ManualClock};

const THREADS: u64 = 4;
const KEYS: u64 = 32;
const OPS: u64 = 3_000;

/// A tiny deterministic generator per thread.
struct XorShift(u64);
impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

fn run_phase(detaching: bool) {
    let drops = Arc::new(AtomicUsize::new(0));
    let made = Arc::new(AtomicUsize::new(0));
    let loads_in_flight: Arc<Vec<AtomicUsize>> =
        Arc::new((0..KEYS).map(|_| AtomicUsize::new(0)).collect());
    let overlaps = Arc::new(AtomicUsize::new(0));
    let clock = ManualClock::new();
    {
        let cache: Cache<u64, Arc<Tracked>> = Cache::builder()
            .max_capacity(KEYS / 2) // evictions too
            .time_to_live(Duration::from_millis(5))
            .clock(clock.clone())
            .build()
            .unwrap();
        let (done, finished) = mpsc::channel();
        let workers: Vec<_> = (0..THREADS)
            .map(|t| {
                let (cache, drops, made) = (cache.clone(), drops.clone(), made.clone());
                let (in_flight, overlaps, clock, done) = (
                    loads_in_flight.clone(),
                    overlaps.clone(),
                    clock.clone(),
                    done.clone(),
                );
                thread::spawn(move || {
                    let mut rng = XorShift(0x9E37_79B9 ^ ((t + 1) * 0x1234_5677));
                    for i in 0..OPS {
                        let k = rng.next() % KEYS;
                        let roll = rng.next() % 100;
                        if t == 0 && i % 50 == 0 {
                            clock.advance(Duration::from_millis(1));
                        }
                        if detaching && roll < 4 {
                            cache.invalidate(&k);
                            continue;
                        }
                        if detaching && roll < 8 {
                            made.fetch_add(1, Ordering::Relaxed);
                            cache.insert(k, Arc::new(Tracked::new(k, &drops)));
                            continue;
                        }
                        let outcome = rng.next() % 100;
                        let stall = rng.next() % 50;
                        let r = catch_unwind(AssertUnwindSafe(|| {
                            cache.get_or_load_timeout(&k, Duration::from_secs(30), |k| {
                                if in_flight[*k as usize].fetch_add(1, Ordering::SeqCst) != 0 {
                                    overlaps.fetch_add(1, Ordering::SeqCst);
                                }
                                for _ in 0..stall {
                                    thread::yield_now();
                                }
                                in_flight[*k as usize].fetch_sub(1, Ordering::SeqCst);
                                match outcome {
                                    0..=9 => Err("source error"),
                                    10..=14 => panic!("{}: loader", common::EXPECTED_PANIC),
                                    _ => {
                                        made.fetch_add(1, Ordering::Relaxed);
                                        Ok(Arc::new(Tracked::new(*k, &drops)))
                                    }
                                }
                            })
                        }));
                        match r {
                            Ok(Ok(v)) => assert_eq!(v.id, k),
                            Ok(Err(LoadError::Failed(_) | LoadError::Panicked)) | Err(_) => {}
                            Ok(Err(e)) => panic!("unexpected {e:?} (a 30 s wait timed out?)"),
                        }
                    }
                    done.send(t).unwrap();
                })
            })
            .collect();
        drop(done);
        for _ in 0..THREADS {
            finished
                .recv_timeout(Duration::from_secs(120))
                .expect("a worker hung: some waiter was never woken");
        }
        for w in workers {
            w.join().unwrap();
        }
        assert!(cache.entry_count() <= KEYS / 2);
        let s = cache.stats();
        assert!(
            s.loads > 0 && s.load_errors > 0 && s.load_panics > 0,
            "{s:?}"
        );
    }
    if !detaching {
        assert_eq!(
            overlaps.load(Ordering::SeqCst),
            0,
            "two loads of one key at once"
        );
    }
    assert_eq!(drops.load(Ordering::Relaxed), made.load(Ordering::Relaxed));
}

#[test]
fn loads_failures_panics_and_expiries_leave_nothing_stuck() {
    common::expect_panics();
    run_phase(false);
    run_phase(true);
}

/// Loads that outlive their deadline, `forget`s, invalidations and inserts, with a load
/// limit: every caller returns (waiters of a hung load at its deadline, permits taken back),
/// the cache stays within capacity, and every value made is dropped exactly once.
#[test]
fn hung_loads_forgets_and_deadlines_strand_nobody() {
    let drops = Arc::new(AtomicUsize::new(0));
    let made = Arc::new(AtomicUsize::new(0));
    let timeouts;
    {
        let cache: Cache<u64, Arc<Tracked>> = Cache::builder()
            .max_capacity(KEYS / 2)
            .time_to_live(Duration::from_millis(30))
            .max_concurrent_loads(3)
            .load_timeout(Duration::from_millis(10))
            .build()
            .unwrap();
        let (done, finished) = mpsc::channel();
        for t in 0..THREADS {
            let (cache, drops, made, done) =
                (cache.clone(), drops.clone(), made.clone(), done.clone());
            thread::spawn(move || {
                let mut rng = XorShift(0xC0FF_EE00 ^ ((t + 1) * 0x9E37_79B9));
                for _ in 0..300 {
                    let k = rng.next() % KEYS;
                    match rng.next() % 100 {
                        0..=4 => {
                            cache.forget(&k);
                        }
                        5..=9 => {
                            cache.invalidate(&k);
                        }
                        10..=14 => {
                            made.fetch_add(1, Ordering::Relaxed);
                            cache.insert(k, Arc::new(Tracked::new(k, &drops)));
                        }
                        roll => {
                            // One load in ten outlives its deadline (a sync loader cannot be
                            // stopped: it returns late, and its result must not be cached).
                            let hang = roll >= 90;
                            let r = catch_unwind(AssertUnwindSafe(|| {
                                cache.get_or_load(&k, |k| {
                                    if hang {
                                        thread::sleep(Duration::from_millis(25));
                                    } else {
                                        thread::yield_now();
                                    }
                                    made.fetch_add(1, Ordering::Relaxed);
                                    Ok::<_, ()>(Arc::new(Tracked::new(*k, &drops)))
                                })
                            }));
                            match r {
                                Ok(Ok(v)) => assert_eq!(v.id, k),
                                Ok(Err(LoadError::LoadTimedOut)) => {}
                                other => panic!("unexpected {:?}", other.map(|r| r.map(|v| v.id))),
                            }
                        }
                    }
                }
                done.send(t).unwrap();
            });
        }
        drop(done);
        for _ in 0..THREADS {
            finished
                .recv_timeout(Duration::from_secs(120))
                .expect("a worker hung: a waiter or a permit was stranded");
        }
        // And one load that surely outlives its deadline while another caller waits on it
        // (its loader is held until that caller has its answer).
        let (started, is_started) = mpsc::channel();
        let (release, gate) = mpsc::channel::<()>();
        let hung = {
            let (cache, drops, made) = (cache.clone(), drops.clone(), made.clone());
            thread::spawn(move || {
                let _ = cache.get_or_load(&999, |_| {
                    started.send(()).unwrap();
                    let _ = gate.recv();
                    made.fetch_add(1, Ordering::Relaxed);
                    Ok::<_, ()>(Arc::new(Tracked::new(999, &drops)))
                });
            })
        };
        is_started
            .recv_timeout(Duration::from_secs(30))
            .expect("the held load did not start");
        let r = cache.get_or_load(&999, |_| Err::<Arc<Tracked>, _>(()));
        assert!(
            matches!(r, Err(LoadError::LoadTimedOut)),
            "{:?}",
            r.map(|v| v.id)
        );
        release.send(()).unwrap();
        hung.join().unwrap();
        assert!(cache.entry_count() <= KEYS / 2);
        timeouts = cache.stats().load_timeouts;
    }
    assert!(
        timeouts > 0,
        "no load outlived its deadline: the test tested nothing"
    );
    assert_eq!(drops.load(Ordering::Relaxed), made.load(Ordering::Relaxed));
}
