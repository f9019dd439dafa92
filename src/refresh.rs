//! Early refresh: when a hit should start a refresh (XFetch, soft TTL), the per-entry flag
//! that lets only one caller start it, and the backoff after a failed refresh.
//!
//! A refresh is a load whose flight still serves the current value until its hard expiry
//! (see `engine/lifecycle.rs`): readers keep getting that value without waiting, and a
//! reader that meets the hard expiry mid-refresh waits on the same flight, so a key never
//! has two loads at once.
//!
//! # The hit's cost
//! Each entry carries `check_at`, the first instant at which any refresh rule could fire:
//! the soft expiry, or the point where XFetch's draw could first say yes. `-ln U` for a 53-bit
//! `U` is below [`MAX_NEG_LN_U`], so XFetch (refresh when `now - delta * beta * ln U >=
//! expiry`) cannot fire while `expiry - now > MAX_NEG_LN_U * delta * beta`. Before `check_at`,
//! a hit pays one comparison; after it, XFetch draws from a per-thread RNG.

use std::fmt;

use crate::clock::NEVER;
use crate::sync::{AtomicU64, Ordering};

/// Upper bound of `-ln U` for `U` in (0, 1] with 53 bits: `53 ln 2 = 36.74`.
pub(crate) const MAX_NEG_LN_U: f64 = 36.8;

/// The most of a value's lifetime that an early refresh may take back: XFetch's window never
/// opens before `lifetime / EARLY_SHARE_DIVISOR` (plus a load time, see `RefreshSettings::
/// state`) before the expiry, so the loads of one key start at least 4/5 of a lifetime apart:
/// at most 1.25 per TTL whatever the read rate and beta.
const EARLY_SHARE_DIVISOR: u64 = 5;

/// What a key's past loads leave to its next one: the load-time estimate and the refreshes
/// that failed in a row (kept by the refresh plan; none without a refresh rule).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct LoadHistory {
    /// The key's load-time estimate (EWMA), nanoseconds: XFetch's `delta`.
    pub(crate) delta: u64,
    /// Consecutive failed refreshes behind the value.
    pub(crate) failures: u32,
}

/// The load behind a write, as the refresh plan of the value it wrote needs it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct LoadRecord {
    /// The key's load-time estimate (EWMA), nanoseconds: XFetch's `delta`.
    pub(crate) delta: u64,
    /// How long the load that wrote this value took, nanoseconds (0: an insert, or a value
    /// put back): the value's lifetime started that long after the load did.
    pub(crate) took: u64,
    /// Consecutive failed refreshes behind the value.
    pub(crate) failures: u32,
}

/// First backoff after a failed refresh; it doubles per consecutive failure.
const BACKOFF_BASE_NANOS: u64 = 100_000_000;
/// Longest backoff.
const BACKOFF_MAX_NANOS: u64 = 30_000_000_000;

/// An early refresh that [`get_or_load_background`](crate::Cache::get_or_load_background)
/// hands to the cache's [`Spawner`](crate::Spawner): run it (on a thread that may block) to
/// load and publish the new value.
///
/// Dropping a job without running it is safe: the refresh counts as failed, the current value
/// stays in place until its hard expiry, and a later read retries after a backoff.
///
/// ```
/// use std::time::Duration;
/// use herdcache::{LoadTask, RefreshJob, Spawner};
///
/// /// Overloaded: sheds every handed-off load.
/// struct Shed;
/// impl Spawner for Shed {
///     fn spawn(&self, task: LoadTask) { drop(task) }
///     fn spawn_blocking(&self, job: RefreshJob) { drop(job) }
/// }
///
/// let clock = herdcache::ManualClock::new();
/// let cache: herdcache::Cache<u32, u32> = herdcache::Cache::builder()
///     .max_capacity(100)
///     .refresh_after(Duration::from_secs(10))
///     .clock(clock.clone())
///     .spawner(Shed)
///     .build()?;
/// cache.insert(1, 1);
/// clock.advance(Duration::from_secs(11));
/// assert_eq!(cache.get_or_load_background(&1, |_| Ok::<_, ()>(2)), Ok(1));
/// assert_eq!(cache.get(&1), Some(1)); // the job was dropped: the current value stays
/// # Ok::<(), herdcache::BuildError>(())
/// ```
pub struct RefreshJob {
    job: Box<dyn FnOnce() + Send>,
}

impl RefreshJob {
    pub(crate) fn new(job: impl FnOnce() + Send + 'static) -> Self {
        RefreshJob { job: Box::new(job) }
    }

