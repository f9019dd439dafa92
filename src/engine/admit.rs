//! What the policy hears of each write and removal, and the evictions it names: a removed
//! entry is forgotten, counted and told to the listener; a published write is admitted, and
//! the victims that make room for it leave the table.

use std::hash::{BuildHasher, Hash};

use super::{Engine, EntryNode};
use crate::clock::OnceNow;
use crate::entry::Entry;
use crate::local::Pinned;
use crate::policy::{Look, Victim, Write};
use crate::removal::RemovalCause;
use crate::stats::Counter;
use crate::table::{Decision, Outcome};

impl<K, V, S> Engine<K, V, S>
where
    K: Hash + Eq + Send + Sync + 'static,
    V: Send + Sync + 'static,
    S: BuildHasher,
{
    /// The weight of a value for `key` (1 without a weigher). Runs user code: call it before
    /// touching the table, so that a panic leaves nothing half done.
    #[inline]
    pub(crate) fn weight_of(&self, key: &K, value: &V) -> u64 {
        self.hooks.weight_of(key, value)
    }

    /// The time to live, in nanoseconds, of `value` written now for `key` (see
    /// `Hooks::ttl_of`). Runs user code, as `weight_of`.
    #[inline]
    pub(crate) fn ttl_of(&self, key: &K, value: &V) -> Option<u64> {
        self.hooks.ttl_of(key, value, self.settings.time_to_live)
    }

    /// Tells the listener that `node`'s value left the cache (see `Hooks::notify`): whether
    /// it ran.
    pub(crate) fn notify(&self, node: &EntryNode<K, V>, cause: RemovalCause) -> bool {
        self.hooks.notify(&self.domain, node, cause)
    }

    /// `cause`, or `Expired` if the entry had expired at `now`. An entry removed as expired
    /// needs no second look (nor a clock reading).
    pub(crate) fn cause_for(
        &self,
        entry: &Entry<V>,
        cause: RemovalCause,
        now: &OnceNow<'_>,
    ) -> RemovalCause {
        if cause == RemovalCause::Expired || entry.is_expired(|| now.get()) {
            RemovalCause::Expired
        } else {
            cause
        }
    }

    /// The bookkeeping of a value replaced by a write of its key at `now` (the policy tracks
    /// the key on): its cause, counted as an expiration if it had expired and
    /// `count_expired`, and told to the listener. Returns whether the listener ran.
    pub(super) fn replaced(
        &self,
        old: &EntryNode<K, V>,
        count_expired: bool,
        now: &OnceNow<'_>,
        pinned: &Pinned<'_>,
    ) -> bool {
        let cause = self.cause_for(&old.value, RemovalCause::Replaced, now);
        if count_expired && cause == RemovalCause::Expired {
            pinned.count(Counter::Expirations);
        }
        self.notify(old, cause)
    }

    /// Tells the policy that the table no longer holds `entry` (removed by the caller).
    pub(crate) fn forget_in_policy(&self, pkey: u64, version: u64) {
        self.policy.with(pkey, |p| p.remove(pkey, version));
    }

    /// An entry the caller removed from the table: the policy forgets it, it is counted, and
    /// the listener hears of its value.
    pub(super) fn removed(&self, node: &EntryNode<K, V>, cause: RemovalCause, pinned: &Pinned<'_>) {
        let entry = &node.value;
        // A load in progress too: the policy may still track the write it replaced.
        self.forget_in_policy(entry.pkey, entry.version);
        let now = self.once_now();
        let cause = self.cause_for(entry, cause, &now);
        match cause {
            RemovalCause::Expired => pinned.count(Counter::Expirations),
            RemovalCause::Invalidated if entry.live_value(|| now.get()).is_some() => {
                pinned.count(Counter::Invalidations)
            }
            _ => {}
        }
        self.notify(node, cause);
    }

    /// Tells the policy that the table now holds `node` (just published by the caller at
    /// `now`, with `weight`), and evicts what the policy chooses to stay within capacity.
    pub(crate) fn admit(
        &self,
        node: &EntryNode<K, V>,
        weight: u64,
        now: &OnceNow<'_>,
        pinned: &Pinned<'_>,
    ) {
        let guard = &pinned.guard;
        let table = &self.table;
        // Collected for the listener, which must run outside the lock; without one, nothing
        // is collected (and nothing allocated).
        let listening = self.hooks.listener.is_some();
        let mut evicted: Vec<(&EntryNode<K, V>, RemovalCause)> = Vec::new();
        self.policy
            .with_scratch(node.value.pkey, |policy, victims| {
                // Only a write the table still holds is tracked; a later write (or a removal)
                // reports itself under this lock after us. The node cannot have been freed and
                // its address reused: our guard has been held since it was published.
                let current = table.get_node(node.hash, |n| std::ptr::eq(n, node), guard);
                if !current.is_some_and(|c| std::ptr::eq(c, node)) {
                    return;
                }
                let entry = &node.value;
                // Nodes are matched by the policy key they store, never by hashing or comparing
                // keys: no user code runs under the policy's lock.
                let mut probe =
                    |v: &Victim| match table.get_node(v.hash, |n| n.value.pkey == v.pkey, guard) {
                        Some(n) => Look {
                            hits: n.value.policy.take_hits(),
                            expired: n.value.is_expired(|| now.get()),
                        },
                        None => Look::default(),
                    };
                let write = Write {
                    pkey: entry.pkey,
                    hash: node.hash,
                    version: entry.version,
                    weight,
                };
                let counters = self.domain.counters();
                policy.write(write, victims, &mut probe, &|| counters.requests());
                for v in victims.iter() {
                    // The victim's write, or an older one it replaced, never a load in progress
                    // or a newer write (that one reports itself, and the policy tracks it anew).
                    let outcome = table.update_node(
                        v.hash,
                        |n| n.value.pkey == v.pkey,
                        None,
                        |cur| match cur {
                            Some(n) if n.value.is_tracked() && n.value.version <= v.version => {
                                Decision::Remove
                            }
                            _ => Decision::Keep,
                        },
                        guard,
                    );
                    if let Outcome::Removed(old) = outcome {
                        let cause = if v.pkey == write.pkey && v.version == write.version {
                            pinned.count(Counter::Evictions);
                            RemovalCause::Oversized
                        } else if old.value.is_expired(|| now.get()) {
                            pinned.count(Counter::Expirations);
                            RemovalCause::Expired
                        } else {
                            pinned.count(Counter::Evictions);
                            RemovalCause::Size
                        };
                        if listening {
                            evicted.push((old, cause));
                        }
                    }
                }
            });
        // Outside the lock: the listener is user code. (After it, the sweep reads the clock
        // again.)
        if !evicted.is_empty() {
            now.renew();
        }
        for (old, cause) in evicted {
            self.notify(old, cause);
        }
        self.sweep_after_write(now, pinned);
    }
}
