//! Proactive expiry: expired values leave the cache, and reach the listener as
//! [`RemovalCause::Expired`], without a read of their key. Once the cache holds an entry
//! that can expire, writes sweep the table's slots in turn, after a shared cursor;
//! [`Cache::purge_expired`] looks at all of them at once, for a cache that is not written.

use std::hash::{BuildHasher, Hash};
use std::sync::atomic::Ordering;

use crate::cache::Cache;
use crate::entry::{Entry, Kind, NEVER};
use crate::local::Pinned;
use crate::removal::RemovalCause;
use crate::table::Node;

/// Slots a sweeping write looks at: two cache lines of slot pointers.
const SWEEP_SLOTS: usize = 16;
/// One write in this many sweeps, so that the sweep's fixed cost (a clock reading, finding
/// the newest array) is shared: the table is swept at `SWEEP_SLOTS / SWEEP_EVERY` = 2 slots
/// per write, once per `slots / 2` writes. A table has at most two slots per entry it has
/// held at its largest, so without a weigher that is once per `max_capacity` writes: expired
/// values leave on the time scale on which unread ones are evicted.
const SWEEP_EVERY: usize = 8;

impl<K, V, S> Cache<K, V, S>
where
    K: Hash + Eq + Send + Sync + 'static,
    V: Send + Sync + 'static,
    S: BuildHasher,
{
    /// Removes every expired value and cached error now, telling the listener of each
    /// ([`RemovalCause::Expired`]); returns how many were removed.
    ///
    /// Writes already sweep the cache a few slots at a time (without a weigher, every entry
    /// is looked at within `max_capacity` writes), keeping a value for
    /// [`max_stale`](crate::CacheBuilder::max_stale) past its expiry as a fallback for a
    /// load that does not finish. This call removes those too: use it when the cache is not
    /// being written and expired values should be freed, for example from a periodic task.
    ///
    /// ```
    /// use std::time::Duration;
    /// let clock = herdcache::ManualClock::new();
    /// let cache = herdcache::Cache::builder()
    ///     .max_capacity(100)
    ///     .time_to_live(Duration::from_secs(10))
    ///     .clock(clock.clone())
    ///     .build()?;
    /// cache.insert(1, "one");
    /// clock.advance(Duration::from_secs(11));
    /// assert_eq!(cache.purge_expired(), 1);
    /// assert_eq!(cache.entry_count(), 0);
    /// # Ok::<(), herdcache::BuildError>(())
    /// ```
    pub fn purge_expired(&self) -> u64 {
        let pinned = self.inner.domain.pin();
        let nodes = self.inner.table.iter(&pinned.guard);
        self.remove_expired_among(nodes, 0, &pinned)
    }

    /// A write's share of the sweep, if the cache has ever held a value that can expire: one
    /// write in `SWEEP_EVERY` looks at the next `SWEEP_SLOTS` slots. Values stay `max_stale`
    /// past their expiry, as fallbacks.
    pub(crate) fn sweep_after_write(&self, pinned: &Pinned<'_>) {
        if !self.inner.expiring.load(Ordering::Relaxed) {
            return;
        }
        let write = self.next_sweep();
        if write % SWEEP_EVERY != 0 {
            return;
        }
        let start = (write / SWEEP_EVERY).wrapping_mul(SWEEP_SLOTS);
        let nodes = self
            .inner
            .table
            .iter_slots(start, SWEEP_SLOTS, &pinned.guard);
        self.remove_expired_among(nodes, self.inner.max_stale, pinned);
    }

    /// Notes that an entry expiring at `expires_at` is being written: from the first one,
    /// writes sweep. Test before set: a shared write once, not per write.
    #[inline]
    pub(crate) fn note_expiry(&self, expires_at: u64) {
        if expires_at != NEVER && !self.inner.expiring.load(Ordering::Relaxed) {
            self.inner.expiring.store(true, Ordering::Relaxed);
        }
    }

    /// Removes the nodes among `nodes` that are a value expired more than `grace` ago or
    /// unused past its idle deadline, or an expired cached error; returns how many.
    fn remove_expired_among<'g>(
        &self,
        nodes: impl Iterator<Item = &'g Node<K, Entry<V>>>,
        grace: u64,
        pinned: &'g Pinned<'_>,
    ) -> u64 {
        let now = self.now();
        let mut removed = 0;
        for node in nodes {
            let gone = match &node.value.kind {
                // Unused past its idle deadline: gone at once (idleness is the reason to
                // free it; a fallback is for values a reader still wants).
                Kind::Ready(r) => {
                    (r.expires_at != NEVER && now >= r.expires_at.saturating_add(grace))
                        || node.value.policy.idle_expired(now)
                }
                Kind::Failed { .. } => node.value.is_expired(|| now),
                Kind::Loading(_) => false,
            };
            // By node: a newer write of the key since the look stays.
            if gone && self.inner.table.remove_node(node, &pinned.guard) {
                self.removed(node, RemovalCause::Expired, pinned);
                removed += 1;
            }
        }
        if removed > 0 {
            // Hands the removed values to the collector now, rather than when this thread
            // has retired enough others: they may be large, and their key may not be read
            // again.
            pinned.guard.flush();
        }
        removed
    }
}