    /// Runs the refresh: calls the loader and publishes its result.
    ///
    /// ```
    /// use std::time::Duration;
    /// use herdcache::{LoadTask, RefreshJob, Spawner};
    ///
    /// /// Runs each job on the thread that hands it over: for the example only, a real
    /// /// spawner uses another thread.
    /// struct Inline;
    /// impl Spawner for Inline {
    ///     fn spawn(&self, task: LoadTask) { drop(task) }
    ///     fn spawn_blocking(&self, job: RefreshJob) { job.run() }
    /// }
    ///
    /// let clock = herdcache::ManualClock::new();
    /// let cache: herdcache::Cache<u32, u32> = herdcache::Cache::builder()
    ///     .max_capacity(100)
    ///     .refresh_after(Duration::from_secs(10))
    ///     .clock(clock.clone())
    ///     .spawner(Inline)
    ///     .build()?;
    /// cache.insert(1, 1);
    /// clock.advance(Duration::from_secs(11));
    /// assert_eq!(cache.get_or_load_background(&1, |_| Ok::<_, ()>(2)), Ok(1));
    /// assert_eq!(cache.get(&1), Some(2)); // `run` loaded and published the new value
    /// # Ok::<(), herdcache::BuildError>(())
    /// ```
    pub fn run(self) {
        (self.job)()
    }
}

impl fmt::Debug for RefreshJob {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RefreshJob").finish_non_exhaustive()
    }
}

/// The cache's refresh settings.
#[derive(Clone, Default)]
pub(crate) struct RefreshSettings {
    /// Soft TTL: refresh once a value is this old (nanoseconds).
    pub(crate) soft_ttl: Option<u64>,
    /// XFetch's beta.
    pub(crate) beta: Option<f64>,
    /// Keep serving the old value (until its hard expiry) when a refresh fails.
    pub(crate) stale_if_error: bool,
}

impl fmt::Debug for RefreshSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RefreshSettings")
            .field("soft_ttl", &self.soft_ttl)
            .field("beta", &self.beta)
            .field("stale_if_error", &self.stale_if_error)
            .finish()
    }
}

/// Per-entry refresh state, fixed when the entry is written (a refresh writes a new entry),
/// except the claim flag. 24 bytes, so that with its allocator header it fills a 32-byte
/// block: the load-time estimate, the failure count and the claim share one word.
#[derive(Debug)]
pub(crate) struct RefreshState {
    /// No rule can fire before this instant.
    check_at: u64,
    soft_at: u64,
    /// From the top bit down: the claim flag, the consecutive failed refreshes behind this
    /// entry (15 bits, saturating), the measured load time in nanoseconds (EWMA; 48 bits,
    /// saturating at 78 hours).
    history: AtomicU64,
}

/// The claim flag in `RefreshState::history`.
const CLAIMED: u64 = 1 << 63;
/// Where the failure count starts in `RefreshState::history`.
const FAILURES_SHIFT: u32 = 48;
/// The largest failure count stored.
const MAX_FAILURES: u32 = (1 << 15) - 1;
/// The largest load time stored, in nanoseconds.
const MAX_DELTA: u64 = (1 << FAILURES_SHIFT) - 1;

impl RefreshState {
    /// The measured load time (EWMA), nanoseconds.
    pub(crate) fn delta(&self) -> u64 {
        self.history.load(Ordering::Relaxed) & MAX_DELTA
    }

    /// Consecutive failed refreshes behind this entry.
    pub(crate) fn failures(&self) -> u32 {
        // At most 15 bits once the flag is masked off.
        ((self.history.load(Ordering::Relaxed) & !CLAIMED) >> FAILURES_SHIFT) as u32
    }

    /// Claims this entry's refresh; true for exactly one caller. Test before set: once it is
    /// claimed, readers only read the flag. Relaxed: the claim elects, the CAS that then
    /// installs the refresh's flight on the slot orders everything else.
    pub(crate) fn try_claim(&self) -> bool {
        let seen = self.history.load(Ordering::Relaxed);
        seen & CLAIMED == 0
            && self
                .history
                .compare_exchange(seen, seen | CLAIMED, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
    }

    /// Gives the claim back when the refresh could not start (no load permit).
    pub(crate) fn unclaim(&self) {
        self.history.fetch_and(!CLAIMED, Ordering::Relaxed);
    }
}

/// Whether XFetch says refresh: `now - delta * beta * ln(u) >= expiry`.
#[inline]
pub(crate) fn xfetch_due(now: u64, expiry: u64, delta: u64, beta: f64, u: f64) -> bool {
    now as f64 - delta as f64 * beta * u.ln() >= expiry as f64
}

/// New EWMA of the load time (weight 1/4 on the new sample).
pub(crate) fn next_delta(previous: u64, sample: u64) -> u64 {
    if previous == 0 {
        sample
    } else {
        previous - previous / 4 + sample / 4
    }
}

impl RefreshSettings {
    /// Whether any refresh rule is configured.
    pub(crate) fn active(&self) -> bool {
        self.soft_ttl.is_some() || self.beta.is_some()
    }

