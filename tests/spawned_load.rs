//! Loads run as detached tasks on the cache's spawner: they outlive the futures that
//! start them, refreshes never make a reader wait, and a spawner that drops a task strands
//! nobody.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use herdcache::{Cache, LoadError, ManualClock};
use tokio::sync::Notify;

mod common;
use common::tasks::{gated_load, until, Via};

fn spawning_cache() -> Cache<u32, u64> {
    Cache::builder()
        .max_capacity(10)
        .spawner(herdcache::TokioSpawner::current().unwrap())
        .build()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spawned_load_outlives_the_caller_that_started_it() {
    let cache = spawning_cache();
    let (starter, gate) = gated_load(&cache, 1, 5, Via::Spawned);
    until(|| cache.stats().loads == 1).await;
    let waiter = {
        let cache = cache.clone();
        tokio::spawn(async move {
            cache
                .get_or_load_spawned(&1, |_| async { Ok::<_, ()>(0) })
                .await
        })
    };
    until(|| cache.stats().coalesced_waits == 1).await;
    starter.abort();
    assert!(starter.await.unwrap_err().is_cancelled());
    gate.notify_one();
    assert_eq!(
        waiter.await.unwrap(),
        Ok(5),
        "the first load reached the waiter"
    );
    let stats = cache.stats();
    assert_eq!((stats.loads, stats.loads_cancelled), (1, 0));
    assert_eq!(cache.get(&1), Some(5));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spawned_load_left_by_every_caller_still_fills_the_cache() {
    let cache = spawning_cache();
    let (starter, gate) = gated_load(&cache, 1, 5, Via::Spawned);
    until(|| cache.stats().loads == 1).await;
    starter.abort();
    assert!(starter.await.unwrap_err().is_cancelled());
    gate.notify_one();
    until(|| cache.get(&1) == Some(5)).await;
    assert_eq!(cache.stats().loads, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_tasks_on_one_key_cause_one_spawned_load() {
    let cache = spawning_cache();
    let loads = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..32)
        .map(|_| {
            let (cache, loads) = (cache.clone(), loads.clone());
            tokio::spawn(async move {
                cache
                    .get_or_load_spawned(&1, move |_| async move {
                        loads.fetch_add(1, Ordering::SeqCst);
                        tokio::task::yield_now().await;
                        Ok::<_, ()>(42)
                    })
                    .await
            })
        })
        .collect();
    for t in tasks {
        assert_eq!(t.await.unwrap(), Ok(42));
    }
    assert_eq!(loads.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refresh_won_by_a_spawned_call_runs_on_the_spawner() {
    let clock = ManualClock::new();
    let cache: Cache<u32, u64> = Cache::builder()
        .max_capacity(10)
        .time_to_live(Duration::from_secs(10))
        .refresh_after(Duration::from_secs(1))
        .clock(clock.clone())
        .spawner(herdcache::TokioSpawner::current().unwrap())
        .build()
        .unwrap();
    cache.insert(1, 10);
    clock.advance(Duration::from_secs(2));
    let gate = Arc::new(Notify::new());
    let opened = gate.clone();
    // The refresh's loader waits for the gate, yet the caller that won it returns now.
    let v = cache
        .get_or_load_spawned(&1, move |_| async move {
            opened.notified().await;
            Ok::<_, ()>(11)
        })
        .await;
    assert_eq!(v, Ok(10));
    let again = cache
        .get_or_load_spawned(&1, |_| async { Ok::<_, ()>(0) })
        .await;
    assert_eq!(again, Ok(10), "served while the one refresh runs");
    assert_eq!((cache.stats().loads, cache.stats().refreshes), (1, 1));
    gate.notify_one();
    until(|| cache.get(&1) == Some(11)).await;
}

#[tokio::test(start_paused = true)]
async fn a_deadline_bounds_the_wait_for_ones_own_spawned_load() {
    let cache = spawning_cache();
    let gate = Arc::new(Notify::new());
    let opened = gate.clone();
    let v = cache
        .get_or_load_spawned_until(
            &1,
            tokio::time::sleep(Duration::from_millis(10)),
            move |_| async move {
                opened.notified().await;
                Ok::<_, ()>(8)
            },
        )
        .await;
    assert_eq!(v, Err(LoadError::Timeout));
    gate.notify_one();
    until(|| cache.get(&1) == Some(8)).await;
    assert_eq!(cache.stats().loads, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_spawned_loader_gives_its_caller_panicked() {
    let cache = spawning_cache();
    let v = cache
        .get_or_load_spawned(&1, |_| async {
            if true {
                panic!("loader failed hard");
            }
            Ok::<_, ()>(1)
        })
        .await;
    assert_eq!(v, Err(LoadError::Panicked));
    assert_eq!(cache.stats().load_panics, 1);
    let next = cache
        .get_or_load_spawned(&1, |_| async { Ok::<_, ()>(2) })
        .await;
    assert_eq!(next, Ok(2), "nothing is stuck: the next call loads afresh");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spawner_that_drops_its_tasks_cancels_the_load_and_strands_nobody() {
    let cache: Cache<u32, u64> = Cache::builder()
        .max_capacity(10)
        .spawner(common::DropAll)
        .build()
        .unwrap();
    let v = cache
        .get_or_load_spawned(&1, |_| async { Ok::<_, ()>(1) })
        .await;
    assert_eq!(v, Err(LoadError::Cancelled));
    assert_eq!(cache.get(&1), None);
    assert_eq!(cache.stats().loads_cancelled, 1);
    // The inline path does not use the spawner.
    let inline = cache
        .get_or_load_async(&1, |_| async { Ok::<_, ()>(2) })
        .await;
    assert_eq!(inline, Ok(2));
}

#[cfg(feature = "tokio")]
#[test]
fn a_runtime_shut_down_mid_load_hands_the_load_to_a_waiting_thread() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .build()
        .unwrap();
    let cache: Cache<u32, u64> = Cache::builder()
        .max_capacity(10)
        .spawner(herdcache::TokioSpawner::new(runtime.handle().clone()))
        .build()
        .unwrap();
    // A call from outside the runtime whose load never finishes on it.
    let starter = {
        let cache = cache.clone();
        runtime.spawn(async move {
            cache
                .get_or_load_spawned(&1, |_| std::future::pending::<Result<u64, ()>>())
                .await
        })
    };
    common::spin_until("the load started", || cache.stats().loads > 0);
    let waiter = {
        let cache = cache.clone();
        std::thread::spawn(move || cache.get_or_load(&1, |_| Ok::<_, ()>(3)))
    };
    common::spin_until("a thread joined the load", || {
        cache.stats().coalesced_waits > 0
    });
    drop(runtime);
    assert_eq!(waiter.join().unwrap(), Ok(3), "the thread led a new load");
    drop(starter);
    assert_eq!(cache.get(&1), Some(3));
    assert_eq!(cache.stats().loads_cancelled, 1);
}

#[tokio::test]
async fn without_a_spawner_a_spawned_load_is_an_error_not_a_silent_inline_load() {
    // Before, the load ran inline: a caller that timed out cancelled it, and nothing was
    // cached. Now the call says at once what is missing, hit or miss.
    let cache: Cache<u32, u64> = Cache::builder().max_capacity(10).build().unwrap();
    let loads = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&loads);
    let r = cache
        .get_or_load_spawned(&1, move |_| {
            counted.fetch_add(1, Ordering::SeqCst);
            async { Ok::<_, ()>(1) }
        })
        .await;
    assert_eq!(r, Err(LoadError::NoSpawner));
    cache.insert(1, 1);
    let r = cache
        .get_or_load_spawned_until(&1, std::future::pending(), |_| async { Ok::<_, String>(2) })
        .await;
    assert_eq!(r, Err(LoadError::NoSpawner));
    assert_eq!(loads.load(Ordering::SeqCst), 0);
    assert!(r.unwrap_err().to_string().contains("spawner"));
}

/// One spawner serves both calls that hand work off. Before, a cache given only a tokio
/// spawner's task half refreshed `get_or_load_background` inline, and one given only a
/// refresh spawner failed `get_or_load_spawned`.
#[test]
fn one_spawner_runs_both_spawned_loads_and_background_refreshes_without_a_runtime() {
    let clock = ManualClock::new();
    let cache: Cache<u32, u64> = Cache::builder()
        .max_capacity(10)
        .time_to_live(Duration::from_secs(60))
        .refresh_after(Duration::from_secs(10))
        .clock(clock.clone())
        .spawner(herdcache::ThreadSpawner)
        .build()
        .unwrap();
    // A future's load, run on a thread of its own: no runtime anywhere.
    let (release, gate) = std::sync::mpsc::channel::<()>();
    let waiter = {
        let cache = cache.clone();
        std::thread::spawn(move || {
            common::tasks::block_on(cache.get_or_load_spawned(&1, move |_| {
                let _ = gate.recv();
                async { Ok::<_, ()>(1) }
            }))
        })
    };
    common::spin_until("the spawned load started", || {
        cache.stats().loads_in_flight == 1
    });
    release.send(()).unwrap();
    assert_eq!(waiter.join().unwrap(), Ok(1));
    // A thread's early refresh, on another thread: the reader gets the current value while
    // the refresh's loader is held.
    clock.advance(Duration::from_secs(11));
    let (release, gate) = std::sync::mpsc::channel::<()>();
    let r = cache.get_or_load_background(&1, move |_| {
        let _ = gate.recv();
        Ok::<_, ()>(2)
    });
    assert_eq!(r, Ok(1), "the current value, at once");
    release.send(()).unwrap();
    common::spin_until("the refresh landed", || cache.get(&1) == Some(2));
}

/// Two tasks on one thread: the second misses the key while the first's spawned load waits
/// to start. Before, the flight still named the handing thread as its leader, and the second
/// task got `Recursive` instead of the value.
#[tokio::test(flavor = "current_thread")]
async fn tasks_on_one_thread_share_a_spawned_load_that_has_not_started() {
    let cache = spawning_cache();
    let call = |v: u64| {
        let cache = cache.clone();
        tokio::spawn(async move {
            cache
                .get_or_load_spawned(&1, move |_| async move { Ok::<_, ()>(v) })
                .await
        })
    };
    let (first, second) = (call(1), call(2));
    assert_eq!(first.await.unwrap(), Ok(1));
    assert_eq!(
        second.await.unwrap(),
        Ok(1),
        "the second task joined the load"
    );
}
