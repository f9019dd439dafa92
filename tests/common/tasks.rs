//! Helpers for the tokio tests of the futures' miss path.

use std::sync::Arc;

use herdcache::{Cache, LoadError};
use tokio::sync::Notify;

/// Which miss path a gated load takes.
#[derive(Debug, Clone, Copy)]
pub enum Via {
    /// `get_or_load_async`: the task that wins runs the load.
    Inline,
    /// `get_or_load_spawned`: the load runs on the cache's task spawner.
    Spawned,
}

/// Spawns a task that loads `key` through `via`, with a loader that returns `value` once the
/// returned gate is opened.
pub fn gated_load(
    cache: &Cache<u32, u64>,
    key: u32,
    value: u64,
    via: Via,
) -> (
    tokio::task::JoinHandle<Result<u64, LoadError<()>>>,
    Arc<Notify>,
) {
    let gate = Arc::new(Notify::new());
    let (cache, opened) = (cache.clone(), gate.clone());
    let task = tokio::spawn(async move {
        let loader = move |_: &u32| async move {
            opened.notified().await;
            Ok::<_, ()>(value)
        };
        match via {
            Via::Inline => cache.get_or_load_async(&key, loader).await,
            Via::Spawned => cache.get_or_load_spawned(&key, loader).await,
        }
    });
    (task, gate)
}

/// Waits (yielding) until `cond` holds: lets a test order its tasks without sleeping. Fails
/// the test after 30 s rather than hanging it.
pub async fn until(cond: impl Fn() -> bool) {
    let bound = std::time::Duration::from_secs(30);
    let deadline = std::time::Instant::now() + bound;
    while !cond() {
        assert!(
            std::time::Instant::now() < deadline,
            "the awaited condition did not hold within {bound:?}"
        );
        tokio::task::yield_now().await;
    }
}

/// Polls a future on this thread until it is ready, parking between polls; fails the test if
/// it is not ready within 30 s.
pub fn block_on<F: std::future::Future>(f: F) -> F::Output {
    struct Unpark(std::thread::Thread);
    impl std::task::Wake for Unpark {
        fn wake(self: std::sync::Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = std::task::Waker::from(std::sync::Arc::new(Unpark(std::thread::current())));
    let mut cx = std::task::Context::from_waker(&waker);
    let mut f = std::pin::pin!(f);
    let bound = std::time::Duration::from_secs(30);
    let deadline = std::time::Instant::now() + bound;
    loop {
        if let std::task::Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the future was not ready within {bound:?}"
        );
        std::thread::park_timeout(std::time::Duration::from_millis(100));
    }
}
