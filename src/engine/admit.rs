//! What the policy hears of each write and removal, and the evictions it names: a removed
//! entry is forgotten, counted and told to the listener; a published write is admitted, and
//! the victims that make room for it leave the table.

use std::hash::{BuildHasher, Hash};
use std::ptr::NonNull;
use std::sync::atomic::Ordering;

use super::{Engine, EntryNode};
use crate::clock::OnceNow;
use crate::entry::Entry;
use crate::local::Pinned;
use crate::policy::{EntryState, Look, Policy, Tracked, Victim, Write};
use crate::removal::RemovalCause;
use crate::stats::Counter;

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

    /// Tells the policy that the table no longer holds `node`, which the caller took out
    /// (see `tinylfu.rs`, "Succession": before any user code runs after the table write).
    pub(crate) fn forget_in_policy(&self, node: &EntryNode<K, V>) {
        forget(&self.policy, node);
    }

    /// Tells the policy that `load`, a load in progress, took `old`'s place in the table:
    /// the key stays tracked through it.
    pub(super) fn carry_in_policy(&self, old: &EntryNode<K, V>, load: &EntryNode<K, V>, pkey: u64) {
        let Some(old) = successor(&self.policy, old, load) else {
            // Nothing to carry: the load is untracked, as one that replaced nothing.
            self.forget_in_policy(load);
            return;
        };
        self.policy.with(load.value.policy.shard(), |p| {
            // SAFETY: as `forget_in_policy`; `load` was published by the caller, under its
            // pin.
            unsafe { p.carry(tracked(old), tracked(load), pkey) }
        });
    }

    /// An entry the caller removed from the table: the policy forgets it, it is counted, and
    /// the listener hears of its value.
    pub(super) fn removed(&self, node: &EntryNode<K, V>, cause: RemovalCause, pinned: &Pinned<'_>) {
        // A load in progress too: it may carry its key's record.
        self.forget_in_policy(node);
        self.after_removal(node, cause, pinned);
    }

    /// The bookkeeping of a removal the policy has heard of: counted, and told to the
    /// listener.
    pub(super) fn after_removal(
        &self,
        node: &EntryNode<K, V>,
        cause: RemovalCause,
        pinned: &Pinned<'_>,
    ) {
        let entry = &node.value;
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

    /// Tells the policy of `write` (published by the caller at `now`), and evicts what the
    /// policy chooses to stay within capacity; then the listener hears of the evicted, and
    /// the write takes its share of the sweep.
    pub(crate) fn admit(
        &self,
        write: Unreported<'_, K, V>,
        now: &OnceNow<'_>,
        pinned: &Pinned<'_>,
    ) {
        // The clock is user code, which must not run under the lock: read it before, if
        // anything can expire. An entry given the first expiry after this check counts as
        // unexpired here (time 0), and is evicted by size rather than as expired.
        let read = if self.expiring.load(Ordering::Relaxed) {
            now.get()
        } else {
            0
        };
        let at = || read;
        // Reported from here on: nothing below can unwind before the policy has heard of the
        // write, and the guard must not relock the shard if the policy itself panics.
        let (node, report) = write.disarmed();
        // Collected for the listener, which must run outside the lock; without one, nothing
        // is collected (and nothing allocated).
        let mut evicted: Vec<(&EntryNode<K, V>, RemovalCause)> = Vec::new();
        self.policy
            .with_scratch(node.value.policy.shard(), |policy, victims| {
                let counters = self.domain.counters();
                let mut probe = |v: &Victim| Self::look(v, &at);
                // SAFETY: `node` was published and `old` taken out of the table by this
                // thread, pinned since before either, which reports them here, once.
                unsafe { policy.write(report, victims, &mut probe, &|| counters.requests()) };
                self.take_out(victims, Some(node), &at, pinned, &mut evicted);
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
        crate::table::flush_outgrown(pinned.guard());
    }

    /// The policy's look at a tracked entry, through its node: no user code runs under its
    /// lock. `at`: the time it judges expiry by, read before the lock.
    fn look(v: &Victim, at: &impl Fn() -> u64) -> Look {
        // SAFETY: a victim's node is live under the shard's lock ("Succession").
        let n = unsafe { node_of::<K, V>(v.node) };
        Look {
            hits: n.value.policy.take_hits(),
            expired: n.value.is_expired(at),
        }
    }

    /// Takes the policy's `victims` out of the table, under the shard's lock, counting each
    /// by its cause (`Oversized` for `newest`, the write that made room for itself, if it
    /// is one), and collects them in `evicted` for the listener, if there is one.
    fn take_out<'g>(
        &self,
        victims: &[Victim],
        newest: Option<&EntryNode<K, V>>,
        at: &impl Fn() -> u64,
        pinned: &'g Pinned<'_>,
        evicted: &mut Vec<(&'g EntryNode<K, V>, RemovalCause)>,
    ) {
        let listening = self.hooks.listener.is_some();
        for v in victims {
            // SAFETY: as in `look`; the victim is detached, and leaves the table here (under
            // the caller's pin) or has left it already.
            let victim: &'g EntryNode<K, V> = unsafe { node_of::<K, V>(v.node) };
            // Never a load in progress: it may only carry the key's record, and is left to
            // finish (its value is then a new key).
            if !victim.value.is_tracked() || !self.table.remove_node(victim, pinned.guard()) {
                continue;
            }
            let cause = if newest.is_some_and(|n| std::ptr::eq(victim, n)) {
                pinned.count(Counter::Evictions);
                RemovalCause::Oversized
            } else if victim.value.is_expired(at) {
                pinned.count(Counter::Expirations);
                RemovalCause::Expired
            } else {
                pinned.count(Counter::Evictions);
                RemovalCause::Size
            };
            if listening {
                evicted.push((victim, cause));
            }
        }
    }

    /// Changes the capacity to `max` (see `Cache::set_capacity`): the policy shrinks or grows
    /// shard by shard, and what no longer fits leaves the table, told to the listener.
    pub(crate) fn set_capacity(&self, max: u64) {
        let pinned = self.pin();
        let now = self.once_now();
        let read = if self.expiring.load(Ordering::Relaxed) {
            now.get()
        } else {
            0
        };
        let at = || read;
        self.capacity.store(max, Ordering::Relaxed);
        self.table
            .set_bound(usize::try_from(max).unwrap_or(usize::MAX));
        let mut evicted: Vec<(&EntryNode<K, V>, RemovalCause)> = Vec::new();
        self.policy.resize(max, |policy, share, victims| {
            let mut probe = |v: &Victim| Self::look(v, &at);
            // SAFETY: the shard's lock is held, under which its tracked nodes are live.
            unsafe { policy.resize(share, victims, &mut probe) };
            self.take_out(victims, None, &at, &pinned, &mut evicted);
        });
        for (old, cause) in evicted {
            self.notify(old, cause);
        }
    }
}

/// A write the table holds and the policy has not heard of yet: `new`, in place of `old` if
/// it replaced one. The report must come before the thread unpins, whatever happens in
/// between (see `tinylfu.rs`, "Succession"): if user code run before it (a custom clock, a
/// listener's panic payload whose drop panics) unwinds, dropping this reports the write
/// without admission (`EvictionPolicy::settle`), so that no record is left on a node out of
/// the table and the write is tracked.
#[must_use = "a write must be reported to the policy"]
pub(crate) struct Unreported<'a, K, V> {
    policy: &'a Policy,
    old: Option<&'a EntryNode<K, V>>,
    new: &'a EntryNode<K, V>,
    pkey: u64,
    weight: u64,
    armed: bool,
}

impl<'a, K, V> Unreported<'a, K, V> {
    /// `new`, just published by the caller in place of `old`, if any, for the key with
    /// policy key `pkey`, weighing `weight`.
    pub(super) fn new(
        policy: &'a Policy,
        old: Option<&'a EntryNode<K, V>>,
        new: &'a EntryNode<K, V>,
        (pkey, weight): (u64, u64),
    ) -> Self {
        Unreported {
            policy,
            old: old.and_then(|old| successor(policy, old, new)),
            new,
            pkey,
            weight,
            armed: true,
        }
    }

    /// The write's node and its report, to be made by the caller with nothing that can
    /// unwind in between.
    fn disarmed(mut self) -> (&'a EntryNode<K, V>, Write) {
        self.armed = false;
        (self.new, self.report())
    }

    /// The report of the write to the policy (what it replaced is of its shard).
    fn report(&self) -> Write {
        Write {
            pkey: self.pkey,
            node: tracked(self.new),
            old: self.old.map(tracked),
            weight: self.weight,
        }
    }
}

impl<K, V> Drop for Unreported<'_, K, V> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        // Settled without admission: the shard may exceed its bound by this write's weight
        // until its next write evicts.
        let report = self.report();
        self.policy.with(self.new.value.policy.shard(), |p| {
            // SAFETY: as in `admit`: published and taken out by this thread, still pinned;
            // `old` is of `new`'s shard (`successor`).
            unsafe { p.settle(report) }
        });
    }
}

