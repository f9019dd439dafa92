//! What the table stores for each key: a value, an in-progress load, or a cached error.

use std::any::Any;
use std::fmt;
use std::mem::ManuallyDrop;
use std::sync::Arc;

use crate::flight::Flight;
use crate::idle::Idle;
use crate::policy::EntryState;
use crate::refresh::{LoadHistory, RefreshState};

pub(crate) use crate::clock::{expiry_after, NEVER};

/// One slot's content, immutable once published except for the policy's hit counter and
/// link and, with a `time_to_idle`, the idle deadline. Every write of a key publishes a new
/// `Entry` in a node of its own, so a node seen under a pin names one write for as long as
/// the pin lasts: no node is freed, and so no address reused, while a reader that saw it is
/// pinned.
///
/// Three words for a word-sized value: the policy's word (hit counter, the state's tag,
/// policy shard and link), then the state, a union tagged by that byte (an enum's tag would
/// take a word of its own). A value keeps its expiry or, if it only idles out, its idle
/// deadline beside it; what needs more (both, or a refresh plan) lives out of line, in one
/// allocation with the expiry, so that a cache that does not configure it pays nothing for
/// it; a cached error, which is rare, is boxed whole.
#[repr(C)]
pub(crate) struct Entry<V> {
    pub(crate) policy: EntryState,
    payload: Payload<V>,
}

/// `EntryState::tag` of a value with its expiry inline.
const INLINE: u8 = 0;
/// `EntryState::tag` of a value that expires only for want of use, its idle deadline inline.
const IDLING: u8 = 1;
/// `EntryState::tag` of a value with both an expiry and an idle deadline, and no refresh plan.
const TIMED: u8 = 2;
/// `EntryState::tag` of a value with a refresh plan (and perhaps an idle deadline).
const PLANNED: u8 = 3;
/// `EntryState::tag` of an entry holding [`Kind::Loading`].
const LOADING: u8 = 4;
/// `EntryState::tag` of an entry holding [`Kind::Failed`].
const FAILED: u8 = 5;

/// An entry's state, the field its tag names. Written once, at construction, and dropped once,
/// with the entry.
#[repr(C)]
union Payload<V> {
    ready: ManuallyDrop<Inline<V>>,
    idling: ManuallyDrop<Idling<V>>,
    timed: ManuallyDrop<Timed<V, ()>>,
    planned: ManuallyDrop<Timed<V, RefreshState>>,
    loading: ManuallyDrop<Arc<Flight<V>>>,
    failed: ManuallyDrop<Box<Failed>>,
}

/// A value and its expiry.
#[repr(C)]
struct Inline<V> {
    value: V,
    expires_at: u64,
}

/// A value without an expiry, and its idle deadline.
#[repr(C)]
struct Idling<V> {
    value: V,
    idle: Idle,
}

/// A value, and its timing out of line.
#[repr(C)]
struct Timed<V, P> {
    value: V,
    timing: Box<Timing<P>>,
}

/// A value's expiry, its idle deadline if it has one, and its refresh plan `P` (`()`
/// without one).
struct Timing<P> {
    expires_at: u64,
    idle: Option<Idle>,
    plan: P,
}

/// A cached load error and its expiry.
struct Failed {
    error: Arc<dyn Any + Send + Sync>,
    expires_at: u64,
}

/// The states of a key (DESIGN.md §4), as an entry holds them.
#[derive(Debug)]
pub(crate) enum Kind<'a, V> {
    /// A usable value.
    Ready(Ready<'a, V>),
    /// A load is in progress; the flight holds its waiters and, if the load replaced an
    /// expired value, that value.
    Loading(&'a Arc<Flight<V>>),
    /// A cached load error (negative caching), type-erased.
    Failed {
        error: &'a Arc<dyn Any + Send + Sync>,
        expires_at: u64,
    },
}

/// A ready value, its expiry, and when to refresh it, wherever the entry keeps them (each
/// ready layout's tag: `INLINE`, `IDLING`, `TIMED`, `PLANNED`).
#[derive(Debug)]
pub(crate) struct Ready<'a, V> {
    pub(crate) value: &'a V,
    /// Hard expiry in clock nanoseconds, or [`NEVER`].
    pub(crate) expires_at: u64,
    /// With a `time_to_idle`: the idle deadline.
    idle: Option<&'a Idle>,
    /// The refresh plan: present only when the cache has a refresh rule (`refresh_after`,
    /// `xfetch`).
    pub(crate) refresh: Option<&'a RefreshState>,
}

impl<V> Clone for Ready<'_, V> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<V> Copy for Ready<'_, V> {}

