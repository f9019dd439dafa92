//! Time sources: the monotonic system clock by default, a [`ManualClock`] for tests.
//!
//! The cache reads time as nanoseconds since an origin of the clock's choosing. It reads the
//! clock only for entries that can expire, so a cache without TTLs never reads it on a hit.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// A monotonic source of time for expiry decisions.
///
/// Implement it to drive a cache from your own notion of time; the cache calls [`now`] on
/// every read of an entry that has an expiry, so it should be cheap. Unlike the other user
/// code a cache runs, it must not panic: the cache reads the clock while cleaning up after a
/// failed load, where a panic cannot be contained. (Elsewhere a panic reaches only the
/// operation that read the clock; the eviction policy never reads it under its lock.)
///
/// ```
/// use std::sync::atomic::{AtomicU64, Ordering};
/// use std::sync::Arc;
/// use std::time::Duration;
///
/// /// Whole seconds, set by a simulation.
/// #[derive(Debug, Clone, Default)]
/// struct SimSeconds(Arc<AtomicU64>);
/// impl herdcache::Clock for SimSeconds {
///     fn now(&self) -> Duration {
///         Duration::from_secs(self.0.load(Ordering::Relaxed))
///     }
/// }
/// let sim = SimSeconds::default();
/// let cache = herdcache::Cache::builder()
///     .max_capacity(10)
///     .time_to_live(Duration::from_secs(10))
///     .clock(sim.clone())
///     .build()?;
/// cache.insert(1, "one");
/// sim.0.store(10, Ordering::Relaxed);
/// assert_eq!(cache.get(&1), None);
/// # Ok::<(), herdcache::BuildError>(())
/// ```
///
/// [`now`]: Clock::now
pub trait Clock: Send + Sync + fmt::Debug + 'static {
    /// Time elapsed since this clock's fixed origin. Must never decrease.
    fn now(&self) -> Duration;
}

/// The default clock: monotonic time since the moment the cache was built, read from the
/// CPU's time-stamp counter where it is invariant (through the `quanta` crate, calibrated once
/// per process in about a millisecond), else from
/// [`Instant::now`](std::time::Instant::now). A read of the counter costs about half of
/// `Instant::now`'s vDSO call (15 against 28 ns on the machine the crate's benchmarks run
/// on), and the cache reads the clock on every hit and write of an entry that can expire.
///
/// ```
/// use herdcache::{Clock, SystemClock};
/// let clock = SystemClock::new();
/// let (a, b) = (clock.now(), clock.now());
/// assert!(b >= a); // monotonic
/// // The default: naming it is the same as leaving the clock unset.
/// let cache: herdcache::Cache<u32, u32> =
///     herdcache::Cache::builder().max_capacity(10).clock(clock).build()?;
/// # let _ = cache;
/// # Ok::<(), herdcache::BuildError>(())
/// ```
#[derive(Debug, Clone, Copy)]
pub struct SystemClock {
    origin: system::Reading,
}

/// The system clock's readings: the TSC through one process-wide `quanta::Clock` (read
/// directly, not through `quanta::Instant::now`, whose thread-local override check would cost
/// every read, could panic in a thread-local destructor, and would hand the cache's time to a
/// mock a user installs for their own code), but `std`'s under Miri (which cannot run the
/// counter's instruction) and loom.
#[cfg(not(any(miri, herdcache_loom)))]
mod system {
    use std::sync::OnceLock;

    pub(super) type Reading = quanta::Instant;

    static CLOCK: OnceLock<quanta::Clock> = OnceLock::new();

    #[inline]
    pub(super) fn now() -> Reading {
        CLOCK.get_or_init(quanta::Clock::new).now()
    }
}

#[cfg(any(miri, herdcache_loom))]
mod system {
    pub(super) type Reading = std::time::Instant;

    pub(super) fn now() -> Reading {
        Reading::now()
    }
}

impl SystemClock {
    /// A clock whose origin is now.
    ///
    /// ```
    /// use std::time::Duration;
    /// use herdcache::{Clock, SystemClock};
    /// let clock = SystemClock::new();
    /// assert!(clock.now() < Duration::from_secs(60)); // counts from its creation
    /// ```
    pub fn new() -> Self {
        SystemClock {
            origin: system::now(),
        }
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for SystemClock {
    #[inline]
    fn now(&self) -> Duration {
        system::now().saturating_duration_since(self.origin)
    }
}

/// A clock that moves only when told to: TTL behaviour can be tested without sleeping.
///
/// Clones share one time line, so keep a clone to advance the clock a cache was built with.
///
/// ```
/// use std::time::Duration;
/// use herdcache::{Cache, ManualClock};
///
/// let clock = ManualClock::new();
/// let cache: Cache<&str, u32> = Cache::builder()
///     .max_capacity(10)
///     .time_to_live(Duration::from_secs(60))
///     .clock(clock.clone())
///     .build()
///     .unwrap();
/// cache.insert("a", 1);
/// clock.advance(Duration::from_secs(59));
/// assert_eq!(cache.get("a"), Some(1));
/// clock.advance(Duration::from_secs(1));
/// assert_eq!(cache.get("a"), None);
/// ```
#[derive(Debug, Clone, Default)]
pub struct ManualClock {
    nanos: Arc<AtomicU64>,
}

impl ManualClock {
    /// A clock at time zero.
    ///
    /// ```
    /// use std::time::Duration;
    /// let clock = herdcache::ManualClock::new();
    /// assert_eq!(clock.now(), Duration::ZERO);
    /// ```
    pub fn new() -> Self {
        Self::default()
    }

    /// Moves the clock forward by `by` (saturating at about 584 years).
    ///
    /// ```
    /// use std::time::Duration;
    /// let clock = herdcache::ManualClock::new();
    /// let shared = clock.clone();
    /// clock.advance(Duration::from_secs(3));
    /// assert_eq!(shared.now(), Duration::from_secs(3)); // clones share one time line
    /// clock.advance(Duration::MAX);
    /// assert_eq!(clock.now(), Duration::from_nanos(u64::MAX));
    /// ```
    pub fn advance(&self, by: Duration) {
        let by = duration_to_nanos(by);
        // Relaxed is enough: the clock is a value, not a synchronisation point; tests that
        // advance it on one thread and read on another synchronise by other means (joins).
        let _ = self
            .nanos
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                Some(n.saturating_add(by))
            });
    }

