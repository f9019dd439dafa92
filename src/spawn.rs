//! The spawner: where the cache runs the loads it hands off, so that they outlive (or do not
//! hold up) the caller that started them.
//!
//! herdcache stays runtime-agnostic: a [`Spawner`] takes two kinds of work, a [`LoadTask`]
//! (a load led by a future, to poll on an async runtime) and a [`RefreshJob`] (an early refresh
//! with a blocking loader, to run on a thread that may block). One spawner serves every call
//! that hands work off. [`ThreadSpawner`] runs each on a thread of its own; the `tokio`
//! feature adds [`TokioSpawner`].

use std::fmt;
use std::future::Future;
use std::pin::{pin, Pin};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

use crate::RefreshJob;

/// Runs the work a cache hands off: configured with
/// [`CacheBuilder::spawner`](crate::CacheBuilder::spawner), and needed by the calls that never
/// make their caller run a load (the table in the [crate docs](crate#which-loading-call-when)).
///
/// Both methods must run what they receive to completion, or drop it: a dropped task or job
/// cancels its load (nothing is cached, its waiters look at the key again), and never leaves a
/// key stuck.
///
/// ```
/// use herdcache::{LoadTask, RefreshJob, Spawner};
///
/// /// Runs loads on a runtime of its own (here tokio's; smol's would be
/// /// `smol::spawn(task).detach()` and `smol::unblock(move || job.run()).detach()`).
/// struct OnRuntime(tokio::runtime::Handle);
///
/// impl Spawner for OnRuntime {
///     fn spawn(&self, task: LoadTask) {
///         drop(self.0.spawn(task));
///     }
///     fn spawn_blocking(&self, job: RefreshJob) {
///         drop(self.0.spawn_blocking(move || job.run()));
///     }
/// }
///
/// let runtime = tokio::runtime::Runtime::new()?;
/// let cache: herdcache::Cache<u64, u64> = herdcache::Cache::builder()
///     .max_capacity(100)
///     .spawner(OnRuntime(runtime.handle().clone()))
///     .build()?;
/// let v = runtime.block_on(cache.get_or_load_spawned(&1, |k| {
///     let k = *k;
///     async move { Ok::<_, std::io::Error>(k * 10) }
/// }));
/// assert_eq!(v?, 10);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub trait Spawner: Send + Sync + 'static {
    /// Polls `task` to completion as a task of an async runtime. The task never blocks its
    /// thread unless its loader does.
    fn spawn(&self, task: LoadTask);

    /// Runs `job` (call [`RefreshJob::run`]) on a thread that may block for as long as the
    /// loader runs: not on an async runtime's worker.
    fn spawn_blocking(&self, job: RefreshJob);
}

impl<T: Spawner + ?Sized> Spawner for Arc<T> {
    fn spawn(&self, task: LoadTask) {
        (**self).spawn(task)
    }

    fn spawn_blocking(&self, job: RefreshJob) {
        (**self).spawn_blocking(job)
    }
}

/// A [`Spawner`] that runs each task and job on a new thread of its own (a task is polled
/// there, parking between polls). Simple and runtime-free, for caches whose handed-off loads
/// are rare (early refreshes of a few hot keys); a busy service should hand them to its
/// runtime or pool instead. Its threads run no async runtime: a loader future that needs one
/// (tokio's I/O or timers) panics there, which its callers get as
/// [`LoadError::Panicked`](crate::LoadError::Panicked), and with a shared tier (feature
/// `redis`) its loads skip the tier (counted in `Stats::shared_skipped`). Use
/// `TokioSpawner` for such loaders.
///
/// ```
/// use std::time::Duration;
/// let clock = herdcache::ManualClock::new();
/// let cache: herdcache::Cache<u64, u64> = herdcache::Cache::builder()
///     .max_capacity(100)
///     .refresh_after(Duration::from_secs(10))
///     .clock(clock.clone())
///     .spawner(herdcache::ThreadSpawner)
///     .build()?;
/// cache.insert(1, 1);
/// clock.advance(Duration::from_secs(11));
/// // Due for a refresh: it runs on a thread of its own, and the reader gets the current value.
/// assert_eq!(cache.get_or_load_background(&1, |_| Ok::<_, ()>(2)), Ok(1));
/// # Ok::<(), herdcache::BuildError>(())
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct ThreadSpawner;

