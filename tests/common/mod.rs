//! Helpers shared by the integration tests.
// Each test crate includes these helpers and uses some: the rest is dead there, and `pub`
// only says "for the including crate".
#![allow(dead_code, unreachable_pub)]

pub mod tasks;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::{Duration, Instant};

use herdcache::Cache;

/// A cache of `capacity` entries with the default settings, where most tests start.
pub fn bounded<K, V>(capacity: u64) -> Cache<K, V>
where
    K: std::hash::Hash + Eq + Send + Sync + 'static,
    V: Send + Sync + 'static,
{
    Cache::builder()
        .max_capacity(capacity)
        .build()
        .expect("a valid capacity")
}

/// A value that counts its drops (and its clones, which are drops too when they go).
#[derive(Debug)]
pub struct Tracked {
    pub id: u64,
    drops: Arc<AtomicUsize>,
}

impl Tracked {
    pub fn new(id: u64, drops: &Arc<AtomicUsize>) -> Self {
        Tracked {
            id,
            drops: Arc::clone(drops),
        }
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        self.drops.fetch_add(1, Ordering::Relaxed);
    }
}

/// Starts a `get_or_load` of `key` on another thread, whose loader returns `value` once the
/// returned sender fires; returns when that loader is running (so the load is in flight, a
/// refresh of a due key is in progress, or the cache's one load permit is held).
pub fn held_load(
    c: &Cache<u64, u64>,
    key: u64,
    value: u64,
) -> (mpsc::Sender<()>, thread::JoinHandle<u64>) {
    let (release, gate) = mpsc::channel::<()>();
    let (started, is_started) = mpsc::channel();
    let c = c.clone();
    let t = thread::spawn(move || {
        c.get_or_load(&key, |_| {
            started.send(()).unwrap();
            gate.recv().unwrap();
            Ok::<_, ()>(value)
        })
        .unwrap()
    });
    is_started.recv().unwrap();
    (release, t)
}

/// Spins until `waiters` callers have joined loads on `c` (its `coalesced_waits`), failing
/// the test after 30 s instead of hanging it: how a test holds a leader's loader until its
/// waiters are parked, without sleeping.
pub fn await_waiters<K, V, S>(c: &Cache<K, V, S>, waiters: u64)
where
    K: std::hash::Hash + Eq + Send + Sync + 'static,
    V: Send + Sync + 'static,
    S: std::hash::BuildHasher,
{
    spin_until(&format!("{waiters} waiters joining the load"), || {
        c.stats().coalesced_waits >= waiters
    });
}

/// Spins (yielding) until `cond` holds, so that a test can order its threads without
/// sleeping; fails the test with `what` after 30 s instead of hanging it.
pub fn spin_until(what: &str, cond: impl Fn() -> bool) {
    let bound = Duration::from_secs(30);
    let deadline = Instant::now() + bound;
    while !cond() {
        assert!(Instant::now() < deadline, "{what}: not within {bound:?}");
        thread::yield_now();
    }
}

/// Waits (sleeping a millisecond at a time) until `cond` holds, and returns how long that
/// took; fails the test with `what` after 30 s instead of hanging it. For conditions another
/// process or a server brings about, where spinning would only steal its CPU.
pub fn wait_until(what: &str, mut cond: impl FnMut() -> bool) -> Duration {
    let bound = Duration::from_secs(30);
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < bound, "{what}: not within {bound:?}");
        thread::sleep(Duration::from_millis(1));
    }
    start.elapsed()
}

/// Polls `f` with a waker that does nothing until it is ready: the simplest executor there
/// is (it allocates nothing of its own). Fails the test if `f` is not ready within 30 s
/// instead of spinning for ever.
pub fn poll_until_ready<F: std::future::Future>(f: F) -> F::Output {
    use std::task::{Context, Poll, Waker};
    let bound = Duration::from_secs(30);
    let deadline = Instant::now() + bound;
    let mut f = std::pin::pin!(f);
    let mut cx = Context::from_waker(Waker::noop());
    loop {
        if let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "the future was not ready within {bound:?}"
        );
        thread::yield_now();
    }
}

/// The text a panic a test causes on purpose carries: the hook [`expect_panics`] installs
/// keeps such panics quiet, and prints every other one as usual.
pub const EXPECTED_PANIC: &str = "expected panic";

/// Quiets the panics tests cause on purpose (their message contains [`EXPECTED_PANIC`]) for
/// the rest of the test binary, leaving every other panic, an assertion's included, to the
/// hook that was there before.
pub fn expect_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !info.to_string().contains(EXPECTED_PANIC) {
                previous(info);
            }
        }));
    });
}

/// Sets its flag when dropped, however the scope it guards ends: a test's helper threads
/// that loop until the flag is set stop even when the test's own assertion fails (a scope
/// would otherwise wait for them for ever, and the test hang instead of failing).
pub struct StopOnDrop<'a>(pub &'a std::sync::atomic::AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// A spawner that queues refresh jobs for the test to run (or drop) when it likes, and drops
/// load tasks (the tests that use it hand off no futures).
#[derive(Clone, Default)]
pub struct Queued(pub Arc<std::sync::Mutex<Vec<herdcache::RefreshJob>>>);

impl herdcache::Spawner for Queued {
    fn spawn(&self, task: herdcache::LoadTask) {
        drop(task);
    }

    fn spawn_blocking(&self, job: herdcache::RefreshJob) {
        self.0.lock().unwrap().push(job);
    }
}

/// A spawner that drops everything handed to it, as an overloaded or shut-down one would.
pub struct DropAll;

impl herdcache::Spawner for DropAll {
    fn spawn(&self, task: herdcache::LoadTask) {
        drop(task);
    }

    fn spawn_blocking(&self, job: herdcache::RefreshJob) {
        drop(job);
    }
}
