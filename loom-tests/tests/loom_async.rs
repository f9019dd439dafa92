//! loom models of the futures' side of single flight: a leading future cancelled after its
//! first poll while a thread waits, a waiting future dropped racing the completion, and a
//! future and a thread waiting on one flight.
#![cfg(herdcache_loom)]

mod common;

use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use loom::thread;

use common::{cache, model, Fixed};

type C = herdcache::Cache<u64, u64, Fixed>;

/// A loader future that is pending on its first poll and never woken: the load it stands for
/// only ends when its future is dropped.
struct Stalled;

impl Future for Stalled {
    type Output = Result<u64, ()>;
    fn poll(self: std::pin::Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Self::Output> {
        Poll::Pending
    }
}

/// Polls `f` once with a waker that does nothing.
fn poll_once<F: Future>(f: std::pin::Pin<&mut F>) -> Poll<F::Output> {
    f.poll(&mut Context::from_waker(Waker::noop()))
}

/// A future leads a load, is polled once and dropped while a thread may be waiting on it:
/// the thread is never stranded; it loads the key itself (or found it already loaded).
#[test]
fn a_cancelled_leading_future_strands_no_waiter() {
    model(|| {
        let c: C = cache();
        let c2 = c.clone();
        let waiter = thread::spawn(move || c2.get_or_load(&1, |_| Ok::<_, ()>(2)));
        {
            let fut = pin!(c.get_or_load_async(&1, |_| Stalled));
            // Either it leads (and stalls) or it finds the thread's value.
            if let Poll::Ready(v) = poll_once(fut) {
                assert_eq!(v, Ok(2));
            }
        } // dropped here: a load it led is cancelled
        assert_eq!(waiter.join().unwrap(), Ok(2));
        assert_eq!(c.get(&1), Some(2));
    });
}

/// A future waiting on a thread's load is dropped at any point relative to the completion:
/// no use after free, the thread's value is cached, and a later read hits it.
#[test]
fn a_dropped_waiting_future_races_the_completion() {
    model(|| {
        let c: C = cache();
        let c2 = c.clone();
        let leader = thread::spawn(move || c2.get_or_load(&1, |_| Ok::<_, ()>(1)));
        {
            let fut = pin!(c.get_or_load_async(&1, |_| async { Ok::<_, ()>(3) }));
            let _ = poll_once(fut); // a hit, its own load (3), or registered and dropped
        }
        let led = leader.join().unwrap().unwrap();
        let cached = c.get(&1).unwrap();
        assert!(led == 1 || led == 3, "{led}");
        assert!(cached == 1 || cached == 3, "{cached}");
    });
}

/// A future (driven by loom's `block_on`, so it really waits for its waker) and a thread
/// miss together: one load, and both get its value.
#[test]
fn a_future_and_a_thread_share_one_load() {
    model(|| {
        let c: C = cache();
        let calls = std::sync::Arc::new(loom::sync::atomic::AtomicUsize::new(0));
        let (c2, calls2) = (c.clone(), calls.clone());
        let thread_side = thread::spawn(move || {
            c2.get_or_load(&1, |_| {
                calls2.fetch_add(1, loom::sync::atomic::Ordering::SeqCst);
                Ok::<_, ()>(5)
            })
        });
        let calls3 = calls.clone();
        let async_side = loom::future::block_on(c.get_or_load_async(&1, move |_| {
            calls3.fetch_add(1, loom::sync::atomic::Ordering::SeqCst);
            async { Ok::<_, ()>(5) }
        }));
        assert_eq!(async_side, Ok(5));
        assert_eq!(thread_side.join().unwrap(), Ok(5));
        assert_eq!(calls.load(loom::sync::atomic::Ordering::SeqCst), 1);
    });
}

/// A loader future that awaits its own key, while a thread misses the same key: the inner
/// call gets `Recursive` at once (the poll that runs it marks its thread as the flight's
/// leader), whatever the interleaving with the thread's install, wait or load, and both
/// callers get a value. Without the mark the inner call waited on its own flight for ever
/// (loom reports the deadlock).
#[test]
fn a_loader_future_awaiting_its_own_key_gets_recursive() {
    model(|| {
        let c: C = cache();
        let c2 = c.clone();
        let thread_side = thread::spawn(move || c2.get_or_load(&1, |_| Ok::<_, ()>(2)));
        let inner = c.clone();
        let got = loom::future::block_on(c.get_or_load_async(&1, |k| {
            let (k, inner) = (*k, inner.clone());
            async move {
                let again = inner
                    .get_or_load_async(&k, |_| async { Ok::<_, ()>(5) })
                    .await;
                assert_eq!(again, Err(herdcache::LoadError::Recursive));
                Ok::<_, ()>(7)
            }
        }));
        let other = thread_side.join().unwrap();
        // Whichever led, both got a value: its own, or the leader's.
        assert!(got == Ok(7) || got == Ok(2), "{got:?}");
        assert!(other == Ok(7) || other == Ok(2), "{other:?}");
    });
}
