//! Early refresh with a manual clock: soft TTL (stale-while-revalidate), XFetch's window,
//! one refresh at a time, stale-if-error, and refreshes racing writes.

mod common;

use common::held_load;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::Barrier;
use std::thread;
use std::time::Duration;

use herdcache::{Cache, CacheBuilder, LoadError, ManualClock};

type C = Cache<u64, u64>;
const SEC: Duration = Duration::from_secs(1);

fn builder(clock: &ManualClock) -> CacheBuilder<u64, u64> {
    Cache::builder()
        .max_capacity(100)
        .time_to_live(60 * SEC)
        .clock(clock.clone())
}

fn never(_: &u64) -> Result<u64, String> {
    panic!("the loader must not run here")
}

#[test]
fn after_the_soft_ttl_readers_keep_the_value_while_one_refresh_runs() {
    let clock = ManualClock::new();
    let c: C = builder(&clock).refresh_after(10 * SEC).build().unwrap();
    assert_eq!(c.get_or_load(&1, |_| Ok::<_, String>(1)).unwrap(), 1);
    clock.advance(9 * SEC);
    assert_eq!(
        c.get_or_load(&1, never).unwrap(),
        1,
        "before the soft TTL: no refresh"
    );
    clock.advance(2 * SEC);
    let (release, refresher) = held_load(&c, 1, 2);
    // While it runs, nobody waits and nobody else loads.
    for _ in 0..100 {
        assert_eq!(c.get_or_load(&1, never).unwrap(), 1);
        assert_eq!(c.get(&1), Some(1));
    }
    release.send(()).unwrap();
    assert_eq!(refresher.join().unwrap(), 2);
    assert_eq!(c.get(&1), Some(2));
    let s = c.stats();
    assert_eq!((s.loads, s.refreshes, s.coalesced_waits), (2, 1, 0));
}

#[test]
fn concurrent_readers_of_a_due_key_start_exactly_one_refresh() {
    let clock = ManualClock::new();
    let c: C = builder(&clock).refresh_after(10 * SEC).build().unwrap();
    c.get_or_load(&1, |_| Ok::<_, String>(1)).unwrap();
    clock.advance(11 * SEC);
    let calls = AtomicUsize::new(0);
    let n = 6;
    let barrier = Barrier::new(n);
    let (release, gate) = mpsc::channel::<()>();
    let gate = std::sync::Mutex::new(gate);
    let served = AtomicUsize::new(0);
    thread::scope(|s| {
        for _ in 0..n {
            s.spawn(|| {
                barrier.wait();
                let v = c
                    .get_or_load(&1, |_| {
                        calls.fetch_add(1, Ordering::SeqCst);
                        gate.lock().unwrap().recv().unwrap();
                        Ok::<_, String>(2)
                    })
                    .unwrap();
                if v == 1 {
                    served.fetch_add(1, Ordering::SeqCst);
                }
            });
        }
        // Every reader but the refresher returns the current value without waiting.
        common::spin_until("the other readers were served", || {
            served.load(Ordering::SeqCst) >= n - 1
        });
        release.send(()).unwrap();
    });
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(c.get(&1), Some(2));
}

#[test]
fn past_the_hard_expiry_readers_wait_on_the_refresh_instead_of_loading_again() {
    let clock = ManualClock::new();
    let c: C = builder(&clock).refresh_after(10 * SEC).build().unwrap();
    c.get_or_load(&1, |_| Ok::<_, String>(1)).unwrap();
    clock.advance(11 * SEC);
    let (release, refresher) = held_load(&c, 1, 2);
    clock.advance(60 * SEC);
    assert_eq!(c.get(&1), None, "the old value is past its hard expiry");
    let waiter = {
        let c = c.clone();
        thread::spawn(move || c.get_or_load(&1, never).unwrap())
    };
    common::spin_until("a reader joined the refresh", || {
        c.stats().coalesced_waits > 0
    });
    release.send(()).unwrap();
    assert_eq!(refresher.join().unwrap(), 2);
    assert_eq!(waiter.join().unwrap(), 2);
    assert_eq!(c.stats().loads, 2);
}

