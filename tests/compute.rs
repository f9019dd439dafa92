//! `Cache::compute`: an atomic read-modify-write of one key, ordered with the key's loads
//! and writes as single flight orders them, and seen by the listener, expiry and admission as
//! an insert or an invalidation is.

mod common;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{mpsc, Arc, Mutex};
use std::thread;
use std::time::Duration;

use common::held_load;
use herdcache::{Cache, Compute, Computed, ManualClock, RemovalCause};

type C = Cache<u64, u64>;

fn bump(v: Option<&u64>) -> Compute<u64> {
    Compute::Put(v.map_or(1, |n| n + 1))
}

/// Starts a compute of `key` that bumps it on another thread, once the returned sender
/// fires; returns when its closure is running (as `common::held_load` holds a load).
fn held_compute(c: &C, key: u64) -> (mpsc::Sender<()>, thread::JoinHandle<Computed<u64>>) {
    let (started, is_started) = mpsc::channel();
    let (release, gate) = mpsc::channel::<()>();
    let c = c.clone();
    let computing = thread::spawn(move || {
        c.compute(&key, |v| {
            started.send(()).unwrap();
            gate.recv().unwrap();
            bump(v)
        })
    });
    is_started.recv().unwrap();
    (release, computing)
}

#[test]
fn concurrent_computes_lose_no_update() {
    let c = common::bounded(100);
    thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                for _ in 0..1_000 {
                    c.compute(&1, bump);
                }
            });
        }
    });
    assert_eq!(c.get(&1), Some(4_000), "an increment was lost");
}

#[test]
fn a_compute_waits_for_a_load_in_flight_and_sees_its_value() {
    let c = common::bounded(100);
    let (release, loader) = held_load(&c, 1, 10);
    let (tx, rx) = mpsc::channel();
    let computing = {
        let c = c.clone();
        thread::spawn(move || {
            c.compute(&1, |v| {
                tx.send(v.copied()).unwrap();
                bump(v)
            })
        })
    };
    // The compute waits for the load: its closure has not run.
    assert!(rx.recv_timeout(Duration::from_millis(50)).is_err());
    release.send(()).unwrap();
    assert_eq!(loader.join().unwrap(), 10);
    assert_eq!(
        rx.recv_timeout(Duration::from_secs(30)).unwrap(),
        Some(10),
        "the compute saw the loaded value"
    );
    assert_eq!(
        computing.join().unwrap(),
        Computed::Replaced { old: 10, new: 11 }
    );
    assert_eq!(c.get(&1), Some(11));
}

#[test]
fn a_load_that_starts_during_a_compute_of_a_missing_key_gets_its_value() {
    let c = common::bounded(100);
    let (release, computing) = held_compute(&c, 1);
    let loading = {
        let c = c.clone();
        thread::spawn(move || c.get_or_load(&1, |_| Ok::<_, ()>(99)))
    };
    common::await_waiters(&c, 1);
    release.send(()).unwrap();
    assert_eq!(computing.join().unwrap(), Computed::Inserted(1));
    assert_eq!(
        loading.join().unwrap(),
        Ok(1),
        "the load waited for the compute"
    );
}

#[test]
fn an_insert_during_a_compute_wins() {
    let c = common::bounded(100);
    c.insert(1, 1);
    let (release, computing) = held_compute(&c, 1);
    // Readers are served the value meanwhile, and an insert is not held up.
    assert_eq!(c.get(&1), Some(1));
    c.insert(1, 50);
    release.send(()).unwrap();
    assert_eq!(
        computing.join().unwrap(),
        Computed::Replaced { old: 1, new: 2 }
    );
    assert_eq!(
        c.get(&1),
        Some(50),
        "the compute counts as made before the insert"
    );
}

#[test]
fn the_listener_hears_a_computed_replacement_or_removal_once() {
    let heard: Arc<Mutex<Vec<(u64, u64, RemovalCause)>>> = Arc::default();
    let log = Arc::clone(&heard);
    let c: C = Cache::builder()
        .max_capacity(100)
        .eviction_listener(move |k: &u64, v: &u64, cause| log.lock().unwrap().push((*k, *v, cause)))
        .build()
        .unwrap();
    c.insert(1, 1);
    assert_eq!(
        c.compute(&1, |_| Compute::Keep),
        Computed::Unchanged(Some(1))
    );
    assert_eq!(*heard.lock().unwrap(), [], "a kept value did not leave");
    assert_eq!(c.compute(&1, bump), Computed::Replaced { old: 1, new: 2 });
    assert_eq!(c.compute(&1, |_| Compute::Remove), Computed::Removed(2));
    assert_eq!(
        *heard.lock().unwrap(),
        [
            (1, 1, RemovalCause::Replaced),
            (1, 2, RemovalCause::Invalidated)
        ]
    );
    assert_eq!(
        c.compute(&2, |_| Compute::Remove),
        Computed::Unchanged(None)
    );
    assert_eq!(c.get(&2), None);
    let s = c.stats();
    assert_eq!(
        (s.loads, s.loads_in_flight, s.invalidations),
        (0, 0, 1),
        "{s:?}"
    );
}

#[test]
fn a_panicking_compute_keeps_the_value_and_strands_nobody() {
    common::expect_panics();
    let c = common::bounded(100);
    c.insert(1, 7);
    let r = catch_unwind(AssertUnwindSafe(|| {
        c.compute(&1, |_| -> Compute<u64> {
            panic!("{}: compute", common::EXPECTED_PANIC)
        })
    }));
    assert!(r.is_err(), "the panic reaches the caller");
    assert_eq!(c.get(&1), Some(7));
    assert_eq!(c.compute(&1, bump), Computed::Replaced { old: 7, new: 8 });
}

#[test]
fn a_computed_value_expires_with_the_cache_s_ttl() {
    let clock = ManualClock::new();
    let c: C = Cache::builder()
        .max_capacity(100)
        .time_to_live(Duration::from_secs(10))
        .clock(clock.clone())
        .build()
        .unwrap();
    assert_eq!(c.compute(&1, bump), Computed::Inserted(1));
    clock.advance(Duration::from_secs(11));
    assert_eq!(c.get(&1), None);
    // An expired value is no value to the closure.
    assert_eq!(
        c.compute(&1, |v| Compute::Put(v.map_or(100, |n| n + 1))),
        Computed::Inserted(100)
    );
}

#[test]
fn computes_keep_the_capacity_bound() {
    let c: C = Cache::builder().max_capacity(10).build().unwrap();
    for k in 0..1_000 {
        c.compute(&k, bump);
    }
    assert!(c.entry_count() <= 10);
    assert!(c.weighted_size() <= 10);
}
