//! What the table stores for each key: a value, an in-progress load, or a cached error.

use std::any::Any;
use std::fmt;
use std::mem::ManuallyDrop;
use std::sync::Arc;

use crate::flight::Flight;
use crate::policy::{EntryState, Link};
use crate::refresh::RefreshState;

pub(crate) use crate::clock::{expiry_after, NEVER};

/// One slot's content, immutable once published except for the policy's hit counter and
/// link. Every write of a key publishes a new `Entry` in a node of its own, so a node seen
/// under a pin names one write for as long as the pin lasts: no node is freed, and so no
/// address reused, while a reader that saw it is pinned.
///
/// Laid out in declaration order (`repr(C)` here and on `Ready`) with what a hit reads
/// first: the policy's hit counter and the state's tag (in one word with the policy shard and
/// the idle deadline), the value and its expiry, then the refresh plan (read only by
/// `get_or_load`) and the policy's link (read only by the policy). The state is a union
/// tagged by that byte, not an enum: an enum's tag would take a word of its own.
#[repr(C)]
pub(crate) struct Entry<V> {
    pub(crate) policy: EntryState,
    payload: Payload<V>,
    pub(crate) link: Link,
}

/// `EntryState::tag` of an entry holding [`Kind::Ready`].
const READY: u8 = 0;
/// `EntryState::tag` of an entry holding [`Kind::Loading`].
const LOADING: u8 = 1;
/// `EntryState::tag` of an entry holding [`Kind::Failed`].
const FAILED: u8 = 2;

/// An entry's state, the field its tag names. Written once, at construction, and dropped once,
/// with the entry.
#[repr(C)]
union Payload<V> {
    ready: ManuallyDrop<Ready<V>>,
    loading: ManuallyDrop<Arc<Flight<V>>>,
    failed: ManuallyDrop<Failed>,
}

/// A cached load error and its expiry.
#[repr(C)]
struct Failed {
    error: Arc<dyn Any + Send + Sync>,
    expires_at: u64,
}

