//! The futures' miss path under tokio: one load for many tasks, a cancelled leader hands the
//! load on, deadlines, panics, permits, and threads and tasks sharing one load.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use herdcache::{Cache, LoadError, ManualClock};
use tokio::sync::Notify;

mod common;
use common::tasks::{gated_load, until, Via};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_tasks_missing_one_key_cause_one_load() {
    let cache: Cache<u32, u64> = Cache::builder().max_capacity(10).build().unwrap();
    let loads = Arc::new(AtomicUsize::new(0));
    let gate = Arc::new(Notify::new());
    let tasks: Vec<_> = (0..64)
        .map(|_| {
            let (cache, loads, gate) = (cache.clone(), loads.clone(), gate.clone());
            tokio::spawn(async move {
                cache
                    .get_or_load_async(&1, |_| async move {
                        loads.fetch_add(1, Ordering::SeqCst);
                        gate.notified().await;
                        Ok::<_, ()>(42)
                    })
                    .await
            })
        })
        .collect();
    until(|| loads.load(Ordering::SeqCst) == 1 && cache.stats().coalesced_waits == 63).await;
    gate.notify_one();
    for t in tasks {
        assert_eq!(t.await.unwrap(), Ok(42));
    }
    assert_eq!(loads.load(Ordering::SeqCst), 1);
    assert_eq!(cache.get(&1), Some(42));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aborting_the_leader_hands_the_load_to_a_waiter() {
    let cache: Cache<u32, u64> = Cache::builder().max_capacity(10).build().unwrap();
    let started = Arc::new(Notify::new());
    let leader = {
        let (cache, started) = (cache.clone(), started.clone());
        tokio::spawn(async move {
            cache
                .get_or_load_async(&1, |_| async move {
                    started.notify_one();
                    std::future::pending::<()>().await;
                    Ok::<_, ()>(1)
                })
                .await
        })
    };
    started.notified().await;
    let waiter = {
        let cache = cache.clone();
        tokio::spawn(async move {
            cache
                .get_or_load_async(&1, |_| async { Ok::<_, ()>(2) })
                .await
        })
    };
    until(|| cache.stats().coalesced_waits == 1).await;
    leader.abort();
    assert!(leader.await.unwrap_err().is_cancelled());
    assert_eq!(waiter.await.unwrap(), Ok(2), "the waiter led a new load");
    let stats = cache.stats();
    assert_eq!((stats.loads, stats.loads_cancelled), (2, 1));
    assert_eq!(cache.get(&1), Some(2));
}

#[tokio::test(start_paused = true)]
async fn a_timed_out_waiter_leaves_and_the_load_completes_for_the_others() {
    let cache: Cache<u32, u64> = Cache::builder().max_capacity(10).build().unwrap();
    let (leader, gate) = gated_load(&cache, 1, 7, Via::Inline);
    until(|| cache.stats().loads == 1).await;
    let waited = tokio::time::timeout(
        Duration::from_millis(10),
        cache.get_or_load_async(&1, |_| async { Ok::<_, ()>(0) }),
    )
    .await;
    assert!(waited.is_err(), "tokio's timeout fired first");
    let until_deadline = cache
        .get_or_load_async_until(
            &1,
            tokio::time::sleep(Duration::from_millis(10)),
            |_| async { Ok::<_, ()>(0) },
        )
        .await;
    assert_eq!(until_deadline, Err(LoadError::Timeout));
    gate.notify_one();
    assert_eq!(leader.await.unwrap(), Ok(7));
    assert_eq!(cache.get(&1), Some(7));
    assert_eq!(cache.stats().loads, 1);
}

#[tokio::test(start_paused = true)]
async fn a_waiter_past_its_deadline_gets_the_expired_value() {
    let clock = ManualClock::new();
    let cache: Cache<u32, u64> = Cache::builder()
        .max_capacity(10)
        .time_to_live(Duration::from_secs(1))
        .clock(clock.clone())
        .build()
        .unwrap();
    cache.insert(1, 10);
    clock.advance(Duration::from_secs(2));
    let (leader, gate) = gated_load(&cache, 1, 11, Via::Inline);
    until(|| cache.stats().loads == 1).await;
    let stale = cache
        .get_or_load_async_until(
            &1,
            tokio::time::sleep(Duration::from_millis(5)),
            |_| async { Ok::<_, ()>(0) },
        )
        .await;
    assert_eq!(stale, Ok(10));
    gate.notify_one();
    assert_eq!(leader.await.unwrap(), Ok(11));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_loader_future_gives_waiters_panicked() {
    let cache: Cache<u32, u64> = Cache::builder().max_capacity(10).build().unwrap();
    let gate = Arc::new(Notify::new());
    let leader = {
        let (cache, gate) = (cache.clone(), gate.clone());
        tokio::spawn(async move {
            cache
                .get_or_load_async(&1, |_| async move {
                    gate.notified().await;
                    if true {
                        panic!("loader failed hard");
                    }
                    Ok::<_, ()>(1)
                })
                .await
        })
    };
    until(|| cache.stats().loads == 1).await;
    let waiter = {
        let cache = cache.clone();
        tokio::spawn(async move {
            cache
                .get_or_load_async(&1, |_| async { Ok::<_, ()>(2) })
                .await
        })
    };
    until(|| cache.stats().coalesced_waits == 1).await;
    gate.notify_one();
    assert!(leader.await.unwrap_err().is_panic());
    assert_eq!(waiter.await.unwrap(), Err(LoadError::Panicked));
    assert_eq!(cache.stats().load_panics, 1);
    // Nothing is stuck: the next caller loads afresh.
    let next = cache
        .get_or_load_async(&1, |_| async { Ok::<_, ()>(3) })
        .await;
    assert_eq!(next, Ok(3));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thread_and_a_task_share_one_load() {
    let cache: Cache<u32, u64> = Cache::builder().max_capacity(10).build().unwrap();
    let (task, gate) = gated_load(&cache, 1, 9, Via::Inline);
    until(|| cache.stats().loads == 1).await;
    let c = cache.clone();
    let thread = std::thread::spawn(move || c.get_or_load(&1, |_| Ok::<_, ()>(0)));
    until(|| cache.stats().coalesced_waits == 1).await;
    gate.notify_one();
    assert_eq!(task.await.unwrap(), Ok(9));
    assert_eq!(thread.join().unwrap(), Ok(9));
    assert_eq!(cache.stats().loads, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_without_a_permit_waits_for_one() {
    let cache: Cache<u32, u64> = Cache::builder()
        .max_capacity(10)
        .max_concurrent_loads(1)
        .build()
        .unwrap();
    let (first, gate) = gated_load(&cache, 1, 1, Via::Inline);
    until(|| cache.stats().loads == 1).await;
    let second = {
        let cache = cache.clone();
        tokio::spawn(async move {
            cache
                .get_or_load_async(&2, |_| async { Ok::<_, ()>(2) })
                .await
        })
    };
    until(|| cache.stats().throttled == 1).await;
    assert_eq!(
        cache.stats().loads,
        1,
        "the second load waits for the permit"
    );
    gate.notify_one();
    assert_eq!(first.await.unwrap(), Ok(1));
    assert_eq!(second.await.unwrap(), Ok(2));
}

/// A thread's loader that polls an async loading call for its own key in place (a sync
/// loader over async code) gets `Recursive`, as a thread re-entering does. Before, the future
/// path had no such check: it waited on the load its own thread was running, for ever.
#[test]
fn a_loader_that_awaits_its_own_key_in_place_gets_an_error_not_a_deadlock() {
    let c: Cache<u32, u64> = Cache::builder().max_capacity(10).build().unwrap();
    let inner = c.get_or_load(&1, |_| {
        let again = common::tasks::block_on(c.get_or_load_async(&1, |_| async { Ok::<_, ()>(0) }));
        assert!(matches!(again, Err(LoadError::Recursive)), "{again:?}");
        Ok::<_, ()>(10)
    });
    assert_eq!(inner, Ok(10));
}

/// Which call an async loader makes back into its cache for its own key.
#[derive(Debug, Clone, Copy)]
enum Reentry {
    Async,
    Spawned,
    Sync,
}

/// An async loader that asks its cache for the key it is loading gets `Recursive` there at
/// once, however it asks (it used to wait for itself for ever: the future's leader was
/// cleared, since a future may move between threads, so nothing saw the re-entry), both in a
/// load led inline and in one handed to the spawner; with a `load_timeout` it used to get
/// `LoadTimedOut` at the deadline instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_async_loader_that_awaits_its_own_key_gets_recursive() {
    for timeout in [None, Some(Duration::from_secs(600))] {
        for inner in [Reentry::Async, Reentry::Spawned, Reentry::Sync] {
            for spawned in [false, true] {
                let mut builder = Cache::builder()
                    .max_capacity(10)
                    .spawner(herdcache::TokioSpawner::current().unwrap());
                if let Some(t) = timeout {
                    builder = builder.load_timeout(t);
                }
                let cache: Cache<u32, u64> = builder.build().unwrap();
                let c2 = cache.clone();
                let loader = move |k: &u32| {
                    let (k, c2) = (*k, c2.clone());
                    async move {
                        let again = match inner {
                            Reentry::Async => {
                                c2.get_or_load_async(&k, |_| async { Ok::<_, ()>(5) }).await
                            }
                            Reentry::Spawned => {
                                c2.get_or_load_spawned(&k, |_| async { Ok::<_, ()>(5) })
                                    .await
                            }
                            Reentry::Sync => c2.get_or_load(&k, |_| Ok::<_, ()>(5)),
                        };
                        assert_eq!(again, Err(LoadError::Recursive), "{inner:?}");
                        Ok::<_, ()>(7)
                    }
                };
                let outer = async {
                    if spawned {
                        cache.get_or_load_spawned(&1, loader).await
                    } else {
                        cache.get_or_load_async(&1, loader).await
                    }
                };
                let r = tokio::time::timeout(Duration::from_secs(30), outer)
                    .await
                    .unwrap_or_else(|_| {
                        panic!("{inner:?} inside a load (spawned: {spawned}, timeout: {timeout:?}) waited for itself")
                    });
                assert_eq!(r, Ok(7));
                assert_eq!(cache.get(&1), Some(7));
            }
        }
    }
}