#[test]
fn xfetch_does_not_refresh_outside_its_window_and_refreshes_once_near_expiry() {
    let clock = ManualClock::new();
    let c: C = builder(&clock).xfetch(1.0).build().unwrap();
    // The load takes 1 s of (manual) time: delta = 1 s.
    c.get_or_load(&1, |_| {
        clock.advance(SEC);
        Ok::<_, String>(1)
    })
    .unwrap();
    // Expiry is 60 s after the load finished. Outside the window (36.8 s * delta * beta)
    // no draw can refresh, so the loader must never run.
    clock.advance(60 * SEC - Duration::from_millis(36_900));
    for _ in 0..10_000 {
        assert_eq!(c.get_or_load(&1, never).unwrap(), 1);
    }
    // 1 ms before expiry a draw refreshes with probability exp(-0.001) per read.
    clock.advance(Duration::from_millis(36_899));
    let calls = AtomicUsize::new(0);
    for _ in 0..100 {
        c.get_or_load(&1, |_| {
            calls.fetch_add(1, Ordering::SeqCst);
            Ok::<_, String>(2)
        })
        .unwrap();
    }
    assert_eq!(calls.load(Ordering::SeqCst), 1, "exactly one early refresh");
    assert_eq!(c.get(&1), Some(2));
    assert_eq!(c.stats().refreshes, 1);
}

#[test]
fn a_failed_refresh_keeps_the_value_with_stale_if_error_and_backs_off() {
    let clock = ManualClock::new();
    let c: C = builder(&clock)
        .refresh_after(10 * SEC)
        .stale_if_error(true)
        .build()
        .unwrap();
    c.get_or_load(&1, |_| Ok::<_, String>(1)).unwrap();
    clock.advance(11 * SEC);
    let v = c.get_or_load(&1, |_| Err::<u64, _>("down".to_owned()));
    assert_eq!(v.unwrap(), 1, "the refresher is served the old value");
    assert_eq!(c.stats().refresh_failures, 1);
    // Backing off: no immediate retry.
    assert_eq!(c.get_or_load(&1, never).unwrap(), 1);
    clock.advance(Duration::from_millis(100));
    assert_eq!(c.get_or_load(&1, |_| Ok::<_, String>(2)).unwrap(), 2);
}

#[test]
fn a_failed_refresh_without_stale_if_error_reports_and_drops_the_value() {
    let clock = ManualClock::new();
    let c: C = builder(&clock).refresh_after(10 * SEC).build().unwrap();
    c.get_or_load(&1, |_| Ok::<_, String>(1)).unwrap();
    clock.advance(11 * SEC);
    let v = c.get_or_load(&1, |_| Err::<u64, _>("down".to_owned()));
    assert!(matches!(v, Err(LoadError::Failed(_))));
    assert_eq!(c.get(&1), None);
}

#[test]
fn a_refresh_that_raced_an_invalidation_never_puts_the_old_key_back() {
    let clock = ManualClock::new();
    let c: C = builder(&clock).refresh_after(10 * SEC).build().unwrap();
    c.get_or_load(&1, |_| Ok::<_, String>(1)).unwrap();
    clock.advance(11 * SEC);
    let (release, refresher) = held_load(&c, 1, 2);
    assert!(
        c.invalidate(&1),
        "the value being refreshed was still valid"
    );
    release.send(()).unwrap();
    assert_eq!(
        refresher.join().unwrap(),
        2,
        "its own caller still gets the result"
    );
    assert_eq!(c.get(&1), None);
}

#[test]
fn an_insert_during_a_refresh_wins() {
    let clock = ManualClock::new();
    let c: C = builder(&clock).refresh_after(10 * SEC).build().unwrap();
    c.get_or_load(&1, |_| Ok::<_, String>(1)).unwrap();
    clock.advance(11 * SEC);
    let (release, refresher) = held_load(&c, 1, 2);
    c.insert(1, 7);
    release.send(()).unwrap();
    refresher.join().unwrap();
    assert_eq!(c.get(&1), Some(7));
}