impl<V> Ready<'_, V> {
    /// The load-time estimate and the failed refreshes behind this value (none without a
    /// refresh rule, which is the only reader of either).
    pub(crate) fn history(&self) -> LoadHistory {
        self.refresh
            .map_or(LoadHistory::default(), |r| LoadHistory {
                delta: r.delta(),
                failures: r.failures(),
            })
    }

    /// Whether the value has gone unused past its idle deadline at `now`.
    #[inline]
    pub(crate) fn idle_expired(&self, now: u64) -> bool {
        self.idle.is_some_and(|i| i.expired(now))
    }

    /// Whether the value is live: an entry that can idle never has the expiry `NEVER` (see
    /// `Entry::ready`), so a value that never expires is judged by one comparison, with no
    /// look at the idle deadline. `now` is called only if the value can expire.
    #[inline]
    pub(crate) fn live(&self, now: impl FnOnce() -> u64) -> bool {
        if self.expires_at == NEVER {
            return true;
        }
        let now = now();
        now < self.expires_at && !self.idle_expired(now)
    }

    /// When the value stops being valid, as seen at `now`: its expiry, or its idle deadline
    /// if that comes first. What a load that replaces it may serve as a stale fallback is
    /// bounded by this, not by the expiry alone.
    pub(crate) fn valid_until(&self, now: u64) -> u64 {
        let idle = self.idle.map_or(u64::MAX, |i| i.nanos(now));
        self.expires_at.min(idle)
    }
}

impl<V> Entry<V> {
    /// A value for a key of policy shard `shard`, expiring at `expires_at`, with a refresh
    /// plan if the cache has a refresh rule and an idle deadline (`Idle`) if it has a
    /// `time_to_idle`.
    #[inline]
    pub(crate) fn ready(
        shard: u8,
        value: V,
        expires_at: u64,
        refresh: Option<RefreshState>,
        idle: Option<Idle>,
    ) -> Self {
        if refresh.is_none() && idle.is_none() {
            let ready = ManuallyDrop::new(Inline { value, expires_at });
            return Self::with(shard, INLINE, Payload { ready });
        }
        Self::timed(shard, value, expires_at, refresh, idle)
    }

    /// `ready`, for a value with an idle deadline or a refresh plan.
    fn timed(
        shard: u8,
        value: V,
        mut expires_at: u64,
        refresh: Option<RefreshState>,
        idle: Option<Idle>,
    ) -> Self {
        if idle.is_some() {
            // Without a TTL, the expiry becomes the last finite one (as a TTL past the
            // clock's range does), so that the liveness check reaches the idle deadline.
            expires_at = expires_at.min(NEVER - 1);
        }
        let (tag, payload) = match (refresh, idle) {
            (None, Some(idle)) if expires_at == NEVER - 1 => (
                IDLING,
                Payload {
                    idling: ManuallyDrop::new(Idling { value, idle }),
                },
            ),
            (None, idle) => {
                let timing = Box::new(Timing {
                    expires_at,
                    idle,
                    plan: (),
                });
                (
                    TIMED,
                    Payload {
                        timed: ManuallyDrop::new(Timed { value, timing }),
                    },
                )
            }
            (Some(plan), idle) => {
                let timing = Box::new(Timing {
                    expires_at,
                    idle,
                    plan,
                });
                (
                    PLANNED,
                    Payload {
                        planned: ManuallyDrop::new(Timed { value, timing }),
                    },
                )
            }
        };
        Self::with(shard, tag, payload)
    }

    pub(crate) fn loading(shard: u8, flight: Arc<Flight<V>>) -> Self {
        Self::with(
            shard,
            LOADING,
            Payload {
                loading: ManuallyDrop::new(flight),
            },
        )
    }

    pub(crate) fn failed(shard: u8, error: Arc<dyn Any + Send + Sync>, expires_at: u64) -> Self {
        let failed = Box::new(Failed { error, expires_at });
        Self::with(
            shard,
            FAILED,
            Payload {
                failed: ManuallyDrop::new(failed),
            },
        )
    }

    /// `shard`: the policy shard of the key (`Policy::shard_of`); `tag`: the field of
    /// `payload` that is written.
    #[inline]
    fn with(shard: u8, tag: u8, payload: Payload<V>) -> Self {
        Entry {
            policy: EntryState::new(shard, tag),
            payload,
        }
    }

