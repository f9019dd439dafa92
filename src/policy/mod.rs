//! Eviction policy, behind a small internal trait so that it stays one module.
//!
//! A policy sees hits (through the per-entry state it owns) and chooses victims when the
//! cache is over capacity. Its hit hook must keep hits free of shared writes in the steady
//! state: test before set, never an unconditional store, never a shared counter.

mod frequency_clock;

pub(crate) use frequency_clock::{EntryState, FrequencyClock};

use crossbeam_epoch::Guard;

use crate::entry::Entry;
use crate::table::{Node, Table};

/// How the cache sees an entry when the policy considers evicting it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Candidate {
    /// Never evict (a load in progress: its leader will publish or remove it).
    Skip,
    /// Expired: evict at once, whatever its frequency.
    Expired,
    /// Evictable by the policy's own rule.
    Live,
}

/// The interface between the cache and its eviction policy.
pub(crate) trait EvictionPolicy: Send + Sync {
    /// Records a hit on an entry.
    fn on_hit(&self, state: &EntryState);

    /// Chooses an entry to evict, preferring expired ones (`classify` says which entries are
    /// expired or not to be touched). `None` when there is nothing to evict. The cache removes
    /// the victim, and asks again if that raced.
    fn victim<'g, K, V>(
        &self,
        table: &Table<K, Entry<V>>,
        classify: &dyn Fn(&Entry<V>) -> Candidate,
        guard: &'g Guard,
    ) -> Option<&'g Node<K, Entry<V>>>;
}
