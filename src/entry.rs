//! What the table stores for each key: the value and its metadata.

use crate::policy::EntryState;

/// Expiry of an entry that never expires.
pub(crate) const NEVER: u64 = u64::MAX;

/// A cached value with its metadata. Immutable once published, except for the policy state,
/// which the eviction policy updates (test-before-set, see `policy/`).
#[derive(Debug)]
pub(crate) struct Entry<V> {
    pub(crate) value: V,
    /// Hard expiry in clock nanoseconds, or [`NEVER`].
    pub(crate) expires_at: u64,
    pub(crate) policy: EntryState,
}

impl<V> Entry<V> {
    pub(crate) fn new(value: V, expires_at: u64) -> Self {
        Entry {
            value,
            expires_at,
            policy: EntryState::default(),
        }
    }

    /// Whether the entry can expire at all (only then is the clock read).
    #[inline]
    pub(crate) fn expires(&self) -> bool {
        self.expires_at != NEVER
    }

    /// Whether the entry has expired at `now`.
    #[inline]
    pub(crate) fn is_expired_at(&self, now: u64) -> bool {
        now >= self.expires_at
    }
}
