//! Events for the `tracing` feature. Without it the macro expands to nothing, so the call
//! sites cost nothing and need no `cfg` of their own.

/// `trace_event!(Level, fields..., "message")`: a `tracing` event under the `tracing`
/// feature, with target `herdcache`; nothing otherwise.
macro_rules! trace_event {
    ($level:ident, $($rest:tt)+) => {
        #[cfg(feature = "tracing")]
        tracing::event!(target: "herdcache", tracing::Level::$level, $($rest)+);
    };
}

pub(crate) use trace_event;