fn spawning_cache(
    clock: &ManualClock,
) -> (
    C,
    std::sync::Arc<std::sync::Mutex<Vec<herdcache::RefreshJob>>>,
) {
    let spawner = common::Queued::default();
    let jobs = std::sync::Arc::clone(&spawner.0);
    let c = builder(clock)
        .refresh_after(10 * SEC)
        .spawner(spawner)
        .build()
        .unwrap();
    c.get_or_load_background(&1, |_| Ok::<_, String>(1))
        .unwrap();
    clock.advance(11 * SEC);
    (c, jobs)
}

#[test]
fn with_a_spawner_the_refreshing_reader_does_not_wait_either() {
    let clock = ManualClock::new();
    let (c, jobs) = spawning_cache(&clock);
    let calls = std::sync::Arc::new(AtomicUsize::new(0));
    for _ in 0..10 {
        let calls = std::sync::Arc::clone(&calls);
        let v = c.get_or_load_background(&1, move |_| {
            calls.fetch_add(1, Ordering::SeqCst);
            Ok::<_, String>(2)
        });
        assert_eq!(
            v.unwrap(),
            1,
            "every reader, the refresher included, gets the current value"
        );
    }
    assert_eq!(
        calls.load(Ordering::SeqCst),
        0,
        "the refresh waits for the spawner"
    );
    let mut queued = std::mem::take(&mut *jobs.lock().unwrap());
    assert_eq!(queued.len(), 1, "one refresh");
    thread::spawn(move || queued.pop().unwrap().run())
        .join()
        .unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(c.get(&1), Some(2));
}

#[test]
fn a_dropped_refresh_job_keeps_the_value_and_is_retried_after_a_backoff() {
    let clock = ManualClock::new();
    let (c, jobs) = spawning_cache(&clock);
    assert_eq!(
        c.get_or_load_background(&1, |_| Ok::<_, String>(2))
            .unwrap(),
        1
    );
    jobs.lock().unwrap().clear(); // the spawner loses the job
    assert_eq!(c.get(&1), Some(1), "the value survives");
    assert_eq!(
        c.get_or_load_background(&1, |_| Ok::<_, String>(2))
            .unwrap(),
        1
    );
    assert!(jobs.lock().unwrap().is_empty(), "backing off");
    clock.advance(Duration::from_millis(100));
    assert_eq!(
        c.get_or_load_background(&1, |_| Ok::<_, String>(2))
            .unwrap(),
        1
    );
    assert_eq!(jobs.lock().unwrap().len(), 1, "retried");
}

#[test]
fn the_spawning_thread_waits_for_its_pending_refresh_past_the_hard_expiry() {
    let clock = ManualClock::new();
    let (c, jobs) = spawning_cache(&clock);
    assert_eq!(
        c.get_or_load_background(&1, |_| Ok::<_, String>(2))
            .unwrap(),
        1
    );
    clock.advance(60 * SEC); // past the hard expiry, refresh still pending
    let job = jobs.lock().unwrap().pop().unwrap();
    let runner = {
        let c = c.clone();
        thread::spawn(move || {
            common::spin_until("a reader joined the refresh", || {
                c.stats().coalesced_waits > 0
            });
            job.run();
        })
    };
    // Not `Recursive`: this thread started the refresh but does not run its loader.
    assert_eq!(c.get_or_load(&1, never).unwrap(), 2);
    runner.join().unwrap();
}

#[test]
fn without_a_spawner_a_background_load_is_an_error_not_an_inline_refresh() {
    let clock = ManualClock::new();
    let c: C = builder(&clock).refresh_after(10 * SEC).build().unwrap();
    c.insert(1, 1);
    clock.advance(11 * SEC);
    assert_eq!(
        c.get_or_load_background(&1, never),
        Err(LoadError::NoSpawner)
    );
    assert_eq!(c.stats().loads, 0, "no refresh ran, inline or not");
}