    /// The state this entry holds. A value with its expiry inline, what most caches hold,
    /// is told apart with one test.
    #[inline]
    pub(crate) fn kind(&self) -> Kind<'_, V> {
        match self.inline() {
            Some(r) => Kind::Ready(r),
            None => self.other_kind(),
        }
    }

    /// The value of an `INLINE` entry, the layout most caches hold, or `None` for any other.
    #[inline]
    fn inline(&self) -> Option<Ready<'_, V>> {
        (self.policy.tag() == INLINE).then(|| {
            // SAFETY: the tag names the field written at construction (`with`); neither
            // changes until the entry is dropped.
            let r = unsafe { &self.payload.ready };
            Ready {
                value: &r.value,
                expires_at: r.expires_at,
                idle: None,
                refresh: None,
            }
        })
    }

    /// `kind`, for the other states.
    fn other_kind(&self) -> Kind<'_, V> {
        // SAFETY: as in `kind`.
        unsafe {
            match self.policy.tag() {
                IDLING => {
                    let r = &self.payload.idling;
                    Kind::Ready(Ready {
                        value: &r.value,
                        expires_at: NEVER - 1,
                        idle: Some(&r.idle),
                        refresh: None,
                    })
                }
                TIMED => {
                    let r = &self.payload.timed;
                    Kind::Ready(Ready {
                        value: &r.value,
                        expires_at: r.timing.expires_at,
                        idle: r.timing.idle.as_ref(),
                        refresh: None,
                    })
                }
                PLANNED => {
                    let r = &self.payload.planned;
                    Kind::Ready(Ready {
                        value: &r.value,
                        expires_at: r.timing.expires_at,
                        idle: r.timing.idle.as_ref(),
                        refresh: Some(&r.timing.plan),
                    })
                }
                LOADING => Kind::Loading(&self.payload.loading),
                tag => {
                    debug_assert_eq!(tag, FAILED, "an entry's tag names no state");
                    Kind::Failed {
                        error: &self.payload.failed.error,
                        expires_at: self.payload.failed.expires_at,
                    }
                }
            }
        }
    }

    /// Whether the policy tracks this entry (a value or a cached error, not a load).
    pub(crate) fn is_tracked(&self) -> bool {
        self.policy.tag() != LOADING
    }

    /// A use of the value at `now` moves its idle deadline `units` idle units ahead (see
    /// [`Idle::used`]); nothing for a value without one.
    #[inline]
    pub(crate) fn used(&self, now: u64, units: u32) {
        // SAFETY: as in `kind`.
        let idle = unsafe {
            match self.policy.tag() {
                IDLING => Some(&self.payload.idling.idle),
                TIMED => self.payload.timed.timing.idle.as_ref(),
                PLANNED => self.payload.planned.timing.idle.as_ref(),
                _ => None,
            }
        };
        if let Some(idle) = idle {
            idle.used(now, units);
        }
    }

    /// Whether the entry is a value or cached error past its expiry, or a value unused past
    /// its idle deadline. `now` is called only if the entry can expire.
    #[inline]
    pub(crate) fn is_expired(&self, now: impl FnOnce() -> u64) -> bool {
        match self.kind() {
            Kind::Ready(r) => !r.live(now),
            Kind::Failed { expires_at, .. } => expires_at != NEVER && now() >= expires_at,
            Kind::Loading(_) => false,
        }
    }

    /// The value a reader gets: a ready value that has not expired (by its TTL or, with a
    /// `time_to_idle`, for want of use), or the value a refresh in progress still serves
    /// until its hard expiry.
    #[inline]
    pub(crate) fn live_value(&self, now: impl FnOnce() -> u64) -> Option<&V> {
        self.live_value_in(true, now)
    }

    /// [`live_value`](Self::live_value) in a cache where an entry may have an expiry only if
    /// `expiring`: without, a ready value in the common layout is live, and its expiry is not
    /// read (the node's last word: with 8-byte keys and values, on a second cache line for a
    /// quarter of the nodes).
    #[inline]
    pub(crate) fn live_value_in(&self, expiring: bool, now: impl FnOnce() -> u64) -> Option<&V> {
        if let Some(r) = self.inline() {
            return (!expiring || r.live(now)).then_some(r.value);
        }
        self.other_live_value(now)
    }

    /// [`live_value`](Self::live_value) for the layouts other than `INLINE`. Out of line, so
    /// that the hit on an `INLINE` entry tests its tag with one compare instead of sharing a
    /// jump table with the other layouts.
    #[inline(never)]
    fn other_live_value(&self, now: impl FnOnce() -> u64) -> Option<&V> {
        match self.other_kind() {
            Kind::Ready(r) => r.live(now).then_some(r.value),
            Kind::Loading(flight) => flight.serving(now),
            Kind::Failed { .. } => None,
        }
    }
}

impl<V> Drop for Entry<V> {
    #[inline]
    fn drop(&mut self) {
        // SAFETY: the tag names the field written at construction (see `kind`), dropped here
        // once, with the entry.
        unsafe {
            match self.policy.tag() {
                INLINE => ManuallyDrop::drop(&mut self.payload.ready),
                _ => self.drop_other(),
            }
        }
    }
}