    /// State for an entry written at `now` that expires at `expires_at`, by the load `load`
    /// (its estimate, its own duration, the failures behind it, each backing off the next
    /// attempt).
    ///
    /// After a failure the value is the same old value, still due: the retry waits only for
    /// the backoff, not for a new soft TTL.
    pub(crate) fn state(&self, now: u64, expires_at: u64, load: LoadRecord) -> RefreshState {
        let LoadRecord {
            delta,
            took,
            failures,
        } = load;
        let soft_at = match self.soft_ttl {
            _ if failures > 0 => now,
            Some(s) => crate::clock::expiry_after(now, s),
            None => NEVER,
        };
        let xfetch_from = match self.beta {
            Some(beta) if expires_at != NEVER && delta > 0 => {
                let draw_window = (delta as f64 * beta * MAX_NEG_LN_U).ceil();
                let draw_window = draw_window.min(u64::MAX as f64) as u64;
                // The storm guard: without it, once `delta * beta * ln(R * delta * beta)`
                // exceeds the lifetime, every read after a refresh may refresh again. The
                // window opens no earlier than 4/5 of the lifetime after the load that wrote
                // the value started (`took` before now): the floor is the load's own
                // duration, not the estimate, which lags a spike (one slow load raised it
                // past the lifetime, and the next several refreshes then came back to back).
                // It also opens no earlier than `delta` plus a fifth of the lifetime before
                // the expiry, so that a refresh taking what loads take lands before it.
                let lifetime = expires_at.saturating_sub(now);
                let share = lifetime / EARLY_SHARE_DIVISOR;
                let bound = delta.min(took).saturating_add(share);
                expires_at.saturating_sub(draw_window.min(bound))
            }
            _ => NEVER,
        };
        let not_before = if failures == 0 {
            0
        } else {
            let backoff = BACKOFF_BASE_NANOS
                .saturating_mul(1u64 << (failures - 1).min(20))
                .min(BACKOFF_MAX_NANOS);
            now.saturating_add(backoff)
        };
        let history =
            u64::from(failures.min(MAX_FAILURES)) << FAILURES_SHIFT | delta.min(MAX_DELTA);
        RefreshState {
            check_at: soft_at.min(xfetch_from).max(not_before),
            soft_at,
            history: AtomicU64::new(history),
        }
    }

    /// Whether a hit at `now` on an entry expiring at `expires_at` should start a refresh.
    /// `draw` gives XFetch's `U` and is called only inside XFetch's window.
    #[inline]
    pub(crate) fn due(
        &self,
        state: &RefreshState,
        now: u64,
        expires_at: u64,
        draw: impl FnOnce() -> f64,
    ) -> bool {
        if now < state.check_at {
            return false;
        }
        if now >= state.soft_at {
            return true;
        }
        match self.beta {
            Some(beta) => xfetch_due(now, expires_at, state.delta(), beta, draw()),
            None => false,
        }
    }
}

#[cfg(all(test, not(herdcache_loom)))]
mod tests {
    use super::*;
    use rand_xoshiro::rand_core::{Rng, SeedableRng};
    use rand_xoshiro::Xoshiro256PlusPlus;

    const SEC: u64 = 1_000_000_000;

    /// A value written by a load that took `delta`, as the estimate says, after `failures`.
    fn loaded(delta: u64, failures: u32) -> LoadRecord {
        LoadRecord {
            delta,
            took: delta,
            failures,
        }
    }

    fn xfetch(beta: f64) -> RefreshSettings {
        RefreshSettings {
            beta: Some(beta),
            ..RefreshSettings::default()
        }
    }

    #[test]
    fn an_entry_s_plan_keeps_its_history_through_claims_in_three_words() {
        assert_eq!(std::mem::size_of::<RefreshState>(), 24);
        let st = xfetch(1.0).state(0, 100 * SEC, loaded(3 * SEC, 5));
        assert_eq!((st.delta(), st.failures()), (3 * SEC, 5));
        assert!(st.try_claim(), "the first claim wins");
        assert!(!st.try_claim(), "a claimed plan is not claimed twice");
        assert_eq!((st.delta(), st.failures()), (3 * SEC, 5), "claimed");
        st.unclaim();
        assert_eq!((st.delta(), st.failures()), (3 * SEC, 5), "given back");
        assert!(st.try_claim(), "a plan given back is claimed again");
        // Beyond their bits, the load time and the failures saturate, and stay apart.
        let st = xfetch(1.0).state(0, NEVER, loaded(u64::MAX, u32::MAX));
        assert_eq!((st.delta(), st.failures()), (MAX_DELTA, MAX_FAILURES));
        assert!(st.try_claim());
    }

