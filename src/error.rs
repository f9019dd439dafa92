//! [`BuildError`]: why a [`CacheBuilder`](crate::CacheBuilder) refused its settings.

use std::fmt;

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