    /// The current reading.
    ///
    /// ```
    /// use std::time::Duration;
    /// let clock = herdcache::ManualClock::new();
    /// clock.advance(Duration::from_millis(1_500));
    /// assert_eq!(clock.now(), Duration::from_millis(1_500));
    /// ```
    pub fn now(&self) -> Duration {
        Duration::from_nanos(self.nanos.load(Ordering::Relaxed))
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Duration {
        ManualClock::now(self)
    }
}

/// Converts a duration to nanoseconds, saturating at `u64::MAX`.
#[inline]
pub(crate) fn duration_to_nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// The clock a cache reads, with the common case (the system clock) dispatched statically.
#[derive(Debug, Clone)]
pub(crate) enum TimeSource {
    System(SystemClock),
    Custom(Arc<dyn Clock>),
}

impl TimeSource {
    /// Nanoseconds since the clock's origin.
    #[inline]
    pub(crate) fn now_nanos(&self) -> u64 {
        let now = match self {
            TimeSource::System(c) => c.now(),
            TimeSource::Custom(c) => {
                crate::sync::user_code_may_run("a custom clock");
                c.now()
            }
        };
        duration_to_nanos(now)
    }
}

/// A clock reading taken at most once, on first use: for decisions that may or may not need
/// the time, several times over.
#[derive(Debug)]
pub(crate) struct OnceNow<'a> {
    clock: &'a TimeSource,
    now: std::cell::Cell<Option<u64>>,
}

impl<'a> OnceNow<'a> {
    pub(crate) fn new(clock: &'a TimeSource) -> Self {
        OnceNow {
            clock,
            now: std::cell::Cell::new(None),
        }
    }

    /// Forgets the reading: user code ran since it was taken (a listener, a hook), which
    /// may have taken any time, so the next use reads the clock again.
    pub(crate) fn renew(&self) {
        self.now.set(None);
    }

    /// Nanoseconds since the clock's origin, as read on the first call.
    pub(crate) fn get(&self) -> u64 {
        match self.now.get() {
            Some(n) => n,
            None => {
                let n = self.clock.now_nanos();
                self.now.set(Some(n));
                n
            }
        }
    }
}

/// Expiry of an entry that never expires.
pub(crate) const NEVER: u64 = u64::MAX;

/// Idle deadlines (`time_to_idle`) are kept in 32 bits, in units of `2^IDLE_SHIFT` ns (about
/// 16.8 ms): a deadline moves at most once per unit, so a hot entry's is written about 60
/// times a second at most, and 32 bits compared with wrapping arithmetic reach 2^31 units
/// (about 14 months) ahead or behind.
pub(crate) const IDLE_SHIFT: u32 = 24;

/// The longest `time_to_idle`: a year, well within the deadlines' reach.
pub(crate) const MAX_IDLE: Duration = Duration::from_secs(365 * 24 * 3600);

/// `now` (nanoseconds) in idle units.
#[inline]
pub(crate) fn idle_unit(now: u64) -> u32 {
    (now >> IDLE_SHIFT) as u32
}

/// A `time_to_idle` in idle units, rounded up (an entry never expires early for it) and at
/// least one.
pub(crate) fn idle_units(tti: Duration) -> u32 {
    let unit = 1u64 << IDLE_SHIFT;
    let units = duration_to_nanos(tti).div_ceil(unit).max(1);
    u32::try_from(units).unwrap_or(u32::MAX >> 1)
}

/// The expiry of something that lives `ttl` from `now`: a finite TTL never becomes
/// [`NEVER`], even at the end of the clock's range (it saturates just below it).
#[inline]
pub(crate) fn expiry_after(now: u64, ttl: u64) -> u64 {
    now.saturating_add(ttl).min(NEVER - 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_clones_share_time_and_saturate() {
        let a = ManualClock::new();
        let b = a.clone();
        a.advance(Duration::from_secs(3));
        assert_eq!(b.now(), Duration::from_secs(3));
        b.advance(Duration::MAX);
        assert_eq!(a.now(), Duration::from_nanos(u64::MAX));
    }

    #[test]
    fn once_now_reads_the_clock_once() {
        let clock = ManualClock::new();
        let source = TimeSource::Custom(Arc::new(clock.clone()));
        let now = OnceNow::new(&source);
        clock.advance(Duration::from_secs(1));
        assert_eq!(now.get(), 1_000_000_000);
        clock.advance(Duration::from_secs(1));
        assert_eq!(now.get(), 1_000_000_000);
    }

    #[test]
    fn system_clock_is_monotonic() {
        let c = SystemClock::new();
        let t1 = c.now();
        let t2 = c.now();
        assert!(t2 >= t1);
    }
}