impl<V> Entry<V> {
    /// `drop`, for the other states.
    ///
    /// # Safety
    /// Called once, from `drop`.
    unsafe fn drop_other(&mut self) {
        // SAFETY: as in `drop` (the caller's contract).
        unsafe {
            match self.policy.tag() {
                IDLING => ManuallyDrop::drop(&mut self.payload.idling),
                TIMED => ManuallyDrop::drop(&mut self.payload.timed),
                PLANNED => ManuallyDrop::drop(&mut self.payload.planned),
                LOADING => ManuallyDrop::drop(&mut self.payload.loading),
                tag => {
                    debug_assert_eq!(tag, FAILED, "an entry's tag names no state");
                    ManuallyDrop::drop(&mut self.payload.failed)
                }
            }
        }
    }
}

impl<V: fmt::Debug> fmt::Debug for Entry<V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Entry")
            .field("policy", &self.policy)
            .field("kind", &self.kind())
            .finish()
    }
}

#[cfg(all(test, target_pointer_width = "64"))]
mod tests {
    use super::*;

    /// What a u64 value's entry costs (the table node adds the key and hash): the policy's
    /// word (hit counter, tag, shard and link), then the value and its expiry. With the key
    /// and hash, a 40-byte node: a 48-byte allocator block.
    #[test]
    fn an_entry_of_a_u64_is_three_words_with_what_a_hit_reads_first() {
        assert_eq!(std::mem::size_of::<Entry<u64>>(), 24);
        assert_eq!(std::mem::offset_of!(Entry<u64>, payload), 8);
    }

    /// Each configuration keeps what it needs and reads it back: the expiry inline, or out
    /// of line with an idle deadline and a refresh plan.
    #[test]
    fn each_layout_keeps_its_expiry_idle_deadline_and_plan() {
        let unit = 1u64 << crate::clock::IDLE_SHIFT;
        let plan = || {
            crate::refresh::RefreshSettings::default().state(
                0,
                50 * unit,
                crate::refresh::LoadRecord {
                    delta: 7,
                    took: 7,
                    failures: 2,
                },
            )
        };
        let idle = || Some(Idle::new(0, 3));
        for (ttl, refresh, idle, idles, planned) in [
            (true, None, None, false, false),
            (false, None, idle(), true, false),
            (true, None, idle(), true, false),
            (true, Some(plan()), None, false, true),
            (true, Some(plan()), idle(), true, true),
        ] {
            let expires_at = if ttl { 50 * unit } else { NEVER };
            let entry = Entry::ready(5, 42u64, expires_at, refresh, idle);
            let Kind::Ready(r) = entry.kind() else {
                panic!("a ready entry reads back as {:?}", entry.kind());
            };
            let expires_at = expires_at.min(NEVER - 1);
            assert_eq!((*r.value, r.expires_at), (42, expires_at));
            assert_eq!(entry.policy.shard(), 5);
            assert_eq!(r.refresh.is_some(), planned);
            let expected = if planned {
                LoadHistory {
                    delta: 7,
                    failures: 2,
                }
            } else {
                LoadHistory::default()
            };
            assert_eq!(r.history(), expected);
            assert_eq!(r.valid_until(0), if idles { 4 * unit } else { expires_at });
            assert_eq!(entry.is_expired(|| 10 * unit), idles, "idle expiry");
            entry.used(9 * unit, 3);
            assert!(
                !entry.is_expired(|| 10 * unit),
                "a use did not move the deadline"
            );
            let later = 60 * unit;
            entry.used(later - unit, 3);
            let lives = entry.live_value(|| later).is_some();
            assert_eq!(
                lives, !ttl,
                "a value without a TTL expired, or one with it lived on"
            );
        }
    }

    /// An idle deadline needs a finite expiry for the liveness check to reach it, whatever
    /// layout keeps it.
    #[test]
    fn a_value_that_can_idle_out_never_has_the_expiry_never() {
        let unit = 1u64 << crate::clock::IDLE_SHIFT;
        let plan = crate::refresh::RefreshSettings::default().state(0, NEVER, Default::default());
        for refresh in [None, Some(plan)] {
            let entry = Entry::ready(0, 1u64, NEVER, refresh, Some(Idle::new(0, 1)));
            let Kind::Ready(r) = entry.kind() else {
                panic!("a ready entry reads back as {:?}", entry.kind());
            };
            assert_eq!(r.expires_at, NEVER - 1);
            assert!(!entry.is_expired(|| unit), "idled out early");
            assert!(entry.is_expired(|| 3 * unit), "never idled out");
        }
    }

    #[test]
    fn a_cached_error_keeps_its_expiry() {
        let failed = Entry::<u64>::failed(0, Arc::new("boom"), 9);
        assert!(matches!(failed.kind(), Kind::Failed { expires_at: 9, .. }));
        assert!(failed.is_expired(|| 9) && !failed.is_expired(|| 8));
        assert_eq!(failed.live_value(|| 0), None);
    }
}