/// The states of a key (DESIGN.md §4), as an entry holds them.
#[derive(Debug)]
pub(crate) enum Kind<'a, V> {
    /// A usable value.
    Ready(&'a Ready<V>),
    /// A load is in progress; the flight holds its waiters and, if the load replaced an
    /// expired value, that value.
    Loading(&'a Arc<Flight<V>>),
    /// A cached load error (negative caching), type-erased.
    Failed {
        error: &'a Arc<dyn Any + Send + Sync>,
        expires_at: u64,
    },
}

/// A value, its expiry, and when to refresh it.
#[derive(Debug)]
#[repr(C)]
pub(crate) struct Ready<V> {
    pub(crate) value: V,
    /// Hard expiry in clock nanoseconds, or [`NEVER`].
    pub(crate) expires_at: u64,
    /// The refresh plan, out of line: present only when the cache has a refresh rule
    /// (`refresh_after`, `xfetch`), so that a cache without one stores a pointer's width
    /// for it and allocates nothing.
    pub(crate) refresh: Option<Box<RefreshState>>,
}

impl<V> Ready<V> {
    /// The load-time estimate and the failed refreshes behind this value (none without a
    /// refresh rule, which is the only reader of either).
    pub(crate) fn history(&self) -> (u64, u32) {
        self.refresh
            .as_ref()
            .map_or((0, 0), |r| (r.delta(), r.failures()))
    }
}

impl<V> Entry<V> {
    pub(crate) fn ready(
        shard: u8,
        value: V,
        expires_at: u64,
        refresh: Option<Box<RefreshState>>,
    ) -> Self {
        let ready = Ready {
            value,
            expires_at,
            refresh,
        };
        Self::with(
            shard,
            READY,
            Payload {
                ready: ManuallyDrop::new(ready),
            },
        )
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
        let failed = Failed { error, expires_at };
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
    fn with(shard: u8, tag: u8, payload: Payload<V>) -> Self {
        Entry {
            policy: EntryState::new(shard, tag),
            payload,
            link: Link::new(),
        }
    }

    /// The state this entry holds.
    #[inline]
    pub(crate) fn kind(&self) -> Kind<'_, V> {
        // SAFETY: the tag names the field written at construction (`with`); neither changes
        // until the entry is dropped.
        unsafe {
            match self.policy.tag() {
                READY => Kind::Ready(&self.payload.ready),
                LOADING => Kind::Loading(&self.payload.loading),
                _ => Kind::Failed {
                    error: &self.payload.failed.error,
                    expires_at: self.payload.failed.expires_at,
                },
            }
        }
    }

    /// The ready value, mutable before the entry is published.
    fn ready_mut(&mut self) -> Option<&mut Ready<V>> {
        // SAFETY: as in `kind`.
        (self.policy.tag() == READY).then(|| unsafe { &mut *self.payload.ready })
    }

    /// Whether the policy tracks this entry (a value or a cached error, not a load).
    pub(crate) fn is_tracked(&self) -> bool {
        self.policy.tag() != LOADING
    }

    /// Whether the entry is a value or cached error past its expiry, or a value unused past
    /// its idle deadline. `now` is called only if the entry can expire.
    #[inline]
    pub(crate) fn is_expired(&self, now: impl FnOnce() -> u64) -> bool {
        match self.kind() {
            Kind::Ready(r) => !self.ready_live(r, now),
            Kind::Failed { expires_at, .. } => expires_at != NEVER && now() >= expires_at,
            Kind::Loading(_) => false,
        }
    }

    /// The value a reader gets: a ready value that has not expired (by its TTL or, with a
    /// `time_to_idle`, for want of use), or the value a refresh in progress still serves
    /// until its hard expiry.
    #[inline]
    pub(crate) fn live_value(&self, now: impl FnOnce() -> u64) -> Option<&V> {
        match self.kind() {
            Kind::Ready(r) => self.ready_live(r, now).then_some(&r.value),
            Kind::Loading(flight) => flight.serving(now),
            Kind::Failed { .. } => None,
        }
    }

    /// An entry that can idle never has the expiry `NEVER` (see `with_idle`), so a value
    /// that never expires is judged by one comparison, with no look at the idle deadline.
    #[inline]
    fn ready_live(&self, r: &Ready<V>, now: impl FnOnce() -> u64) -> bool {
        if r.expires_at == NEVER {
            return true;
        }
        let now = now();
        now < r.expires_at && !self.policy.idle_expired(now)
    }

    /// When the ready value `r` of this entry stops being valid, as seen at `now`: its
    /// expiry, or its idle deadline if that comes first. What a load that replaces it may
    /// serve as a stale fallback is bounded by this, not by the expiry alone.
    pub(crate) fn valid_until(&self, r: &Ready<V>, now: u64) -> u64 {
        r.expires_at.min(self.policy.idle_deadline_nanos(now))
    }

    /// A ready entry that also expires after `units` idle units unused (`time_to_idle`),
    /// written at `now`. Without a TTL its expiry becomes the last finite one (as a TTL past
    /// the clock's range does), so that the liveness check reaches the idle deadline.
    pub(crate) fn with_idle(mut self, now: u64, units: u32) -> Self {
        self.policy.idle_after(now, units);
        if let Some(r) = self.ready_mut() {
            r.expires_at = r.expires_at.min(NEVER - 1);
        }
        self
    }
}

impl<V> Drop for Entry<V> {
    fn drop(&mut self) {
        // SAFETY: the tag names the field written at construction (see `kind`), dropped here
        // once, with the entry.
        unsafe {
            match self.policy.tag() {
                READY => ManuallyDrop::drop(&mut self.payload.ready),
                LOADING => ManuallyDrop::drop(&mut self.payload.loading),
                _ => ManuallyDrop::drop(&mut self.payload.failed),
            }
        }
    }
}

impl<V: fmt::Debug> fmt::Debug for Entry<V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Entry")
            .field("policy", &self.policy)
            .field("kind", &self.kind())
            .field("link", &self.link)
            .finish()
    }
}

#[cfg(all(test, target_pointer_width = "64"))]
mod tests {
    use super::Entry;

    /// What a u64 value's entry costs (the table node adds the key and hash): the hit
    /// counter, the policy shard and the idle deadline take a word, the state with its value,
    /// expiry and refresh pointer three (a union: its tag is a byte of the first word), then
    /// the policy's link. What a hit reads (the first word and the state's first two) comes
    /// first: with the key and hash, 40 bytes of the 56-byte node.
    #[test]
    fn an_entry_of_a_u64_is_five_words_with_what_a_hit_reads_first() {
        assert_eq!(std::mem::size_of::<Entry<u64>>(), 40);
        assert_eq!(std::mem::offset_of!(Entry<u64>, payload), 8);
        assert_eq!(std::mem::offset_of!(Entry<u64>, link), 32);
    }
}