impl Spawner for ThreadSpawner {
    fn spawn(&self, task: LoadTask) {
        // Detached: the task reports through the flight. If no thread can be made the task is
        // dropped, which cancels its load.
        let _ = std::thread::Builder::new()
            .name("herdcache-load".into())
            .spawn(move || block_on(task));
    }

    fn spawn_blocking(&self, job: RefreshJob) {
        let _ = std::thread::Builder::new()
            .name("herdcache-refresh".into())
            .spawn(move || job.run());
    }
}

/// A [`Spawner`] on a tokio runtime (feature `tokio`): tasks run as tasks of the runtime
/// behind the handle, and jobs on its blocking threads (`spawn_blocking`).
///
/// ```
/// let runtime = tokio::runtime::Runtime::new()?;
/// let cache: herdcache::Cache<u64, u64> = herdcache::Cache::builder()
///     .max_capacity(100)
///     .spawner(herdcache::TokioSpawner::new(runtime.handle().clone()))
///     .build()?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[cfg(feature = "tokio")]
#[cfg_attr(docsrs, doc(cfg(feature = "tokio")))]
#[derive(Debug, Clone)]
pub struct TokioSpawner {
    handle: tokio::runtime::Handle,
}

#[cfg(feature = "tokio")]
impl TokioSpawner {
    /// A spawner on the runtime behind `handle`.
    ///
    /// ```
    /// # let runtime = tokio::runtime::Runtime::new()?;
    /// let spawner = herdcache::TokioSpawner::new(runtime.handle().clone());
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn new(handle: tokio::runtime::Handle) -> Self {
        TokioSpawner { handle }
    }

    /// A spawner on the runtime this is called from, or `None` outside of one.
    ///
    /// ```
    /// assert!(herdcache::TokioSpawner::current().is_none());
    /// let runtime = tokio::runtime::Runtime::new()?;
    /// assert!(runtime.block_on(async { herdcache::TokioSpawner::current() }).is_some());
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn current() -> Option<Self> {
        tokio::runtime::Handle::try_current().ok().map(Self::new)
    }
}

#[cfg(feature = "tokio")]
impl Spawner for TokioSpawner {
    fn spawn(&self, task: LoadTask) {
        // Detached: the task reports through the flight, not through its join handle.
        drop(self.handle.spawn(task));
    }

    fn spawn_blocking(&self, job: RefreshJob) {
        drop(self.handle.spawn_blocking(move || job.run()));
    }
}

/// A load (or early refresh) that [`Cache::get_or_load_spawned`](crate::Cache::get_or_load_spawned)
/// hands to the cache's [`Spawner`]: poll it to completion on any executor.
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
/// use herdcache::{LoadTask, RefreshJob, Spawner};
///
/// /// A real spawner polls each task (`tokio::spawn(task)`); this one drops it.
/// struct Overloaded;
/// impl Spawner for Overloaded {
///     fn spawn(&self, task: LoadTask) { drop(task) }
///     fn spawn_blocking(&self, job: RefreshJob) { drop(job) }
/// }
///
/// let cache: herdcache::Cache<u32, u32> = herdcache::Cache::builder()
///     .max_capacity(100)
///     .spawner(Overloaded)
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

/// The cache's spawner, shared by its handles.
#[derive(Clone)]
pub(crate) struct SharedSpawner(pub(crate) Arc<dyn Spawner>);

impl fmt::Debug for SharedSpawner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Spawner").finish_non_exhaustive()
    }
}

impl std::ops::Deref for SharedSpawner {
    type Target = dyn Spawner;

    fn deref(&self) -> &dyn Spawner {
        &*self.0
    }
}

/// Runs a future on this thread, parking between polls. The first poll uses a no-op waker:
/// the threads' miss path and the sync fleet store never return `Pending`, so they cost no
/// waker; a future that does return `Pending` is polled again with one that unparks this
/// thread, which it registers then (every poll that returns `Pending` registers its waker).
pub(crate) fn block_on<F: Future>(f: F) -> F::Output {
    struct Unpark(std::thread::Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let mut f = pin!(f);
    if let Poll::Ready(v) = f.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        return v;
    }
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    loop {
        match f.as_mut().poll(&mut cx) {
            Poll::Ready(v) => return v,
            Poll::Pending => std::thread::park(),
        }
    }
}
