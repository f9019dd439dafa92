//! The crate's errors: [`BuildError`], why a [`CacheBuilder`](crate::CacheBuilder) refused
//! its settings, and [`LoadError`], why a loading call returned no value.

use std::any::Any;
use std::fmt;
use std::sync::Arc;

/// A setting that [`CacheBuilder::build`](crate::CacheBuilder::build) rejected.
///
/// ```
/// use herdcache::{BuildError, Cache};
/// let err = Cache::<u32, u32>::builder().max_capacity(0).build().unwrap_err();
/// assert!(matches!(err, BuildError::Invalid { setting: "max_capacity", .. }));
/// assert_eq!(
///     err.to_string(),
///     "cache setting `max_capacity` is invalid: must be greater than zero"
/// );
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum BuildError {
    /// A required setting was not given.
    Missing {
        /// The builder method that sets it.
        setting: &'static str,
    },
    /// A setting's value is outside its valid range.
    Invalid {
        /// The builder method that set it.
        setting: &'static str,
        /// What the valid range is.
        reason: &'static str,
    },
}

impl BuildError {
    /// The name of the builder method whose setting is at fault.
    ///
    /// ```
    /// use std::time::Duration;
    /// let err = herdcache::Cache::<u32, u32>::builder()
    ///     .max_capacity(10)
    ///     .time_to_live(Duration::ZERO)
    ///     .build()
    ///     .unwrap_err();
    /// assert_eq!(err.setting(), "time_to_live");
    /// ```
    pub fn setting(&self) -> &'static str {
        match self {
            BuildError::Missing { setting } | BuildError::Invalid { setting, .. } => setting,
        }
    }
}

impl fmt::Display for BuildError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BuildError::Missing { setting } => {
                write!(f, "cache setting `{setting}` is required but was not given")
            }
            BuildError::Invalid { setting, reason } => {
                write!(f, "cache setting `{setting}` is invalid: {reason}")
            }
        }
    }
}

impl std::error::Error for BuildError {}

/// Why [`Cache::get_or_load`](crate::Cache::get_or_load) returned no value.
///
/// ```
/// use herdcache::LoadError;
/// let cache: herdcache::Cache<u32, u32> = herdcache::Cache::builder().max_capacity(10).build()?;
/// match cache.get_or_load(&1, |_| Err("not found")) {
///     Err(LoadError::Failed(e)) => assert_eq!(*e, "not found"), // the loader's own error
///     other => panic!("unexpected: {other:?}"),
/// }
/// // A call that needs a spawner, on a cache built without one.
/// let r = cache.get_or_load_background(&1, |_| Ok::<_, ()>(1));
/// assert_eq!(r, Err(LoadError::NoSpawner));
/// # Ok::<(), herdcache::BuildError>(())
/// ```
#[derive(Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LoadError<E> {
    /// The loader returned this error (the same `Arc` for every caller that waited on the
    /// load, or a cached one under [`negative_ttl`](crate::CacheBuilder::negative_ttl)).
    Failed(Arc<E>),
    /// The loader panicked. The panic continued in the caller that ran the loader; the others
    /// get this error, and the next caller starts a fresh load.
    Panicked,
    /// This caller's own deadline passed before the load finished, and no expired value
    /// within [`max_stale`](crate::CacheBuilder::max_stale) was kept to serve instead. The
    /// load carries on for the others.
    Timeout,
    /// The load itself ran past the cache's
    /// [`load_timeout`](crate::CacheBuilder::load_timeout), and no expired value within
    /// [`max_stale`](crate::CacheBuilder::max_stale) was kept to serve instead. The load was
    /// detached: its permit is back, its late result will not be cached, and the next call
    /// starts a fresh load. Also what a caller gets that waited a whole `load_timeout` for
    /// a load permit ([`max_concurrent_loads`](crate::CacheBuilder::max_concurrent_loads))
    /// without getting one: its load never started.
    LoadTimedOut,
    /// The loader called back into the cache for the key it is loading; waiting on itself
    /// would never end.
    Recursive,
    /// The load this call handed to the cache's
    /// [`spawner`](crate::CacheBuilder::spawner) was dropped before it finished
    /// (the runtime shut down, or the spawner dropped the task). Nothing was cached; the next
    /// call loads afresh.
    Cancelled,
    /// The call hands its loads to a spawner and the cache was built without one
    /// ([`get_or_load_background`](crate::Cache::get_or_load_background) and
    /// [`get_or_load_spawned`](crate::Cache::get_or_load_spawned) need a
    /// [`spawner`](crate::CacheBuilder::spawner)). Returned at once, before any lookup, so that the mistake shows
    /// on the first call rather than as callers that wait or loads that vanish.
    NoSpawner,
}

impl<E> Clone for LoadError<E> {
    fn clone(&self) -> Self {
        match self {
            LoadError::Failed(e) => LoadError::Failed(Arc::clone(e)),
            other => other
                .recast()
                .expect("only `Failed` carries the loader's error"),
        }
    }
}

