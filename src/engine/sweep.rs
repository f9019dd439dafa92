//! Proactive expiry: expired values leave the cache, and reach the listener as
//! `RemovalCause::Expired`, without a read of their key. Once the cache holds an entry
//! that can expire, writes sweep the table's slots in turn, after a shared cursor;
//! `Cache::purge_expired` looks at all of them at once, for a cache that is not written.

use std::hash::{BuildHasher, Hash};
use std::sync::atomic::Ordering;

use super::{Engine, EntryNode};
use crate::clock::OnceNow;
use crate::entry::{Kind, NEVER};
use crate::local::Pinned;
use crate::removal::RemovalCause;

/// Slots a sweeping write looks at: two cache lines of slot pointers.
const SWEEP_SLOTS: usize = 16;
/// One write in this many sweeps, so that the sweep's fixed cost (a clock reading, finding
/// the newest array) is shared: the table is swept at `SWEEP_SLOTS / SWEEP_EVERY` = 2 slots
/// per write, once per `slots / 2` writes. A table has at most two slots per entry it has
/// held at its largest, so without a weigher that is once per `max_capacity` writes: expired
/// values leave on the time scale on which unread ones are evicted.
const SWEEP_EVERY: usize = 8;

impl<K, V, S> Engine<K, V, S>
where
    K: Hash + Eq + Send + Sync + 'static,
    V: Send + Sync + 'static,
    S: BuildHasher,
{
    /// Removes every expired value and cached error now (see `Cache::purge_expired`):
    /// how many.
    pub(crate) fn purge_expired(&self) -> u64 {
        let pinned = self.pin();
        let nodes = self.table.iter(pinned.guard());
        self.remove_expired_among(nodes, 0, self.now(), &pinned)
    }

    /// The number of this write among the writes that sweep.
    fn next_sweep(&self) -> usize {
        // Relaxed: the count only spreads the writes' shares of the sweep over the table.
        self.sweep.fetch_add(1, Ordering::Relaxed)
    }

    /// A write's share of the sweep, if the cache has ever held a value that can expire: one
    /// write in `SWEEP_EVERY` looks at the next `SWEEP_SLOTS` slots. Values stay `max_stale`
    /// past their expiry, as fallbacks.
    pub(super) fn sweep_after_write(&self, now: &OnceNow<'_>, pinned: &Pinned<'_>) {
        if !self.expiring.load(Ordering::Relaxed) {
            return;
        }
        let write = self.next_sweep();
        if write % SWEEP_EVERY != 0 {
            return;
        }
        let start = (write / SWEEP_EVERY).wrapping_mul(SWEEP_SLOTS);
        let nodes = self.table.iter_slots(start, SWEEP_SLOTS, pinned.guard());
        self.remove_expired_among(nodes, self.settings.max_stale, now.get(), pinned);
    }

    /// Notes that an entry expiring at `expires_at` is being written: from the first one,
    /// writes sweep. Test before set: a shared write once, not per write.
    #[inline]
    pub(super) fn note_expiry(&self, expires_at: u64) {
        if expires_at != NEVER && !self.expiring.load(Ordering::Relaxed) {
            self.expiring.store(true, Ordering::Relaxed);
        }
    }

    /// Removes the nodes among `nodes` that are a value expired more than `grace` ago or
    /// unused past its idle deadline, or an expired cached error; returns how many.
    fn remove_expired_among<'g>(
        &self,
        nodes: impl Iterator<Item = &'g EntryNode<K, V>>,
        grace: u64,
        now: u64,
        pinned: &'g Pinned<'_>,
    ) -> u64 {
        let mut removed = 0;
        for node in nodes {
            let gone = match node.value.kind() {
                // Unused past its idle deadline: gone at once (idleness is the reason to
                // free it; a fallback is for values a reader still wants).
                Kind::Ready(r) => {
                    (r.expires_at != NEVER && now >= r.expires_at.saturating_add(grace))
                        || r.idle_expired(now)
                }
                Kind::Failed { .. } => node.value.is_expired(|| now),
                Kind::Loading(_) => false,
            };
            // By node: a newer write of the key since the look stays.
            if gone && self.remove_node(node, RemovalCause::Expired, pinned) {
                removed += 1;
            }
        }
        if removed > 0 {
            // Hands the removed values to the collector now, rather than when this thread
            // has retired enough others: they may be large, and their key may not be read
            // again.
            crate::sync::user_code_may_run("a flush of retired entries");
            pinned.guard().flush();
        }
        removed
    }
}