    #[test]
    fn xfetch_never_fires_beyond_its_window_whatever_the_draw() {
        let s = xfetch(2.0);
        let expiry = 1_000 * SEC;
        let delta = SEC;
        let st = s.state(0, expiry, loaded(delta, 0));
        let window = (MAX_NEG_LN_U * 2.0 * SEC as f64) as u64;
        // Even the most extreme draw cannot fire just outside the window.
        let smallest_u = crate::rng::to_unit(0);
        let outside = expiry - window - 1;
        assert!(!s.due(&st, outside, expiry, || smallest_u));
        assert!(!xfetch_due(outside, expiry, delta, 2.0, smallest_u));
        // And a draw is not even made there.
        assert!(!s.due(&st, outside, expiry, || unreachable!(
            "no draw outside the window"
        )));
    }

    #[test]
    #[cfg_attr(miri, ignore = "statistics, no unsafe code: too slow under Miri")]
    fn xfetch_probability_rises_toward_expiry_as_theory_says() {
        // P(refresh at distance d before expiry) = P(-ln U >= d / (delta beta))
        //                                        = exp(-d / (delta beta)).
        let (beta, delta, expiry) = (1.0, SEC, 100 * SEC);
        let s = xfetch(beta);
        let st = s.state(0, expiry, loaded(delta, 0));
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(42);
        let n = 20_000;
        let mut last = 0.0;
        for d_tenths in [40u64, 20, 10, 5, 1] {
            let d = d_tenths * SEC / 10;
            let hits = (0..n)
                .filter(|_| {
                    let u = crate::rng::to_unit(rng.next_u64());
                    s.due(&st, expiry - d, expiry, || u)
                })
                .count();
            let observed = hits as f64 / n as f64;
            let expected = (-(d as f64) / (delta as f64 * beta)).exp();
            // Binomial sd <= 0.0036 at n = 20,000: 0.02 is more than 5 sd.
            assert!(
                (observed - expected).abs() < 0.02,
                "d={d}: {observed} vs {expected}"
            );
            assert!(observed > last, "probability must rise toward expiry");
            last = observed;
        }
    }

    /// Replays one key read `rate` times a second for `ttls` lifetimes of `ttl`, each load
    /// taking `load`, with XFetch at `beta`: the loads per TTL, and the mean time before
    /// expiry at which refreshes started.
    fn simulate(rate: u64, load: u64, ttl: u64, beta: f64, ttls: u64) -> (f64, f64) {
        let s = xfetch(beta);
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(7);
        let step = SEC / rate;
        let (mut expiry, mut st) = (ttl, s.state(0, ttl, loaded(load, 0)));
        let (mut loads, mut lead_sum, mut now) = (0u64, 0u64, 0u64);
        let mut landing: Option<u64> = None;
        while now < ttls * ttl {
            if let Some(at) = landing.filter(|&at| now >= at) {
                landing = None;
                expiry = at + ttl;
                st = s.state(at, expiry, loaded(load, 0));
            }
            let u = crate::rng::to_unit(rng.next_u64());
            if landing.is_none() && now < expiry && s.due(&st, now, expiry, || u) {
                loads += 1;
                lead_sum += expiry - now;
                landing = Some(now + load);
            }
            now += step;
        }
        let per_ttl = loads as f64 / ttls as f64;
        (per_ttl, lead_sum as f64 / loads.max(1) as f64)
    }

    #[test]
    #[cfg_attr(miri, ignore = "a simulation of millions of reads, no unsafe code")]
    fn xfetch_refreshes_about_once_per_ttl_at_any_read_rate() {
        const MS: u64 = SEC / 1_000;
        // (load, ttl): the stampede demo's 20 ms in 250 ms, and 100 ms loads in a 1 s TTL.
        for (load, ttl) in [(20 * MS, 250 * MS), (100 * MS, SEC), (2 * MS, SEC)] {
            for beta in [0.5, 1.0, 2.0] {
                let mut leads = Vec::new();
                for rate in [100, 20_000, 200_000] {
                    let (per_ttl, lead) = simulate(rate, load, ttl, beta, 20);
                    assert!(
                        per_ttl <= 1.3,
                        "load {load} ttl {ttl} beta {beta} rate {rate}: {per_ttl} loads per TTL"
                    );
                    leads.push(lead);
                }
                assert!(
                    leads.windows(2).all(|w| w[0] <= w[1]),
                    "hotter keys must refresh earlier: {leads:?} (load {load}, beta {beta})"
                );
            }
        }
    }