/// `old`, the node `new` replaced in the table, if its record may pass to `new`. Records pass
/// only within a shard, and the keys of both nodes are equal, so share a shard, unless their
/// `Hash` disagrees with their `Eq` (or with itself): then `old` is reported removed in its
/// own shard, now, and `new` is reported as a new key.
fn successor<'a, K, V>(
    policy: &Policy,
    old: &'a EntryNode<K, V>,
    new: &EntryNode<K, V>,
) -> Option<&'a EntryNode<K, V>> {
    if old.value.policy.shard() == new.value.policy.shard() {
        return Some(old);
    }
    forget(policy, old);
    None
}

/// Tells `policy` that the table no longer holds `node`, as `Engine::forget_in_policy`.
fn forget<K, V>(policy: &Policy, node: &EntryNode<K, V>) {
    policy.with(node.value.policy.shard(), |p| {
        // SAFETY: the caller took the node out of the table under its pin, which it still
        // holds, and reports it once; we hold the shard's lock.
        unsafe { p.remove(tracked(node)) }
    });
}

/// Where a node's policy link lies in it.
const fn link_offset<K, V>() -> usize {
    std::mem::offset_of!(EntryNode<K, V>, value)
        + std::mem::offset_of!(Entry<V>, policy)
        + std::mem::offset_of!(EntryState, link)
}

/// How far a node's table hash lies before its policy link, for a policy that reads keys
/// from the nodes (`KeySource::Derived`).
pub(super) const fn hash_before_link<K, V>() -> usize {
    link_offset::<K, V>() - std::mem::offset_of!(EntryNode<K, V>, hash)
}

/// The policy's handle on `node`: its link, addressed from the whole node so that `node_of`
/// may step back to it.
#[inline]
pub(super) fn tracked<K, V>(node: &EntryNode<K, V>) -> Tracked {
    // SAFETY: the link is a field of the node, at this offset.
    unsafe { NonNull::from(node).byte_add(link_offset::<K, V>()).cast() }
}

/// The node whose policy link `link` is.
///
/// # Safety
/// `link` came from [`tracked`] of a node of this type that is live for `'g`.
#[inline]
pub(super) unsafe fn node_of<'g, K, V>(link: Tracked) -> &'g EntryNode<K, V> {
    // SAFETY: `tracked` stepped forward by the same offset from the node (the caller's
    // contract), whose provenance the pointer keeps; live for `'g`.
    unsafe {
        link.byte_sub(link_offset::<K, V>())
            .cast::<EntryNode<K, V>>()
            .as_ref()
    }
}