/// With a `TokioSpawner`, a refresh won by `get_or_load_background` runs on the runtime's
/// blocking threads: the caller gets the current value while the loader is still held.
#[test]
fn a_tokio_spawner_runs_background_refreshes_off_the_callers_thread() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .build()
        .unwrap();
    let clock = ManualClock::new();
    let c: C = builder(&clock)
        .refresh_after(10 * SEC)
        .spawner(herdcache::TokioSpawner::new(runtime.handle().clone()))
        .build()
        .unwrap();
    c.insert(1, 1);
    clock.advance(11 * SEC);
    let (release, gate) = mpsc::channel::<()>();
    let (done, returned) = mpsc::channel();
    let caller = {
        let c = c.clone();
        thread::spawn(move || {
            let v = c.get_or_load_background(&1, move |_| {
                gate.recv().unwrap();
                Ok::<_, String>(2)
            });
            done.send(v).unwrap();
        })
    };
    // Before, the refresh ran inline: the caller waited for the held loader.
    let v = returned
        .recv_timeout(Duration::from_secs(30))
        .expect("the caller waited for its refresh");
    assert_eq!(v, Ok(1), "the current value, at once");
    release.send(()).unwrap();
    caller.join().unwrap();
    common::spin_until("the refresh landed", || c.get(&1) == Some(2));
}

/// What the eviction listener hears of a refreshed value, in order.
type Heard = std::sync::Arc<std::sync::Mutex<Vec<(u64, u64, herdcache::RemovalCause)>>>;

fn listening(clock: &ManualClock, stale_if_error: bool) -> (C, Heard) {
    let heard = Heard::default();
    let log = std::sync::Arc::clone(&heard);
    let c = builder(clock)
        .refresh_after(10 * SEC)
        .stale_if_error(stale_if_error)
        .eviction_listener(move |k: &u64, v: &u64, cause| log.lock().unwrap().push((*k, *v, cause)))
        .build()
        .unwrap();
    c.insert(1, 1);
    clock.advance(11 * SEC);
    (c, heard)
}

/// The listener hears of a refreshed value once, when it really leaves: replaced by the
/// refresh's value, removed by an invalidation during the refresh, or (stale-if-error) kept
/// through a failed refresh and removed later. (It used to hear `Replaced` when the refresh
/// started, and then again when a value kept through a failure left.)
#[test]
fn the_listener_hears_of_a_refreshed_value_once_when_it_leaves() {
    use herdcache::RemovalCause::{Invalidated, Replaced};
    let clock = ManualClock::new();
    // A failed refresh with stale-if-error keeps the value: nothing to hear until it goes.
    let (c, heard) = listening(&clock, true);
    assert_eq!(
        c.get_or_load(&1, |_| Err::<u64, _>("down".to_owned())),
        Ok(1)
    );
    assert_eq!(*heard.lock().unwrap(), [], "the value is still there");
    assert!(c.invalidate(&1));
    assert_eq!(*heard.lock().unwrap(), [(1, 1, Invalidated)]);

    // A refresh that succeeds replaces it: heard once, when the new value lands.
    let (c, heard) = listening(&clock, false);
    let (release, refresher) = held_load(&c, 1, 2);
    assert_eq!(
        *heard.lock().unwrap(),
        [],
        "readers are still served the value"
    );
    release.send(()).unwrap();
    assert_eq!(refresher.join().unwrap(), 2);
    assert_eq!(*heard.lock().unwrap(), [(1, 1, Replaced)]);

    // An invalidation during the refresh removes it: heard once, as invalidated.
    let (c, heard) = listening(&clock, false);
    let (release, refresher) = held_load(&c, 1, 2);
    assert!(c.invalidate(&1));
    release.send(()).unwrap();
    refresher.join().unwrap();
    assert_eq!(*heard.lock().unwrap(), [(1, 1, Invalidated)]);

    // A failed refresh without stale-if-error drops it: heard once.
    let (c, heard) = listening(&clock, false);
    assert!(c
        .get_or_load(&1, |_| Err::<u64, _>("down".to_owned()))
        .is_err());
    assert_eq!(*heard.lock().unwrap(), [(1, 1, Replaced)]);
    assert_eq!(c.get(&1), None);
}
