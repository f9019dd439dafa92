//! Bulk loads (`get_or_load_all`): present keys are hits, the missing ones go to one batch
//! call, and each key is still one flight, shared with the single-key calls.

mod common;

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread;

use common::{await_waiters, held_load};
use herdcache::{Cache, LoadError};

type C = Cache<u64, u64>;

/// A batch source: each key's value is ten times it, except keys above 100, which it does
/// not have; it records the batches it was asked for.
#[derive(Default)]
struct Source {
    batches: Mutex<Vec<Vec<u64>>>,
}

impl Source {
    fn load(&self, keys: &[u64]) -> Result<Vec<(u64, u64)>, String> {
        self.batches.lock().unwrap().push(keys.to_vec());
        Ok(keys
            .iter()
            .filter(|&&k| k <= 100)
            .map(|&k| (k, k * 10))
            .collect())
    }
}

#[test]
fn present_keys_are_hits_and_the_missing_ones_one_batch() {
    let c = common::bounded(1_000);
    c.insert(1, 10);
    let source = Source::default();
    let got = c
        .get_or_load_all([&1, &2, &3, &2, &200], |keys| source.load(keys))
        .unwrap();
    assert_eq!(got, HashMap::from([(1, 10), (2, 20), (3, 30)]));
    assert_eq!(
        *source.batches.lock().unwrap(),
        [vec![2, 3, 200]],
        "one call, each missing key once"
    );
    assert_eq!(c.get(&3), Some(30), "loaded values are cached");
    assert_eq!(c.get(&200), None, "a key the source lacks is not cached");
    let s = c.stats();
    assert_eq!((s.loads, s.loads_in_flight), (3, 0), "{s:?}");
}

#[test]
fn a_single_key_caller_joins_the_batch_and_the_batch_joins_a_single_key_load() {
    let c = common::bounded(1_000);
    // Key 5 is being loaded on its own: the batch waits for it rather than loading it.
    let (release5, loader5) = held_load(&c, 5, 55);
    let (started, is_started) = mpsc::channel();
    let (release, gate) = mpsc::channel::<()>();
    let batch = {
        let c = c.clone();
        thread::spawn(move || {
            c.get_or_load_all([&5, &6, &7], |keys| {
                started.send(keys.to_vec()).unwrap();
                gate.recv().unwrap();
                Ok::<_, String>(keys.iter().map(|&k| (k, k * 10)).collect::<Vec<_>>())
            })
        })
    };
    assert_eq!(
        is_started.recv().unwrap(),
        [6, 7],
        "key 5 was left to its own load"
    );
    // A single-key caller of a batch key joins the batch's flight: its loader never runs.
    let single = {
        let c = c.clone();
        thread::spawn(move || c.get_or_load(&6, |_| -> Result<u64, String> { unreachable!() }))
    };
    await_waiters(&c, 1);
    release.send(()).unwrap();
    release5.send(()).unwrap();
    assert_eq!(loader5.join().unwrap(), 55);
    assert_eq!(single.join().unwrap(), Ok(60));
    assert_eq!(
        batch.join().unwrap().unwrap(),
        HashMap::from([(5, 55), (6, 60), (7, 70)])
    );
}

#[test]
fn a_batch_error_reaches_every_waiter_of_its_keys() {
    let c = common::bounded(1_000);
    let (started, is_started) = mpsc::channel();
    let (release, gate) = mpsc::channel::<()>();
    let batch = {
        let c = c.clone();
        thread::spawn(move || {
            c.get_or_load_all([&1, &2], |_| {
                started.send(()).unwrap();
                gate.recv().unwrap();
                Err::<Vec<(u64, u64)>, _>("source down".to_owned())
            })
        })
    };
    is_started.recv().unwrap();
    let waiters: Vec<_> = [1u64, 2]
        .into_iter()
        .map(|k| {
            let c = c.clone();
            thread::spawn(move || c.get_or_load(&k, |_| -> Result<u64, String> { unreachable!() }))
        })
        .collect();
    await_waiters(&c, 2);
    release.send(()).unwrap();
    let Err(LoadError::Failed(e)) = batch.join().unwrap() else {
        panic!("the batch's error reaches its caller");
    };
    for w in waiters {
        match w.join().unwrap() {
            Err(LoadError::Failed(we)) => assert!(Arc::ptr_eq(&we, &e), "the same error"),
            other => panic!("a waiter got {other:?}"),
        }
    }
    assert_eq!(c.get(&1), None);
}

#[test]
fn a_panicking_batch_loader_wakes_its_waiters_with_panicked() {
    common::expect_panics();
    let c = common::bounded(1_000);
    let (started, is_started) = mpsc::channel();
    let (release, gate) = mpsc::channel::<()>();
    let batch = {
        let c = c.clone();
        thread::spawn(move || {
            catch_unwind(AssertUnwindSafe(|| {
                c.get_or_load_all([&1], |_| -> Result<Vec<(u64, u64)>, String> {
                    started.send(()).unwrap();
                    gate.recv().unwrap();
                    panic!("{}: batch loader", common::EXPECTED_PANIC)
                })
            }))
            .is_err()
        })
    };
    is_started.recv().unwrap();
    let waiter = {
        let c = c.clone();
        thread::spawn(move || c.get_or_load(&1, |_| Ok::<_, String>(1)))
    };
    await_waiters(&c, 1);
    release.send(()).unwrap();
    assert!(
        batch.join().unwrap(),
        "the panic goes on in the batch's caller"
    );
    assert_eq!(waiter.join().unwrap(), Err(LoadError::Panicked));
    assert_eq!(
        c.get_or_load(&1, |_| Ok::<_, String>(7)),
        Ok(7),
        "not stuck"
    );
}

#[test]
fn a_batch_takes_one_load_permit() {
    let c: C = Cache::builder()
        .max_capacity(100)
        .max_concurrent_loads(1)
        .build()
        .unwrap();
    let running = AtomicUsize::new(0);
    thread::scope(|s| {
        for t in 0..4u64 {
            let (c, running) = (&c, &running);
            s.spawn(move || {
                let keys: Vec<u64> = (0..10).map(|i| t * 100 + i).collect();
                let got = c
                    .get_or_load_all(keys.iter(), |keys| {
                        assert_eq!(
                            running.fetch_add(1, Ordering::SeqCst),
                            0,
                            "two loads at once"
                        );
                        thread::yield_now();
                        running.fetch_sub(1, Ordering::SeqCst);
                        Ok::<_, String>(keys.iter().map(|&k| (k, k)).collect::<Vec<_>>())
                    })
                    .unwrap();
                assert_eq!(got.len(), 10);
            });
        }
    });
    assert_eq!(c.stats().loads, 40);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn futures_load_in_bulk_and_share_flights_with_threads() {
    let c = common::bounded(1_000);
    c.insert(1, 10);
    let got = c
        .get_or_load_all_async([&1, &2, &300], |keys| {
            let found: Vec<(u64, u64)> = keys
                .iter()
                .filter(|&&k| k < 100)
                .map(|&k| (k, k * 10))
                .collect();
            async move { Ok::<_, String>(found) }
        })
        .await
        .unwrap();
    assert_eq!(got, HashMap::from([(1, 10), (2, 20)]));
    assert_eq!(c.get(&2), Some(20));
}
