//! Detached loads for futures: the task spawner that runs a load led by a future as a task of
//! its own, so that the load outlives the future that started it.
//!
//! herdcache stays runtime-agnostic: a spawner is any `Fn(LoadTask)` that runs the task to
//! completion somewhere (`tokio::spawn`, `smol::spawn(..).detach()`, a custom executor). The
//! `tokio` feature adds [`CacheBuilder::tokio_spawner`](crate::CacheBuilder::tokio_spawner),
//! which spawns on a given runtime.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

/// A load (or early refresh) that [`Cache::get_or_load_spawned`](crate::Cache::get_or_load_spawned)
/// hands to the cache's [`task_spawner`](crate::CacheBuilder::task_spawner): poll it to
/// completion on any executor.
///
/// The task publishes the load's result and wakes the callers waiting for it. Dropping it
/// before it finishes (say, because the runtime shuts down) cancels the load: nothing is
/// cached, its waiters look at the key again, and the caller that handed it over gets
/// [`LoadError::Cancelled`](crate::LoadError::Cancelled).
///
/// ```
/// # fn block_on<F: std::future::Future>(f: F) -> F::Output {
/// #     use std::task::{Context, Poll, Waker};
/// #     let mut f = std::pin::pin!(f);
/// #     let mut cx = Context::from_waker(Waker::noop());
/// #     loop { if let Poll::Ready(v) = f.as_mut().poll(&mut cx) { return v; } }
/// # }
/// let cache: herdcache::Cache<u32, u32> = herdcache::Cache::builder()
///     .max_capacity(100)
///     // A real spawner polls each task (`tokio::spawn(task)`); this one drops it.
///     .task_spawner(|task: herdcache::LoadTask| drop(task))
///     .build()?;
/// let r = block_on(cache.get_or_load_spawned(&1, |_| async { Ok::<_, ()>(1) }));
/// assert_eq!(r, Err(herdcache::LoadError::Cancelled));
/// assert_eq!(cache.get(&1), None);
/// # Ok::<(), herdcache::BuildError>(())
/// ```
#[must_use = "a load task does nothing unless it is polled"]
pub struct LoadTask {
    task: Pin<Box<dyn Future<Output = ()> + Send>>,
}

impl LoadTask {
    pub(crate) fn new(task: impl Future<Output = ()> + Send + 'static) -> Self {
        LoadTask {
            task: Box::pin(task),
        }
    }
}

impl Future for LoadTask {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        self.task.as_mut().poll(cx)
    }
}

impl fmt::Debug for LoadTask {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LoadTask").finish_non_exhaustive()
    }
}

/// Where load tasks go.
#[derive(Clone)]
pub(crate) struct TaskSpawner(Arc<dyn Fn(LoadTask) + Send + Sync>);

impl TaskSpawner {
    pub(crate) fn new(spawn: impl Fn(LoadTask) + Send + Sync + 'static) -> Self {
        TaskSpawner(Arc::new(spawn))
    }

    /// A spawner that runs each task on `handle`'s runtime.
    #[cfg(feature = "tokio")]
    pub(crate) fn tokio(handle: tokio::runtime::Handle) -> Self {
        TaskSpawner::new(move |task| {
            // Detached: the task reports through the flight, not through its join handle.
            drop(handle.spawn(task));
        })
    }

    pub(crate) fn spawn(&self, task: impl Future<Output = ()> + Send + 'static) {
        (self.0)(LoadTask::new(task))
    }
}

impl fmt::Debug for TaskSpawner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TaskSpawner").finish_non_exhaustive()
    }
}