impl<E> LoadError<E> {
    /// This error as one of any loader error type, unless it is `Failed`, the one variant
    /// that carries the loader's own error.
    pub(crate) fn recast<F>(&self) -> Option<LoadError<F>> {
        Some(match self {
            LoadError::Failed(_) => return None,
            LoadError::Panicked => LoadError::Panicked,
            LoadError::Timeout => LoadError::Timeout,
            LoadError::LoadTimedOut => LoadError::LoadTimedOut,
            LoadError::Recursive => LoadError::Recursive,
            LoadError::Cancelled => LoadError::Cancelled,
            LoadError::NoSpawner => LoadError::NoSpawner,
        })
    }
}

/// What went wrong, without the loader's own error: that is the `source()`, so that a report
/// printing the chain (anyhow's `{:#}`, `Error::source` walks) shows it once.
impl<E> fmt::Display for LoadError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LoadError::Failed(_) => f.write_str("loader failed"),
            LoadError::Panicked => f.write_str("loader panicked"),
            LoadError::Timeout => f.write_str("timed out waiting for the load"),
            LoadError::LoadTimedOut => f.write_str("the load ran past its load_timeout"),
            LoadError::Recursive => f.write_str("loader re-entered the cache for its own key"),
            LoadError::Cancelled => f.write_str("the spawned load was dropped before it finished"),
            LoadError::NoSpawner => f.write_str(
                "this call runs loads on a spawner and the cache has none (see CacheBuilder::spawner)",
            ),
        }
    }
}

/// A `LoadError` is a `std::error::Error` whatever the loader's error type (`String`,
/// `anyhow::Error`, an `io::Error`, your own), so `?` works into `anyhow::Error`,
/// `Box<dyn Error + Send + Sync>` and the like. Its `source()` is the loader's error, shown
/// as that error shows itself: a report that prints the chain (anyhow's `{:#}`, a walk of
/// `source()`) shows it once, after "loader failed". Where the loader's error carries a chain
/// of its own, the chain goes on through it: an `anyhow::Error` (with the `anyhow` feature),
/// a `Box<dyn Error (+ Send + Sync)>`, an `Arc<dyn Error + Send + Sync>`, an `io::Error`.
/// For the loader's error as its own type, match [`LoadError::Failed`] (or
/// [`LoadError::failed`]).
///
/// ```
/// # #[cfg(feature = "anyhow")] {
/// use anyhow::Context;
/// #[derive(Debug)]
/// struct DbDown;
/// impl std::fmt::Display for DbDown {
///     fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
///         f.write_str("connection refused")
///     }
/// }
/// impl std::error::Error for DbDown {}
///
/// fn lookup(cache: &herdcache::Cache<u32, String>) -> anyhow::Result<String> {
///     Ok(cache.get_or_load(&1, |id| Err(DbDown).context(format!("loading user {id}")))?)
/// }
/// let cache = herdcache::Cache::builder().max_capacity(10).build().unwrap();
/// let e = lookup(&cache).unwrap_err();
/// assert_eq!(e.to_string(), "loader failed");
/// assert_eq!(format!("{e:#}"), "loader failed: loading user 1: connection refused");
/// assert!(e.chain().any(|c| c.downcast_ref::<DbDown>().is_some()));
/// # }
/// ```
impl<E: fmt::Debug + fmt::Display + Send + Sync + 'static> std::error::Error for LoadError<E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            LoadError::Failed(e) => Some(LoaderError::of(&**e)),
            _ => None,
        }
    }
}

impl<E> LoadError<E> {
    /// The loader's own error, if the load failed with one.
    ///
    /// ```
    /// let cache: herdcache::Cache<u32, u32> = herdcache::Cache::builder().max_capacity(10).build()?;
    /// let e = cache.get_or_load(&1, |_| Err("not found")).unwrap_err();
    /// assert_eq!(e.failed(), Some(&"not found"));
    /// # Ok::<(), herdcache::BuildError>(())
    /// ```
    pub fn failed(&self) -> Option<&E> {
        match self {
            LoadError::Failed(e) => Some(e),
            _ => None,
        }
    }
}

/// The loader's error as the source of a [`LoadError`]: shown as it shows itself, its own
/// chain reached where its type can carry one.
#[repr(transparent)]
struct LoaderError<E>(E);

impl<E> LoaderError<E> {
    fn of(e: &E) -> &Self {
        // SAFETY: `LoaderError<E>` is a transparent wrapper of `E`.
        unsafe { &*(e as *const E as *const Self) }
    }
}

impl<E: fmt::Display> fmt::Display for LoaderError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl<E: fmt::Debug> fmt::Debug for LoaderError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

impl<E: fmt::Debug + fmt::Display + Send + Sync + 'static> std::error::Error for LoaderError<E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        use std::error::Error;
        // The types that carry a chain behind their message: the next link is theirs.
        let e: &dyn Any = &self.0;
        #[cfg(feature = "anyhow")]
        if let Some(e) = e.downcast_ref::<anyhow::Error>() {
            return (**e).source();
        }
        if let Some(e) = e.downcast_ref::<Box<dyn Error + Send + Sync>>() {
            return e.source();
        }
        if let Some(e) = e.downcast_ref::<Arc<dyn Error + Send + Sync>>() {
            return e.source();
        }
        if let Some(e) = e.downcast_ref::<std::io::Error>() {
            return e.source();
        }
        None
    }
}
