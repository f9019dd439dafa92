//! `get_with` and `get_with_async`: single flight for a loader that cannot fail, where
//! whatever ends a load without a value (another caller's panic) makes the caller look again.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Barrier;
use std::thread;

use herdcache::Cache;

mod common;
use common::await_waiters;

type C = Cache<String, String>;

#[test]
fn threads_missing_together_run_init_once() {
    let c = common::bounded(100);
    let calls = AtomicUsize::new(0);
    let n = 6;
    let barrier = Barrier::new(n);
    let results: Vec<String> = thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|_| {
                s.spawn(|| {
                    barrier.wait();
                    c.get_with("k", |k| {
                        calls.fetch_add(1, Ordering::SeqCst);
                        await_waiters(&c, n as u64 - 1);
                        format!("{k}!")
                    })
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert!(results.iter().all(|v| v == "k!"), "{results:?}");
    assert_eq!(c.get("k").as_deref(), Some("k!"));
}

#[test]
fn a_waiter_whose_leader_panicked_computes_the_value_itself() {
    let c = common::bounded(100);
    thread::scope(|s| {
        let leader = s.spawn(|| {
            catch_unwind(AssertUnwindSafe(|| {
                c.get_with("k", |_| -> String {
                    await_waiters(&c, 1);
                    panic!("user code: init panics")
                })
            }))
        });
        // Joins the leader's load (once it has started), then leads the next one itself.
        while c.stats().loads == 0 {
            thread::yield_now();
        }
        let v = c.get_with("k", |_| "from the waiter".to_owned());
        assert_eq!(v, "from the waiter");
        assert!(
            leader.join().unwrap().is_err(),
            "the leader's panic reached it"
        );
    });
    assert_eq!(c.stats().load_panics, 1);
    assert_eq!(c.get("k").as_deref(), Some("from the waiter"));
}

#[test]
fn an_init_that_reenters_its_own_key_panics_instead_of_waiting_for_itself() {
    let c = common::bounded(100);
    let r = catch_unwind(AssertUnwindSafe(|| {
        c.get_with("k", |_| c.get_with("k", |_| "inner".to_owned()))
    }));
    let msg = r.expect_err("re-entry must panic");
    let msg = msg
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| msg.downcast_ref::<String>().cloned())
        .unwrap_or_default();
    assert!(msg.contains("called back into the cache"), "{msg}");
    // The key is usable afterwards.
    assert_eq!(c.get_with("k", |_| "v".to_owned()), "v");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn futures_missing_together_run_init_once() {
    let c = common::bounded(100);
    let calls = std::sync::Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..20)
        .map(|_| {
            let (c, calls) = (c.clone(), calls.clone());
            tokio::spawn(async move {
                c.get_with_async("k", |k: &String| {
                    calls.fetch_add(1, Ordering::SeqCst);
                    let v = format!("{k}?");
                    async move {
                        tokio::task::yield_now().await;
                        v
                    }
                })
                .await
            })
        })
        .collect();
    for t in tasks {
        assert_eq!(t.await.unwrap(), "k?");
    }
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[test]
fn a_load_timeout_shorter_than_any_load_does_not_stop_the_callers_own_load() {
    // The caller's own inline load once counted as past its deadline before it started, so
    // `get_with` looked again for ever.
    let c: C = Cache::builder()
        .max_capacity(10)
        .load_timeout(std::time::Duration::from_nanos(1))
        .build()
        .unwrap();
    assert_eq!(c.get_with("k", |k| format!("{k}!")), "k!");
}

/// `get_with_async` returns a value even when the cache's `load_timeout` passes while its
/// init future runs: the load is detached at the deadline (its waiters answered, the key
/// free for a new load) and the caller's init goes on to its end. (The init future used to
/// be dropped at the deadline, and the call panicked, having nothing to return.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_with_async_outlives_the_load_timeout_it_led_past() {
    use std::time::Duration;
    let c: C = Cache::builder()
        .max_capacity(10)
        .load_timeout(Duration::from_millis(20))
        .build()
        .unwrap();
    let (passed, gate) = tokio::sync::oneshot::channel::<()>();
    let c2 = c.clone();
    let slow = tokio::spawn(async move {
        c2.get_with_async("k", |k: &String| {
            let k = k.clone();
            async move {
                let _ = gate.await; // runs past the load's deadline
                format!("{k}!")
            }
        })
        .await
    });
    // Past the deadline the key is free: another caller leads its own load meanwhile.
    let other = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            tokio::time::sleep(Duration::from_millis(10)).await;
            let r = c
                .get_or_load_async("k", |_| async { Ok::<_, ()>("other".to_owned()) })
                .await;
            if r.is_ok() {
                return r;
            }
        }
    })
    .await
    .expect("the key stayed held past the load's deadline");
    assert_eq!(other, Ok("other".to_owned()));
    passed.send(()).unwrap();
    let got = tokio::time::timeout(Duration::from_secs(20), slow)
        .await
        .expect("get_with_async did not return")
        .expect("get_with_async panicked");
    assert_eq!(got, "k!", "the caller's own init ran to its end");
    assert_eq!(
        c.get("k"),
        Some("other".to_owned()),
        "the late value is not cached"
    );
}

/// A loader that may find nothing: callers missing together run it once and share its
/// answer; nothing found is not cached, unless `negative_ttl` asks for the absence to be.
#[test]
fn optionally_get_with_shares_one_answer_and_caches_absence_only_if_asked() {
    use std::time::Duration;
    let c = common::bounded(100);
    let calls = AtomicUsize::new(0);
    let barrier = Barrier::new(4);
    thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                barrier.wait();
                let got = c.optionally_get_with("k", |_| {
                    calls.fetch_add(1, Ordering::SeqCst);
                    await_waiters(&c, 3);
                    None
                });
                assert_eq!(got, None);
            });
        }
    });
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "one init for the callers missing together"
    );
    assert_eq!(c.get("k"), None, "the absence is not cached");
    assert_eq!(
        c.optionally_get_with("k", |k| Some(format!("{k}!")))
            .as_deref(),
        Some("k!")
    );
    assert_eq!(c.get("k").as_deref(), Some("k!"));

    let clock = herdcache::ManualClock::new();
    let negative: C = Cache::builder()
        .max_capacity(10)
        .negative_ttl(Duration::from_secs(5))
        .clock(clock.clone())
        .build()
        .unwrap();
    assert_eq!(negative.optionally_get_with("gone", |_| None), None);
    assert_eq!(
        negative.optionally_get_with("gone", |_| unreachable!("the absence is cached")),
        None
    );
    clock.advance(Duration::from_secs(6));
    assert_eq!(
        negative
            .optionally_get_with("gone", |_| Some("back".to_owned()))
            .as_deref(),
        Some("back")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn optionally_get_with_async_returns_what_its_init_found() {
    let c = common::bounded(100);
    assert_eq!(
        c.optionally_get_with_async("k", |_| async { None }).await,
        None
    );
    let got = c
        .optionally_get_with_async("k", |k: &String| {
            let v = format!("{k}?");
            async move { Some(v) }
        })
        .await;
    assert_eq!(got.as_deref(), Some("k?"));
    assert_eq!(c.get("k").as_deref(), Some("k?"));
}