    /// Replays one key read `rate` times a second, whose `i`-th load takes `load(i)`, with
    /// XFetch at `beta` and the load-time estimate kept as the cache keeps it: the instants
    /// at which loads started.
    fn load_starts(
        rate: u64,
        load: impl Fn(usize) -> u64,
        ttl: u64,
        beta: f64,
        until: u64,
    ) -> Vec<u64> {
        let s = xfetch(beta);
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(11);
        let step = SEC / rate;
        let mut starts = vec![0];
        let (mut delta, mut landing) = (0, Some(load(0)));
        let (mut expiry, mut st) = (0, s.state(0, 0, LoadRecord::default()));
        let mut now = 0;
        while now < until {
            if let Some(at) = landing.filter(|&at| now >= at) {
                let took = at - starts.last().expect("a load started");
                delta = next_delta(delta, took);
                landing = None;
                expiry = at + ttl;
                st = s.state(
                    at,
                    expiry,
                    LoadRecord {
                        delta,
                        took,
                        failures: 0,
                    },
                );
            }
            let u = crate::rng::to_unit(rng.next_u64());
            if landing.is_none() && (now >= expiry || s.due(&st, now, expiry, || u)) {
                landing = Some(now + load(starts.len()));
                starts.push(now);
            }
            now += step;
        }
        starts
    }

    #[test]
    #[cfg_attr(miri, ignore = "a simulation of millions of reads, no unsafe code")]
    fn one_slow_load_does_not_make_the_next_refreshes_storm() {
        const MS: u64 = SEC / 1_000;
        let ttl = 100 * MS;
        // Loads of 1 ms, but the fifth takes 2 s: the estimate then stays above the lifetime
        // for several loads, and XFetch's window used to open as soon as each value landed
        // (6 loads within one TTL at beta 1, 10 at beta 2).
        let load = |i: usize| if i == 4 { 2_000 * MS } else { MS };
        for beta in [1.0, 2.0] {
            let starts = load_starts(20_000, load, ttl, beta, 5 * SEC);
            assert!(
                starts.len() > 20,
                "beta {beta}: the key was loaded {} times",
                starts.len()
            );
            for w in starts.windows(2) {
                assert!(
                    w[1] - w[0] >= ttl * 4 / 5,
                    "beta {beta}: loads started {} ms apart, at {} ms: {:?}",
                    (w[1] - w[0]) / MS,
                    w[1] / MS,
                    starts.iter().map(|s| s / MS).collect::<Vec<_>>()
                );
            }
        }
    }

    #[test]
    fn soft_ttl_fires_from_the_soft_expiry_on() {
        let s = RefreshSettings {
            soft_ttl: Some(10 * SEC),
            ..RefreshSettings::default()
        };
        let st = s.state(5 * SEC, 60 * SEC, loaded(0, 0));
        assert!(!s.due(&st, 15 * SEC - 1, 60 * SEC, || 1.0));
        assert!(s.due(&st, 15 * SEC, 60 * SEC, || 1.0));
    }

    #[test]
    fn failures_back_off_exponentially_up_to_a_cap() {
        let s = RefreshSettings {
            soft_ttl: Some(1),
            ..RefreshSettings::default()
        };
        let at = |failures| s.state(0, NEVER, loaded(0, failures)).check_at;
        assert_eq!(at(0), 1);
        // After a failure, due again as soon as the backoff ends.
        let st = s.state(0, NEVER, loaded(0, 1));
        assert!(!s.due(&st, BACKOFF_BASE_NANOS - 1, NEVER, || 1.0));
        assert!(s.due(&st, BACKOFF_BASE_NANOS, NEVER, || 1.0));
        assert_eq!(at(1), BACKOFF_BASE_NANOS);
        assert_eq!(at(3), 4 * BACKOFF_BASE_NANOS);
        assert_eq!(at(40), BACKOFF_MAX_NANOS);
    }

    #[test]
    fn only_one_caller_claims_a_refresh() {
        let st = xfetch(1.0).state(0, NEVER, loaded(0, 0));
        assert!(st.try_claim());
        assert!(!st.try_claim());
    }

    #[test]
    fn delta_is_a_moving_average() {
        assert_eq!(next_delta(0, 100), 100);
        assert_eq!(next_delta(100, 200), 125);
    }
}
